//! GOP/s of the GPU backend on the gemm-int8 bench shapes (SmolLM2, Qwen2.5-0.5B's MLP and the
//! 1.39 B Qwen2-shaped model of `scripts/make_gpu_models.py`): the kernel alone (`gpu_kernel`: many
//! dispatches in one submission, no upload or read-back), the integer GEMM with weights resident
//! (`gpu_i32`: A upload, kernel, read-back) and the full contract through `daisy_gemm_int8::gemm`
//! (`gpu_gemm`: quantize, kernel, audit, dequantize; every product on the GPU). One operation is a
//! multiply or an add, so a T x K x N GEMM is 2·T·K·N operations and criterion's elem/s reads as OP/s.
//!
//! The adapter comes from `WGPU_BACKEND` / `WGPU_ADAPTER_NAME`; without one the bench says so and
//! does nothing, except under `CI=true`, where it fails.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use daisy_gemm_int8::{PackedWeights, gemm, quantize_rows, seeded_matrix};
use daisy_wgsl::{Error, GEMV_MAX_T, GpuBackend, GpuWeights, Tuning};

/// T values: decode, a prefill chunk of the cached path (at most 16 rows), a long prompt.
const TS: [usize; 4] = [1, 16, 64, 512];

/// (name, K, N): SmolLM2-135M (hidden 576, kv 192, mlp 1536, vocab 49152), Qwen2.5-0.5B's MLP, and
/// the 1.39 B model's fused products (hidden 1536, q/k/v 1536+256+256, gate/up 2 x 8960, vocab
/// 49152).
const KN: [(&str, usize, usize); 11] = [
    ("smollm2_qo", 576, 576),
    ("smollm2_kv", 576, 192),
    ("smollm2_up", 576, 1536),
    ("smollm2_down", 1536, 576),
    ("smollm2_lm_head", 576, 49152),
    ("qwen2_5_up", 896, 4864),
    ("q1b4_qkv", 1536, 2048),
    ("q1b4_o", 1536, 1536),
    ("q1b4_gate_up", 1536, 17920),
    ("q1b4_down", 8960, 1536),
    ("q1b4_lm_head", 1536, 49152),
];

/// The products whose split of K `gpu_kernel_split_*` varies, and the (workgroups below which K
/// is split, fewest stages a slice) pairs it tries.
const SPLIT_SHAPES: [&str; 3] = ["q1b4_o", "q1b4_qkv", "q1b4_down"];
const SPLIT_VARIANTS: [(usize, usize); 6] =
    [(0, 4), (128, 4), (256, 4), (256, 6), (256, 8), (512, 4)];

/// Dispatches per timed submission of `gpu_kernel`: enough that one submission's overhead is
/// small against the kernels.
const KERNEL_REPS: usize = 20;

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

/// One product timed by the kernel alone ([`GpuBackend::kernel_seconds`]).
#[derive(Clone, Copy)]
struct Kernel<'a> {
    a: &'a [i8],
    t: usize,
    w: &'a GpuWeights,
    ops: u64,
    id: &'a BenchmarkId,
}

impl Kernel<'_> {
    fn bench(self, c: &mut Criterion, gpu: &GpuBackend, group_name: String) {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(self.ops));
        group.sample_size(10);
        group.bench_function(self.id.clone(), |bench| {
            bench.iter_custom(|iters| {
                let reps = (iters.max(1) as usize).min(KERNEL_REPS);
                let per = gpu
                    .kernel_seconds(self.a, self.t, self.w, reps)
                    .expect("gpu kernel");
                std::time::Duration::from_secs_f64(per * iters as f64)
            });
        });
        group.finish();
    }
}

fn bench(c: &mut Criterion) {
    let Some(mut gpu) = open() else { return };
    gpu.set_cpu_below(0);
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

            let kernel = Kernel {
                a: qa.q(),
                t,
                w: &resident,
                ops,
                id: &id,
            };
            kernel.bench(c, &gpu, "gpu_kernel".into());

            if t == 16 {
                // The same rows through `tiled` instead of `gemv`: the choice of entry point.
                gpu.set_gemv_rows(0);
                kernel.bench(c, &gpu, "gpu_kernel_tiled".into());
                gpu.set_gemv_rows(GEMV_MAX_T);
            }

            if t == 512 && SPLIT_SHAPES.contains(&name) {
                // Other ways of splitting K where the output has few tiles (tuning only).
                for (below, min_slice) in SPLIT_VARIANTS {
                    gpu.set_tuning(Tuning {
                        split_below: below,
                        min_slice,
                        ..Tuning::default()
                    });
                    kernel.bench(c, &gpu, format!("gpu_kernel_split_{below}_{min_slice}"));
                }
                gpu.set_tuning(Tuning::default());
            }

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
