//! The conformance binary: one integration test target, data-driven over the fixture models.
//!
//! - `tokenizer`: `daisy-tokenizer` against Hugging Face `tokenizers`.
//! - `f32_goldens`: the f32 reference against the `transformers` goldens of every tiny model.
//! - `splits`: any split gives the same ids and bit-identical hidden states at every hop.
//! - `lookahead`: drafts scored with the next token are split-invariant on both paths, greedy and
//!   seeded, with their mutation case.
//! - `embedding`: the embedding mapped from a local checkpoint gives the bits of one read whole.
//! - `shard`: a stage streaming its layers from the flat shard gives the resident stage's bits.
//! - `int8x2`: the two-plane precision against its own PyTorch reference and against f32, and
//!   split-invariant.
//! - `mutations`: a stage that drops a layer, stages out of order and a stage from another model
//!   must each fail.

mod common;
mod embedding;
mod f32_goldens;
mod int8;
mod int8x2;
mod lookahead;
mod mutations;
mod shard;
mod splits;
mod tokenizer;
