//! Llama-family and GPT-2 stages: a slice of a model's layers, with the embedding and lm_head on the head.
//!
//! The math follows Hugging Face `transformers` (`modeling_llama.py`, `modeling_qwen2.py`,
//! `modeling_mistral.py`, `modeling_gpt2.py`); where it differs (fused products, attention as GEMMs
//! over every key present) the module says why. Every matrix product goes through [`Precision`]:
//! the f32 reference or the verified int8 GEMM. Everything else is f32 in one fixed order with
//! transcendentals computed in f64 and rounded once (DESIGN.md §3.8; see `ops`). `model` knows nothing about the network: the rest of the
//! ring is a callback ([`Pass`]).

mod attention;
mod block;
mod checkpoint;
mod device;
mod error;
mod exp;
mod gemm;
mod generate;
mod json;
mod ops;
mod sample;
mod shard;
mod source;
mod stage;

pub use block::StageCache;
pub use device::{DeviceHead, DeviceKv, DeviceLayers, LayerShape, LlamaLayer};
pub use error::{Error, Result};
pub use exp::exp;
pub use gemm::Precision;
pub use generate::{
    ForwardPath, GenerateOptions, Generation, Pass, Resume, Scored, alone, drafts, generate,
    generate_streaming, rebuild, score,
};
pub use json::{JSON_TOP_K, JsonMask, JsonPrefix};
pub use ops::{apply_rope, rms_norm, rope_cos_sin, rope_inv_freq, silu_mul, softmax_visible_rows};
pub use sample::{Sampling, argmax, draw, pick, prefill_chunks, top2_margin};
pub use shard::MAX_LIVE_LAYERS;
pub use source::{RawTensor, Source};
pub use stage::Stage;
