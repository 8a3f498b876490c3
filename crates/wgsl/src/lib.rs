//! The verified INT8 GEMM on WebGPU through `wgpu`, gated bit for bit against `daisy-gemm-int8`.
