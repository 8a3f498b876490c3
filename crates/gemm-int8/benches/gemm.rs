//! Criterion benches of the verified INT8 GEMM: the named shape table (SmolLM2 and Qwen2.5-0.5B), the
//! int8 peak of this machine (the dot instruction in registers), the decode sweep over all 30 SmolLM2
//! layers (bigger than the last-level cache), and plain memory read bandwidth to compare it with.
//!
//! Every figure is a throughput: `Elements` counts operations (2 per multiply-add), so criterion's
//! "elem/s" reads as OP/s; `BytesDecimal` counts weight bytes, so "B/s" reads as GB/s of weights.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use daisy_gemm_int8::{CpuBackend, PackedWeights, WeightArena, gemm, seeded_matrix};
use rayon::prelude::*;

/// `(name, K, N)`: SmolLM2-135M (hidden 576, kv 192, mlp 1536, vocab 49152) and Qwen2.5-0.5B's MLP.
const SHAPES: [(&str, usize, usize); 6] = [
    ("smollm2-q-o", 576, 576),
    ("smollm2-k-v", 576, 192),
    ("smollm2-gate-up", 576, 1536),
    ("smollm2-down", 1536, 576),
    ("smollm2-lm-head", 576, 49152),
    ("qwen2.5-gate-up", 896, 4864),
];

const TS: [usize; 4] = [1, 16, 64, 512];

fn shapes(c: &mut Criterion) {
    let be = CpuBackend::new();
    let mut group = c.benchmark_group("gemm");
    group.sample_size(10);
    for (name, k, n) in SHAPES {
        let b = PackedWeights::new(&seeded_matrix(k as u64 ^ n as u64, n, k), n, k)
            .expect("finite weights");
        for t in TS {
            let a = seeded_matrix(t as u64, t, k);
            group.throughput(Throughput::Elements(2 * (t * n * k) as u64));
            group.bench_function(format!("{name}/t{t}-k{k}-n{n}"), |bench| {
                bench.iter(|| gemm(&be, black_box(&a), t, &b).expect("gemm"))
            });
        }
    }
    group.finish();
}

/// SmolLM2-135M's seven projections of one layer, `(K, N)`: q, k, v, o, gate, up, down.
const LAYER: [(usize, usize); 7] = [
    (576, 576),
    (576, 192),
    (576, 192),
    (576, 576),
    (576, 1536),
    (576, 1536),
    (1536, 576),
];
const LAYERS: usize = 30;

fn decode(c: &mut Criterion) {
    let be = CpuBackend::new();
    // In an arena, as a loaded stage holds them.
    let mut arena = WeightArena::new();
    let weights: Vec<PackedWeights> = (0..LAYERS * LAYER.len())
        .map(|i| {
            let (k, n) = LAYER[i % LAYER.len()];
            let mut w =
                PackedWeights::new(&seeded_matrix(i as u64, n, k), n, k).expect("finite weights");
            if let Some(arena) = arena.as_mut() {
                arena.take(&mut w).expect("moved");
            }
            w
        })
        .collect();
    let bytes: usize = weights.iter().map(|w| w.n() * w.k()).sum();
    let x576 = seeded_matrix(1, 1, 576);
    let x1536 = seeded_matrix(2, 1, 1536);
    let mut group = c.benchmark_group("gemm-decode");
    group.sample_size(20);
    group.throughput(Throughput::BytesDecimal(bytes as u64));
    group.bench_function(
        format!("smollm2-30-layers-t1/{}-mb", bytes / 1_000_000),
        |bench| {
            bench.iter(|| {
                for w in &weights {
                    let x = if w.k() == 576 { &x576 } else { &x1536 };
                    black_box(gemm(&be, black_box(x), 1, w).expect("gemm"));
                }
            })
        },
    );
    group.finish();
}

fn memory(c: &mut Criterion) {
    let words = 256 << 20 >> 3; // 256 MiB, far beyond the last-level cache
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut group = c.benchmark_group("memory");
    group.sample_size(20);
    group.throughput(Throughput::BytesDecimal((words * 8) as u64));
    let sum = |chunk: &[u64]| chunk.iter().fold(0u64, |s, &v| s ^ v);
    group.bench_function(
        format!("read/threads{}", rayon::current_num_threads()),
        |bench| {
            bench.iter(|| {
                black_box(&buf)
                    .par_chunks(1 << 17)
                    .map(sum)
                    .reduce(|| 0, |x, y| x ^ y)
            })
        },
    );
    if rayon::current_num_threads() > 1 {
        group.bench_function("read/threads1", |bench| bench.iter(|| sum(black_box(&buf))));
    }
    group.finish();
}

#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// Iterations of the register loop per call.
    pub(crate) const ITERS: u64 = 1 << 16;
    /// Independent accumulator chains (covers latency × issue width).
    const CHAINS: usize = 16;

    /// Operations per call of [`vnni`] (16 chains × 64 multiply-adds × 2).
    pub(crate) const VNNI_OPS: u64 = ITERS * CHAINS as u64 * 64 * 2;
    /// Operations per call of [`avx2`] (16 chains × 32 multiply-adds × 2).
    pub(crate) const AVX2_OPS: u64 = ITERS * CHAINS as u64 * 32 * 2;

    /// `vpdpbusd` on registers only.
    ///
    /// # Safety
    /// The CPU must support avx512f and avx512vnni.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(crate) unsafe fn vnni(seed: i32) -> i32 {
        let a = _mm512_set1_epi32(seed);
        let b = _mm512_set1_epi32(seed.rotate_left(7));
        let mut acc = [_mm512_set1_epi32(seed ^ 3); CHAINS];
        for _ in 0..ITERS {
            for c in &mut acc {
                *c = _mm512_dpbusd_epi32(*c, a, b);
            }
        }
        acc.iter().fold(0, |s, &c| s ^ _mm512_reduce_add_epi32(c))
    }

    /// The AVX2 kernel's instruction mix (`vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`) on registers.
    ///
    /// # Safety
    /// The CPU must support avx2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn avx2(seed: i32) -> i32 {
        let a = _mm256_set1_epi32(seed);
        let ones = _mm256_set1_epi16(1);
        let mag = _mm256_abs_epi8(a);
        let mut acc = [_mm256_set1_epi32(seed ^ 3); CHAINS];
        for _ in 0..ITERS {
            for c in &mut acc {
                // The accumulator doubles as the B operand so nothing is loop-invariant.
                let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(*c, a));
                *c = _mm256_add_epi32(*c, _mm256_madd_epi16(pairs, ones));
            }
        }
        let mut lanes = [0i32; 8];
        acc.iter().fold(0, |s, &c| {
            // SAFETY: `lanes` holds 32 bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), c) };
            s ^ lanes.iter().fold(0, |x, &y| x ^ y)
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn peak(c: &mut Criterion) {
    let threads = rayon::current_num_threads() as u64;
    let mut group = c.benchmark_group("gemm-peak");
    group.sample_size(20);
    if std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the features were detected just above.
        let run = |s: i32| unsafe { peak::vnni(s) };
        group.throughput(Throughput::Elements(peak::VNNI_OPS));
        group.bench_function("avx512vnni/threads1", |b| b.iter(|| run(black_box(5))));
        if threads > 1 {
            group.throughput(Throughput::Elements(peak::VNNI_OPS * threads));
            group.bench_function(format!("avx512vnni/threads{threads}"), |b| {
                b.iter(|| {
                    (0..threads as i32)
                        .into_par_iter()
                        .map(|s| run(black_box(s)))
                        .reduce(|| 0, |x, y| x ^ y)
                })
            });
        }
    }
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected just above.
        let run = |s: i32| unsafe { peak::avx2(s) };
        group.throughput(Throughput::Elements(peak::AVX2_OPS * threads));
        group.bench_function(format!("avx2/threads{threads}"), |b| {
            b.iter(|| {
                (0..threads as i32)
                    .into_par_iter()
                    .map(|s| run(black_box(s)))
                    .reduce(|| 0, |x, y| x ^ y)
            })
        });
    }
    group.finish();
}

#[cfg(not(target_arch = "x86_64"))]
fn peak(_: &mut Criterion) {}

fn config() -> Criterion {
    // Short by default: other engineers share the cores. `--warm-up-time`/`--measurement-time` override.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = peak, memory, decode, shapes }
criterion_main!(benches);
