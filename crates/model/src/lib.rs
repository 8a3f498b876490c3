//! Llama-family and GPT-2 stages: a slice of a model's layers, with the embedding and lm_head on the head.
//!
//! The math follows Hugging Face `transformers` (`modeling_llama.py`, `modeling_qwen2.py`,
//! `modeling_mistral.py`, `modeling_gpt2.py`); where it differs (fused products, attention as GEMMs
//! over every key present) the module says why. Every matrix product goes through [`Precision`]:
//! the f32 reference or the verified int8 GEMM. Everything else is f32 in one fixed order with
//! transcendentals computed in f64 and rounded once (DESIGN.md §3.8; see `ops`). `model` knows nothing about the network: the rest of the
//! ring is a callback ([`Pass`]).

/// Call `$body($args)`, a function marked `#[inline(always)]` whose loops the compiler vectorizes,
/// in a copy compiled for AVX-512F or AVX2 where the CPU has it (checked at run time), else as
/// built. Element-wise f32 and f64 work gives the same bits in every copy (no operation is fused
/// or reordered, only run on wider registers). Use it as a function's whole body.
macro_rules! widest_simd {
    ($body:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            fn avx512($($arg: $ty),*) $(-> $ret)? {
                $body($($arg),*)
            }
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                $body($($arg),*)
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F (checked just above).
                return unsafe { avx512($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { avx2($($arg),*) };
            }
        }
        $body($($arg),*)
    }};
}

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
