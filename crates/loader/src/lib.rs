//! Checkpoint loading: safetensors and GGUF headers and byte ranges, exact widening to f32, typed
//! configs, the architecture allow-list, and the sources bytes come from.
//!
//! Open a model with [`Checkpoint::open`]; it validates the config, every tensor header and the
//! tensor set against the config before returning, so nothing above computes on a bad checkpoint.

mod checkpoint;
mod config;
mod dtype;
mod error;
mod expected;
pub mod gguf;
mod gguf_model;
mod gguf_tokenizer;
#[cfg(feature = "hub")]
pub mod hub;
pub mod safetensors;
mod source;

pub use checkpoint::{Checkpoint, Format, TensorInfo};
pub use config::{Arch, HiddenAct, ModelConfig};
pub use daisy_wire::{ModelRef, RepoId, Revision};
pub use dtype::{
    DType, all_finite, bf16_from_f32, check_finite, widen, widen_bf16, widen_f16, widen_into,
};
pub use error::Error;
pub use expected::{expected_tensors, layer_prefix, layer_tensors};
pub use gguf::GgmlType;
pub use gguf_tokenizer::QWEN2_SPLIT_REGEX;
pub use source::{
    ByteSource, CachedSnapshot, DEFAULT_REVISION, FileSource, LocalDir, MappedBytes, MemSource,
    Repo, cache_folder, find_in_cache, hf_cache_dir, parse_model_ref, revision_of,
};
