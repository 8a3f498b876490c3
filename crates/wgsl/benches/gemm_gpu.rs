//! GOP/s of the GPU backend on the gemm-int8 bench shapes (SmolLM2 and Qwen2.5-0.5B): the integer
//! GEMM with weights resident (`gpu_i32`: A upload, kernel, read-back) and the full contract through
//! `daisy_gemm_int8::gemm` (`gpu_gemm`: quantize, kernel, audit, dequantize). One operation is a
//! multiply or an add, so a T x K x N GEMM is 2·T·K·N operations and criterion's elem/s reads as OP/s.
//!
//! The adapter comes from `WGPU_BACKEND` / `WGPU_ADAPTER_NAME`; without one the bench says so and
//! does nothing, except under `CI=true`, where it fails.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use daisy_gemm_int8::{PackedWeights, gemm, quantize_rows, seeded_matrix};
use daisy_wgsl::{Error, GpuBackend};

/// T values: decode, a small chunk, the prefill chunk, a long prompt.
const TS: [usize; 4] = [1, 16, 64, 512];

/// (name, K, N): SmolLM2-135M (hidden 576, kv 192, mlp 1536, vocab 49152) and Qwen2.5-0.5B's MLP.
const KN: [(&str, usize, usize); 6] = [
    ("smollm2_qo", 576, 576),
    ("smollm2_kv", 576, 192),
    ("smollm2_up", 576, 1536),
    ("smollm2_down", 1536, 576),
    ("smollm2_lm_head", 576, 49152),
    ("qwen2_5_up", 896, 4864),
];

fn open() -> Option<GpuBackend> {
    match GpuBackend::new() {
        Ok(gpu) => {
            eprintln!(
                "adapter: {} (kernel {})",
                gpu.adapter_name(),
                gpu.kernel_name()
            );
            Some(gpu)
        }
        Err(e @ Error::NoAdapter { .. }) if std::env::var("CI").map_or(true, |v| v != "true") => {
            eprintln!("skipping the GPU bench: {e}");
            None
        }
        Err(e) => {
            eprintln!("error: the GPU backend did not come up: {e}");
            std::process::exit(1);
        }
    }
}

fn bench(c: &mut Criterion) {
    let Some(gpu) = open() else { return };
    for (name, k, n) in KN {
        let w =
            PackedWeights::new(&seeded_matrix(0xB, n, k), n, k).expect("seeded weights are finite");
        let resident = {
            let q = w.to_quantized();
            gpu.upload(q.q(), n, k).expect("weights fit the device")
        };
        for t in TS {
            let a = seeded_matrix(0xA, t, k);
            let qa = quantize_rows(&a, t, k).expect("seeded rows are finite");
            let ops = 2 * (t * k * n) as u64;
            let id = BenchmarkId::new(name, format!("t{t}_k{k}_n{n}"));

            let mut group = c.benchmark_group("gpu_i32");
            group.throughput(Throughput::Elements(ops));
            group.sample_size(10);
            group.bench_with_input(id.clone(), &t, |bench, &t| {
                bench.iter(|| {
                    gpu.gemm_i8_resident(qa.q(), t, &resident)
                        .expect("gpu gemm")
                });
            });
            group.finish();

            let mut group = c.benchmark_group("gpu_gemm");
            group.throughput(Throughput::Elements(ops));
            group.sample_size(10);
            group.bench_with_input(id, &t, |bench, &t| {
                bench.iter(|| gemm(&gpu, &a, t, &w).expect("gpu gemm"));
            });
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
