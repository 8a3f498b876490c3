//! The loader's integration tests: exact widening, the refusal corpus, the tiny models, the Hugging
//! Face cache layout, and the SmolLM2 GGUF against the independent `gguf` golden.

mod cache;
mod corpus;
mod gguf_tokenizer;
mod map;
mod permute;
mod smollm2;
mod tiny;
mod widen;

use std::path::PathBuf;

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}
