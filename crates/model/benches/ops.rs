//! Criterion benches of the element-wise work between the products that runs tens of millions of
//! exponentials a prefill: the causal softmax of one head's 512 × 512 scores and the SiLU gate of
//! 512 rows of SmolLM2's MLP (1536 wide). `Elements` counts exponentials, so "elem/s" reads as
//! exponentials per second.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use daisy_model::{silu_mul, softmax_visible_rows};

/// Rows of a prefill (the bench's 512-token prompt).
const T: usize = 512;
/// SmolLM2-135M's intermediate size.
const INTER: usize = 1536;

/// Deterministic values spread like scores or gate activations (about −8 to 8).
fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 16.0 - 8.0
        })
        .collect()
}

fn ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("ops");
    group.sample_size(20);

    let scores = values(T * T, 1);
    let visible: Vec<_> = (0..T).map(|i| 0..i + 1).collect();
    group.throughput(Throughput::Elements((T * (T + 1) / 2) as u64));
    group.bench_function(format!("softmax-causal/t{T}"), |bench| {
        let mut rows = scores.clone();
        bench.iter(|| {
            rows.copy_from_slice(&scores);
            softmax_visible_rows(black_box(&mut rows), T, &visible);
        })
    });

    let (g, u) = (values(T * INTER, 2), values(T * INTER, 3));
    group.throughput(Throughput::Elements((T * INTER) as u64));
    group.bench_function(format!("silu-mul/t{T}-n{INTER}"), |bench| {
        let mut out = Vec::with_capacity(T * INTER);
        bench.iter(|| {
            out.clear();
            silu_mul(black_box(&g), black_box(&u), &mut out);
        })
    });
    group.finish();
}

criterion_group!(benches, ops);
criterion_main!(benches);
