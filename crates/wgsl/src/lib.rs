//! The verified INT8 GEMM on WebGPU through `wgpu`, gated bit for bit against `daisy-gemm-int8`.
//!
//! As a GEMM backend the GPU computes the integer part of DESIGN §3: `acc = Σ qa · qb` in i32, int8 packed four
//! to a u32 (rows padded to 64 bytes), `dot4I8Packed` where the instance implements WGSL's `packed_4x8_integer_dot_product`
//! extension and shift-and-sign-extend otherwise. As a `Backend` it returns accumulators and the
//! shared code in `daisy-gemm-int8` dequantizes them on the CPU. `GpuLayers` goes further where the
//! device has 64-bit floats in shaders: a stage's Llama-family layers run whole on the device, the
//! work between the products done by row kernels that give the CPU's bits (`floats.wgsl`: the
//! contract's f64 steps in a form that survives drivers that fuse, reassociate and flush;
//! `layer.wgsl`), every product still audited on the CPU (docs/gpu.md). A backend is only handed
//! out after its gates pass.
//!
//! The adapter comes from the environment: `WGPU_BACKEND` (e.g. `vulkan`), `WGPU_ADAPTER_NAME`
//! (a case-insensitive substring of the adapter name) and `WGPU_POWER_PREF`. `DAISY_GPU_CPU_BELOW`
//! sets the size (multiply-adds) below which a product runs on the CPU kernels instead of making a
//! round trip to the device ([`CPU_BELOW_MACS`] by default; 0: every product on the GPU).
//! `DAISY_GPU_WARM_UP_MS` sets how long [`warm_up`] keeps a card busy when a stage loads, so that
//! the first prompt does not find it at its idle clock ([`WARM_UP`] by default; 0: not at all).

mod backend;
mod device;
mod error;
mod floats;
mod gates;
mod kernel;
mod layers;
mod profile;
mod residency;
mod select;

pub use backend::{CPU_BELOW_MACS, GpuBackend, GpuWeights, MAX_K, WARM_UP, warm_up};
pub use device::{AdapterSummary, adapters};
pub use error::{Error, FloatMismatch, Result};
pub use floats::{FLOATS_WGSL, FloatLab, f64_words, quantization_lanes};
pub use kernel::{DOT4_PACKED_WGSL, DOT4_SHIFT_WGSL, GEMM_WGSL, GEMV_MAX_T, Kernel, Tuning};
pub use layers::{GpuKv, GpuLayers};
pub use profile::GpuProfile;
pub use residency::{LayerResidency, MAX_LIVE_LAYERS, MatrixShape};
pub use select::{BackendChoice, Selected, select, select_auto};
