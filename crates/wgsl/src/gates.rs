//! The exactness gates of DESIGN §3.7 on the integer part: fixed shapes (K not a multiple of the
//! kernel's tile, T = 1 and every T up to `gemv`'s limit and past it, all-zero rows, ±127 at K = 131071, partial tiles in T and N) whose i32
//! accumulators must equal the scalar reference bit for bit, or the backend is not used.

use crate::backend::{GpuBackend, MAX_K};
use crate::error::{Error, Result};

/// `daisy_gemm_int8::splitmix` as a stream for gate data.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        daisy_gemm_int8::splitmix(&mut self.0)
    }

    /// A value in -127..=127, the range quantization produces.
    pub(crate) fn next_q(&mut self) -> i8 {
        ((self.next_u64() % 255) as i16 - 127) as i8
    }
}

/// The scalar reference of the integer part, from `daisy-gemm-int8`'s reference cell.
pub(crate) fn reference_i32(a: &[i8], t: usize, b: &[i8], n: usize, k: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(t * n);
    for row in a.chunks_exact(k.max(1)).take(t) {
        for col in b.chunks_exact(k.max(1)).take(n) {
            out.push(daisy_gemm_int8::reference_cell(row, col));
        }
    }
    out
}

/// One gate: a named shape and its operands.
struct Gate {
    name: String,
    t: usize,
    n: usize,
    k: usize,
    a: Vec<i8>,
    b: Vec<i8>,
}

fn random_gate(seed: u64, t: usize, n: usize, k: usize) -> Gate {
    let mut rng = SplitMix::new(seed);
    let a = (0..t * k).map(|_| rng.next_q()).collect();
    let b = (0..n * k).map(|_| rng.next_q()).collect();
    Gate {
        name: format!("random t={t} n={n} k={k}"),
        t,
        n,
        k,
        a,
        b,
    }
}

fn gates() -> Vec<Gate> {
    let mut gates: Vec<Gate> = [
        (1, 1, 1),
        (1, 7, 3),
        (2, 5, 63),
        (1, 65, 64),
        (17, 3, 65),
        (67, 66, 65),
        (3, 130, 576),
        (1, 193, 1536),
        (64, 64, 4864),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (t, n, k))| random_gate(0x6a7e_0000 + i as u64, t, n, k))
    .collect();

    // All-zero rows of A and of B among random ones.
    let mut g = random_gate(0x6a7e_0100, 5, 6, 97);
    for row in [0, 3] {
        g.a[row * 97..(row + 1) * 97].fill(0);
    }
    g.b[2 * 97..3 * 97].fill(0);
    g.name = "zero rows t=5 n=6 k=97".to_owned();
    gates.push(g);

    // ±127 at the largest K: every sign pattern of the extremes, no overflow; once with few rows
    // (the `gemv` entry point) and once with more (`tiled`).
    let k = MAX_K;
    let mut b = Vec::with_capacity(2 * k);
    b.extend(std::iter::repeat_n(127i8, k));
    b.extend(std::iter::repeat_n(-127i8, k));
    for t in [3, 2 * crate::kernel::GEMV_MAX_T + 1] {
        let mut a = Vec::with_capacity(t * k);
        for row in 0..t {
            a.extend((0..k).map(|i| match row % 3 {
                0 => 127i8,
                1 => -127,
                _ if i % 3 == 0 => -127,
                _ => 127,
            }));
        }
        gates.push(Gate {
            name: format!("extremes t={t} n=2 k={k}"),
            t,
            n: 2,
            k,
            a,
            b: b.clone(),
        });
    }
    gates
}

/// Runs every gate on `backend`; the first differing cell fails it.
pub(crate) fn run(backend: &GpuBackend) -> Result<()> {
    for gate in gates() {
        let got = backend.gemm_i8(&gate.a, gate.t, &gate.b, gate.n, gate.k)?;
        let expected = reference_i32(&gate.a, gate.t, &gate.b, gate.n, gate.k);
        if let Some(i) = (0..expected.len()).find(|&i| got.get(i) != Some(&expected[i])) {
            return Err(Error::GateFailed {
                adapter: backend.adapter_name(),
                gate: gate.name,
                t: i / gate.n,
                n: i % gate.n,
                got: got.get(i).copied().unwrap_or(0),
                expected: expected[i],
            });
        }
    }
    Ok(())
}
