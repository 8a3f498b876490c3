//! Integration tests of the verified INT8 GEMM: every kernel against the scalar reference on a shape
//! table, the reference against an independent f64 formula, refusals, and the mutation cases (a
//! leftover-loop off-by-one and a saturating kernel) that the gates and the audit must catch.

use std::sync::atomic::{AtomicBool, Ordering};

use daisy_gemm_int8::{
    Backend, CpuBackend, Error, Isa, MAX_K, Operand, PackedWeights, Quantized, Rhs, audit,
    check_shapes, dequantize, exact_gates, gemm, gemm_act, gemm_quantized, gemm_quantized_batch,
    gemm_quantized_into, measure_rate, output_buffer, probe, quantize_rows, quantize_rows_reusing,
    recycle, recycle_output, reference_i32,
};

/// The test's own generator (xorshift64*), independent of the crate's seeded stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `rows × k` values with per-row magnitudes spread over 10⁻⁶…10⁶; row 1 all zero and row 2
/// subnormal when there are at least 3 rows.
fn matrix(seed: u64, rows: usize, k: usize) -> Vec<f32> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut m = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let mag = 10f32.powi((r % 13) as i32 - 6);
        for _ in 0..k {
            m.push(rng.unit() * mag);
        }
    }
    if rows >= 3 {
        m[k..2 * k].fill(0.0);
        for (i, v) in m[2 * k..3 * k].iter_mut().enumerate() {
            *v = f32::from_bits((rng.next() as u32) & 0x007F_FFFF)
                * if i % 3 == 0 { -1.0 } else { 1.0 };
        }
    }
    m
}

fn backends() -> Vec<CpuBackend> {
    let isas = Isa::supported();
    if std::env::var_os("CI").is_none() {
        eprintln!("instruction sets under test: {isas:?}");
    }
    isas.into_iter()
        .map(|isa| CpuBackend::with_isa(isa).expect("supported"))
        .collect()
}

/// `be`'s products with `good` equal `want`, and those with `mutant` (one weight flipped) do not.
fn equal_and_mutant_differs(
    be: &CpuBackend,
    qa: &Quantized,
    (good, mutant): (&PackedWeights, &PackedWeights),
    want: &[i32],
    what: &str,
) {
    let mut got = vec![0; want.len()];
    be.gemm_i32(qa, Rhs::Weights(good), &mut got).unwrap();
    assert_eq!(
        first_diff(&got, want),
        None,
        "{} {what}: (cell, got, want)",
        be.name()
    );
    be.gemm_i32(qa, Rhs::Weights(mutant), &mut got).unwrap();
    assert!(
        first_diff(&got, want).is_some(),
        "{} {what}: the flipped weight went unseen",
        be.name()
    );
}

fn first_diff(got: &[i32], want: &[i32]) -> Option<(usize, i32, i32)> {
    got.iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .map(|i| (i, got[i], want[i]))
}

const KS: [usize; 9] = [1, 3, 63, 64, 65, 576, 1536, 4864, 131_071];
const TS: [usize; 5] = [1, 2, 17, 64, 67];

#[test]
fn every_kernel_equals_the_reference_on_the_shape_table() {
    let backends = backends();
    let mut cases = 0;
    for &k in &KS {
        let ns: [usize; 2] = if k > 10_000 { [3, 4] } else { [37, 34] };
        for &t in &TS {
            for n in ns {
                let seed = (k * 1000 + t * 10 + n) as u64;
                let a = matrix(seed, t, k);
                let w = matrix(seed ^ 0xFFFF, n, k);
                let qa = quantize_rows(&a, t, k).unwrap();
                let packed = PackedWeights::new(&w, n, k).unwrap();
                let qb = packed.to_quantized();
                let mut want = vec![0; t * n];
                reference_i32(&qa, Rhs::Activation(&qb), &mut want).unwrap();
                let want_c = dequantize(&want, qa.scales(), qb.scales()).unwrap();
                for be in &backends {
                    for rhs in [Rhs::Weights(&packed), Rhs::Activation(&qb)] {
                        let mut got = vec![0; t * n];
                        be.gemm_i32(&qa, rhs, &mut got).unwrap();
                        assert_eq!(
                            first_diff(&got, &want),
                            None,
                            "{} t={t} k={k} n={n} {rhs:?}: (cell, got, want)",
                            be.name()
                        );
                    }
                    let c = gemm(be, &a, t, &packed).unwrap();
                    let c_act = gemm_act(be, &a, t, &w, n, k).unwrap();
                    for (x, y) in [(&c, &want_c), (&c_act, &want_c)] {
                        assert!(
                            x.iter()
                                .map(|v| v.to_bits())
                                .eq(y.iter().map(|v| v.to_bits())),
                            "{} t={t} k={k} n={n}",
                            be.name()
                        );
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, KS.len() * TS.len() * 2 * backends.len());
}

/// The ways the CPU backend cuts a GEMM over its threads (by panel blocks for decode, by rows and
/// blocks for prefill, a last block of fewer panels, leftover rows and K) against the reference,
/// with a mutation case: weights with their very last element's sign flipped must give another
/// result on every path.
#[test]
fn every_work_split_equals_the_reference() {
    let shapes = [
        (1, 576, 576),
        (1, 1535, 1000),
        (3, 64, 4100),
        (5, 577, 200),
        (16, 576, 1540),
        (33, 131, 300),
        (64, 576, 192),
        (67, 579, 900),
        (512, 68, 190),
    ];
    for (t, k, n) in shapes {
        let seed = (t * 7 + k * 13 + n) as u64;
        let qa = quantize_rows(&matrix(seed, t, k), t, k).unwrap();
        let w = matrix(seed ^ 0xABCD, n, k);
        let packed = PackedWeights::new(&w, n, k).unwrap();
        let mut want = vec![0; t * n];
        reference_i32(&qa, Rhs::Weights(&packed), &mut want).unwrap();
        for (flip, what) in [(n * k - 1, "last"), (n / 2 * k + k / 3, "middle")] {
            let mut flipped = w.clone();
            flipped[flip] = -flipped[flip];
            let mutant = PackedWeights::new(&flipped, n, k).unwrap();
            for be in backends() {
                equal_and_mutant_differs(
                    &be,
                    &qa,
                    (&packed, &mutant),
                    &want,
                    &format!("t={t} k={k} n={n}, {what} weight flipped"),
                );
            }
        }
    }
}

/// ±1.0 quantizes to ±127; every row and column pattern at K = 131071 reaches |acc| = 127² · 131071.
#[test]
fn extremes_at_the_largest_k_do_not_overflow() {
    let k = MAX_K;
    let pattern = |r: usize, c: usize| -> f32 {
        let alt = if c.is_multiple_of(2) { 1.0 } else { -1.0 };
        [1.0, -1.0, alt, -alt][r % 4]
    };
    for &t in &TS {
        let n = 5;
        let a: Vec<f32> = (0..t * k).map(|i| pattern(i / k, i % k)).collect();
        let w: Vec<f32> = (0..n * k).map(|i| pattern(i / k + 1, i % k)).collect();
        let qa = quantize_rows(&a, t, k).unwrap();
        assert!(qa.q().iter().all(|v| v.abs() == 127));
        let packed = PackedWeights::new(&w, n, k).unwrap();
        // Independent: the exact sum in i64.
        let want: Vec<i32> = (0..t * n)
            .map(|cell| {
                let (r, c) = (cell / n, cell % n);
                let s: i64 = (0..k)
                    .map(|j| (127.0 * pattern(r, j)) as i64 * (127.0 * pattern(c + 1, j)) as i64)
                    .sum();
                i32::try_from(s).expect("fits i32 by the contract")
            })
            .collect();
        assert!(want.iter().any(|&v| v == 127 * 127 * MAX_K as i32));
        assert!(want.iter().any(|&v| v == -127 * 127 * MAX_K as i32));
        let mut reference = vec![0; t * n];
        reference_i32(&qa, Rhs::Weights(&packed), &mut reference).unwrap();
        assert_eq!(reference, want, "reference t={t}");
        for be in backends() {
            let mut got = vec![0; t * n];
            be.gemm_i32(&qa, Rhs::Weights(&packed), &mut got).unwrap();
            assert_eq!(first_diff(&got, &want), None, "{} t={t}", be.name());
        }
    }
}

/// The AVX2 backend multiplies 16 rows and more by Winograd's pairs, `(a₀ + b₁)(a₁ + b₀)` less a
/// row term and a column term: against the exact sum in i64, on operands that use the whole range
/// (±127 pairs meeting ±127 pairs: sums of ±254 in i16), at the row counts around its thresholds and
/// register tile, K that leaves 1–3 values to the leftover loop or spans two K blocks, and N that
/// cuts a panel; its mutation, one B value changed, must change a cell on every shape.
#[test]
fn paired_products_equal_the_exact_sums_at_their_edges() {
    let Ok(be) = CpuBackend::with_isa(Isa::Avx2) else {
        assert!(
            std::env::var_os("CI").is_none() || cfg!(not(target_arch = "x86_64")),
            "CI runs on x86-64 with AVX2, and this test needs it"
        );
        return;
    };
    let mut rng = Rng(0x5EED_0FBA_1D00);
    let mut values = |len: usize| -> Vec<i8> {
        (0..len)
            .map(|_| match rng.next() % 4 {
                0 => 127,
                1 => -127,
                _ => ((rng.next() % 255) as i32 - 127) as i8,
            })
            .collect()
    };
    let shapes = [
        (15, 64, 16),
        (16, 4, 1),
        (17, 7, 17),
        (19, 576, 40),
        (32, 1540, 15),
        (45, 8203, 33),
        (100, 66, 64),
    ];
    for (t, k, n) in shapes {
        let qa = Quantized::from_parts(t, k, values(t * k), vec![1.0; t]).unwrap();
        let qb = Quantized::from_parts(n, k, values(n * k), vec![1.0; n]).unwrap();
        let want: Vec<i32> = (0..t * n)
            .map(|cell| {
                let (a, b) = (qa.row(cell / n), qb.row(cell % n));
                let s: i64 = a
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| i64::from(x) * i64::from(y))
                    .sum();
                i32::try_from(s).expect("fits i32")
            })
            .collect();
        let packed = PackedWeights::from_quantized(&qb);
        let mut changed = qb.q().to_vec();
        let last = changed.len() - 1;
        changed[last] = if changed[last] == 0 {
            1
        } else {
            -changed[last]
        };
        let mutant = PackedWeights::from_quantized(
            &Quantized::from_parts(n, k, changed, vec![1.0; n]).unwrap(),
        );
        equal_and_mutant_differs(
            &be,
            &qa,
            (&packed, &mutant),
            &want,
            &format!("t={t} k={k} n={n}"),
        );
        let mut got = vec![0; t * n];
        be.gemm_i32(&qa, Rhs::Activation(&qb), &mut got).unwrap();
        assert_eq!(
            first_diff(&got, &want),
            None,
            "t={t} k={k} n={n}, activation B"
        );
    }
}

#[test]
fn k_beyond_the_exact_range_is_refused() {
    let k = MAX_K + 1;
    let a = vec![1.0f32; k];
    assert_eq!(quantize_rows(&a, 1, k), Err(Error::KTooLarge { k }));
    assert!(matches!(
        PackedWeights::new(&a, 1, k),
        Err(Error::KTooLarge { k: 131_072 })
    ));
    let be = CpuBackend::new();
    assert_eq!(gemm_act(&be, &a, 1, &a, 1, k), Err(Error::KTooLarge { k }));
    assert!(matches!(
        Quantized::from_parts(1, k, vec![1; k], vec![1.0]),
        Err(Error::KTooLarge { .. })
    ));
}

#[test]
fn non_finite_values_are_refused_naming_operand_row_and_column() {
    let (t, n, k) = (3, 4, 5);
    let be = CpuBackend::new();
    let packed = PackedWeights::new(&matrix(1, n, k), n, k).unwrap();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut a = matrix(2, t, k);
        a[k + 3] = bad;
        let err = gemm(&be, &a, t, &packed).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NonFinite {
                    operand: Operand::A,
                    row: 1,
                    col: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("operand a") && err.to_string().contains("row 1, column 3"),
            "{err}"
        );

        let mut w = matrix(3, n, k);
        w[3 * k] = bad;
        let err = PackedWeights::new(&w, n, k).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NonFinite {
                    operand: Operand::B,
                    row: 3,
                    col: 0,
                    ..
                }
            ),
            "{err}"
        );
        let err = gemm_act(&be, &matrix(2, t, k), t, &w, n, k).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NonFinite {
                    operand: Operand::B,
                    row: 3,
                    col: 0,
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn shapes_and_quantized_parts_are_checked() {
    let be = CpuBackend::new();
    let packed = PackedWeights::new(&matrix(1, 4, 8), 4, 8).unwrap();
    assert!(matches!(
        gemm(&be, &[0.5; 15], 2, &packed),
        Err(Error::Shape {
            got: 15,
            expected: 16,
            ..
        })
    ));
    let qa = quantize_rows(&[0.5; 16], 2, 8).unwrap();
    let mut short = vec![0; 7];
    assert!(matches!(
        be.gemm_i32(&qa, Rhs::Weights(&packed), &mut short),
        Err(Error::Shape {
            got: 7,
            expected: 8,
            ..
        })
    ));
    let mut c = vec![0f32; 8];
    gemm_quantized_into(&be, &qa, Rhs::Weights(&packed), &mut c).unwrap();
    let want = gemm(&be, &[0.5; 16], 2, &packed).unwrap();
    assert!(
        c.iter()
            .map(|v| v.to_bits())
            .eq(want.iter().map(|v| v.to_bits()))
    );
    assert!(matches!(
        gemm_quantized_into(&be, &qa, Rhs::Weights(&packed), &mut c[..7]),
        Err(Error::Shape {
            got: 7,
            expected: 8,
            ..
        })
    ));
    let q9 = quantize_rows(&[0.5; 9], 1, 9).unwrap();
    assert!(matches!(
        check_shapes(&q9, Rhs::Weights(&packed), &[0; 4]),
        Err(Error::Shape {
            got: 8,
            expected: 9,
            ..
        })
    ));
    assert!(matches!(
        Quantized::from_parts(1, 2, vec![-128, 0], vec![1.0]),
        Err(Error::OutOfRange { value: -128, .. })
    ));
    assert!(matches!(
        Quantized::from_parts(1, 2, vec![1, 0], vec![f32::NAN]),
        Err(Error::BadScale { row: 0, .. })
    ));
    assert!(matches!(
        Quantized::from_parts(1, 2, vec![1], vec![1.0]),
        Err(Error::Shape { .. })
    ));
}

/// The contract written independently in f64: each f32 operation is done exactly in f64 and rounded
/// once to f32, which is the correctly rounded f32 result (53 ≥ 2·24 + 2).
fn independent(a: &[f32], t: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let quant = |x: &[f32]| -> (Vec<i64>, f64) {
        let m = x.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
        if m < f64::from(f32::MIN_POSITIVE) {
            return (vec![0; x.len()], 0.0);
        }
        let scale = (m / 127.0) as f32;
        let inv = (127.0 / m) as f32;
        let q = x
            .iter()
            .map(|&v| {
                let prod = (f64::from(v) * f64::from(inv)) as f32;
                f64::from(prod).round_ties_even().clamp(-127.0, 127.0) as i64
            })
            .collect();
        (q, f64::from(scale))
    };
    let rows_a: Vec<_> = a.chunks(k).map(quant).collect();
    let rows_b: Vec<_> = w.chunks(k).map(quant).collect();
    let mut c = Vec::with_capacity(t * n);
    for (qa, sa) in &rows_a {
        for (qb, sb) in &rows_b {
            let acc: i64 = qa.iter().zip(qb).map(|(x, y)| x * y).sum();
            let acc32 = acc as f64 as f32;
            let first = (f64::from(acc32) * sa) as f32;
            c.push((f64::from(first) * sb) as f32);
        }
    }
    c
}

#[test]
fn reference_matches_an_independent_formula() {
    let scalar = CpuBackend::with_isa(Isa::Scalar).unwrap();
    for (t, n, k, seed) in [
        (1, 1, 1, 1),
        (3, 5, 7, 2),
        (4, 3, 64, 3),
        (5, 6, 130, 4),
        (2, 17, 577, 5),
    ] {
        let a = matrix(seed, t, k);
        let w = matrix(seed + 100, n, k);
        let want = independent(&a, t, &w, n, k);
        let got = gemm(&scalar, &a, t, &PackedWeights::new(&w, n, k).unwrap()).unwrap();
        assert!(
            got.iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits())),
            "t={t} n={n} k={k}"
        );
        let mut acc = vec![0; t * n];
        let qa = quantize_rows(&a, t, k).unwrap();
        let qb = quantize_rows(&w, n, k).unwrap();
        reference_i32(&qa, Rhs::Activation(&qb), &mut acc).unwrap();
        for (i, &v) in acc.iter().enumerate() {
            let (r, c) = (i / n, i % n);
            let s: i64 = (0..k)
                .map(|j| i64::from(qa.row(r)[j]) * i64::from(qb.row(c)[j]))
                .sum();
            assert_eq!(i64::from(v), s);
        }
    }
    // Ties round to even: 0.5·127 / 127 · … — a row whose max is 127 maps k ↦ k exactly, and x.5 ties.
    let row = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -126.5];
    let q = quantize_rows(&row, 1, row.len()).unwrap();
    assert_eq!(q.q(), &[127, 0, 2, 2, 0, -2, -126]);
    assert_eq!(q.scales(), &[1.0]);
    // Zero and subnormal rows quantize to zeros with scale 0.
    let q = quantize_rows(
        &[0.0, -0.0, f32::from_bits(1), -f32::from_bits(0x007F_FFFF)],
        2,
        2,
    )
    .unwrap();
    assert_eq!(q.q(), &[0, 0, 0, 0]);
    assert_eq!(q.scales(), &[0.0, 0.0]);
}

/// A kernel written the obvious way in groups of 4, with one of two classic faults; until `armed`
/// it defers to the real backend, so it can pass the gates and go bad afterwards.
struct Mutant {
    fault: Fault,
    armed: AtomicBool,
    good: CpuBackend,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The leftover loop stops one short: `kmain..k - 1`.
    LeftoverOffByOne,
    /// `vpmaddubsw` fed A + 128: pair sums saturate at i16.
    Saturating,
}

impl Mutant {
    fn new(fault: Fault, armed: bool) -> Self {
        Self {
            fault,
            armed: AtomicBool::new(armed),
            good: CpuBackend::new(),
        }
    }

    fn cell(&self, qa: &[i8], qb: &[i8]) -> i32 {
        let k = qa.len();
        let kmain = k - k % 4;
        match self.fault {
            Fault::LeftoverOffByOne => {
                let mut acc: i32 = (0..kmain)
                    .map(|j| i32::from(qa[j]) * i32::from(qb[j]))
                    .sum();
                for j in kmain..k.saturating_sub(1).max(kmain) {
                    acc += i32::from(qa[j]) * i32::from(qb[j]);
                }
                acc
            }
            Fault::Saturating => {
                let mut acc = 0i32;
                let mut sum_b = 0i32;
                for j in (0..kmain).step_by(2) {
                    let p = |i: usize| (i32::from(qa[i]) + 128) * i32::from(qb[i]);
                    acc = acc.wrapping_add((p(j) + p(j + 1)).clamp(-32768, 32767));
                    sum_b += i32::from(qb[j]) + i32::from(qb[j + 1]);
                }
                acc = acc.wrapping_sub(128 * sum_b);
                for j in kmain..k {
                    acc += i32::from(qa[j]) * i32::from(qb[j]);
                }
                acc
            }
        }
    }
}

impl Backend for Mutant {
    fn name(&self) -> String {
        format!("mutant-{:?}", self.fault)
    }

    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
        if !self.armed.load(Ordering::Relaxed) {
            return self.good.gemm_i32(a, b, out);
        }
        check_shapes(a, b, out)?;
        let mut qb = vec![0i8; b.k()];
        for col in 0..b.n() {
            b.write_row(col, &mut qb);
            for r in 0..a.rows() {
                out[r * b.n() + col] = self.cell(a.row(r), &qb);
            }
        }
        Ok(())
    }
}

#[test]
fn every_kernel_passes_the_gates() {
    for be in backends() {
        exact_gates(&be).unwrap_or_else(|e| panic!("{}: {e}", be.name()));
    }
}

#[test]
fn the_gates_catch_both_mutants() {
    for fault in [Fault::LeftoverOffByOne, Fault::Saturating] {
        let err = exact_gates(&Mutant::new(fault, true)).unwrap_err();
        assert!(
            matches!(err, Error::GateMismatch { .. }),
            "{fault:?}: {err}"
        );
        // Disarmed, the same wrapper passes: the gates judge the kernel, not the wrapper.
        exact_gates(&Mutant::new(fault, false)).unwrap();
    }
}

#[test]
fn the_audit_catches_both_mutants_injected_after_the_gates() {
    let (t, n, k) = (3, 40, 579);
    // Live-looking data: unit-scale activations and weights.
    let mut rng = Rng(77);
    let a: Vec<f32> = (0..t * k).map(|_| rng.unit()).collect();
    let w: Vec<f32> = (0..n * k).map(|_| rng.unit() * 0.05).collect();
    let packed = PackedWeights::new(&w, n, k).unwrap();
    for fault in [Fault::LeftoverOffByOne, Fault::Saturating] {
        let mutant = Mutant::new(fault, false);
        exact_gates(&mutant).unwrap();
        let clean = gemm(&mutant, &a, t, &packed).unwrap();
        mutant.armed.store(true, Ordering::Relaxed);
        let err = gemm(&mutant, &a, t, &packed).unwrap_err();
        assert!(
            matches!(err, Error::AuditMismatch { .. }),
            "{fault:?}: {err}"
        );
        let err = gemm_act(&mutant, &a, t, &w, n, k).unwrap_err();
        assert!(
            matches!(err, Error::AuditMismatch { .. }),
            "{fault:?}: {err}"
        );
        assert_eq!(clean.len(), t * n);
    }
}

#[test]
fn audit_passes_correct_accumulators_and_names_a_wrong_cell() {
    let (t, n, k) = (2, 3, 10);
    let qa = quantize_rows(&matrix(5, t, k), t, k).unwrap();
    let qb = quantize_rows(&matrix(6, n, k), n, k).unwrap();
    let mut acc = vec![0; t * n];
    reference_i32(&qa, Rhs::Activation(&qb), &mut acc).unwrap();
    audit("cpu", &qa, Rhs::Activation(&qb), &acc, 1, 64).unwrap();
    acc[4] = acc[4].wrapping_add(1);
    let err = audit("cpu", &qa, Rhs::Activation(&qb), &acc, 1, 64).unwrap_err();
    assert!(
        matches!(err, Error::AuditMismatch { row: 1, col: 1, .. }),
        "{err}"
    );
}

#[test]
fn probe_agrees_across_kernels_and_depends_on_the_seed() {
    let hashes: Vec<[u8; 32]> = backends().iter().map(|be| probe(be, 42).unwrap()).collect();
    assert!(hashes.windows(2).all(|w| w[0] == w[1]));
    assert_ne!(probe(&CpuBackend::new(), 43).unwrap(), hashes[0]);
    assert!(probe(&Mutant::new(Fault::Saturating, true), 42).is_err());
}

#[test]
fn packed_weights_round_trip_to_row_major() {
    for (n, k) in [(1, 1), (17, 3), (33, 130), (16, 64)] {
        let w = matrix(9, n, k);
        let packed = PackedWeights::new(&w, n, k).unwrap();
        assert_eq!(packed.to_quantized(), quantize_rows(&w, n, k).unwrap());
        assert_eq!((packed.n(), packed.k()), (n, k));
        assert!(packed.bytes() >= n * k);
    }
    let a = PackedWeights::new(&[1.0], 1, 1).unwrap();
    let b = PackedWeights::new(&[1.0], 1, 1).unwrap();
    assert_ne!(a.id(), b.id());
}

#[test]
fn measured_rate_is_positive() {
    let rate = measure_rate(&CpuBackend::new()).unwrap();
    assert!(rate.is_finite() && rate > 0.0, "{rate}");
}

#[test]
fn appended_rows_equal_rows_quantized_together() {
    let (a, b) = (matrix(11, 3, 70), matrix(12, 5, 70));
    let mut grown = Quantized::empty(70).unwrap();
    grown.append(&quantize_rows(&a, 3, 70).unwrap()).unwrap();
    grown.append(&quantize_rows(&b, 5, 70).unwrap()).unwrap();
    let all: Vec<f32> = a.iter().chain(&b).copied().collect();
    assert_eq!(grown, quantize_rows(&all, 8, 70).unwrap());
    // Mutation: rows of another width are refused, not mixed in.
    let other = quantize_rows(&matrix(13, 1, 69), 1, 69).unwrap();
    assert!(grown.append(&other).is_err());
    assert_eq!(grown.rows(), 8);
}

#[test]
fn operands_quantized_into_recycled_memory_equal_fresh_ones() {
    // Larger, smaller, wider and empty operands in turn, each into the memory of the one before.
    let shapes = [(6, 200), (2, 37), (9, 512), (1, 3), (0, 64), (4, 129)];
    let mut last_values: Option<*const i8> = None;
    for (i, &(rows, k)) in shapes.iter().enumerate() {
        let a = matrix(40 + i as u64, rows, k);
        let reused = quantize_rows_reusing(&a, rows, k).unwrap();
        assert_eq!(
            reused,
            quantize_rows(&a, rows, k).unwrap(),
            "shape {rows}×{k}"
        );
        if let (Some(before), true) = (last_values, reused.q().len() <= 6 * 200) {
            // Every operand fits the first one's memory, which goes round: the same buffer.
            assert_eq!(
                reused.q().as_ptr(),
                before,
                "shape {rows}×{k} was given new memory"
            );
        }
        if rows > 0 {
            last_values = Some(reused.q().as_ptr());
        }
        recycle(reused);
    }
    // A refusal leaves nothing half-written behind: the next operand is whole again.
    let mut bad = matrix(50, 3, 16);
    bad[20] = f32::NAN;
    let refused = quantize_rows_reusing(&bad, 3, 16).unwrap_err().to_string();
    assert!(refused.contains("row 1"), "{refused}");
    let good = matrix(51, 3, 16);
    let again = quantize_rows_reusing(&good, 3, 16).unwrap();
    assert_eq!(again, quantize_rows(&good, 3, 16).unwrap());
    // Mutation: memory still holding another operand's values is not what a fresh quantization
    // gives (so the equalities above see what they compare).
    let stale = quantize_rows(&matrix(52, 3, 16), 3, 16).unwrap();
    assert_ne!(again, stale);
}

/// A backend that computes every cell but the last (a kernel that forgets a cell).
struct SkipsLast(CpuBackend);

impl Backend for SkipsLast {
    fn name(&self) -> String {
        "skips-last".to_string()
    }

    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
        let mut full = vec![0; out.len()];
        self.0.gemm_i32(a, b, &mut full)?;
        let last = out.len().saturating_sub(1);
        out[..last].copy_from_slice(&full[..last]);
        Ok(())
    }
}

#[test]
fn outputs_written_into_recycled_memory_equal_fresh_ones() {
    let be = CpuBackend::new();
    // (rows, K, N): larger, smaller, decode-sized and empty products in turn.
    let shapes = [
        (6, 200, 48),
        (2, 37, 20),
        (1, 576, 192),
        (9, 64, 130),
        (0, 16, 8),
    ];
    let fresh: Vec<Vec<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(t, k, n))| {
            let w = PackedWeights::new(&matrix(60 + i as u64, n, k), n, k).unwrap();
            gemm(&be, &matrix(70 + i as u64, t, k), t, &w).unwrap()
        })
        .collect();
    for round in 0..2 {
        // Memory holding values no product gives (NaN patterns), given back before each product.
        recycle_output(vec![f32::from_bits(0x7fc0_0123); 6 * 48]);
        recycle_output(vec![f32::from_bits(0xffc0_0456); 40]);
        for (i, (&(t, k, n), want)) in shapes.iter().zip(&fresh).enumerate() {
            let w = PackedWeights::new(&matrix(60 + i as u64, n, k), n, k).unwrap();
            let got = gemm(&be, &matrix(70 + i as u64, t, k), t, &w).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(want), "round {round}, shape {t}×{k}×{n}");
            recycle_output(got);
        }
    }
    // The memory goes round: on a thread with nothing given back yet, an output given back is
    // the next one's.
    let w = PackedWeights::new(&matrix(80, 16, 32), 16, 32).unwrap();
    let a = matrix(81, 4, 32);
    std::thread::scope(|s| {
        s.spawn(|| {
            let first = gemm(&be, &a, 4, &w).unwrap();
            let place = first.as_ptr();
            recycle_output(first);
            let second = gemm(&be, &a, 4, &w).unwrap();
            assert_eq!(
                second.as_ptr(),
                place,
                "a new buffer, not the one given back"
            );
            recycle_output(second);
            let plain = output_buffer(64);
            assert_eq!((plain.as_ptr(), plain.len()), (place, 64));
        });
    });
    // A batch's outputs and a plain buffer take given-back memory too, at the length asked.
    let qa = quantize_rows(&a, 4, 32).unwrap();
    let outs =
        gemm_quantized_batch(&be, &[(&qa, Rhs::Weights(&w)), (&qa, Rhs::Weights(&w))]).unwrap();
    assert_eq!(outs[0], gemm_quantized(&be, &qa, Rhs::Weights(&w)).unwrap());
    assert_eq!(outs[0], outs[1]);
    outs.into_iter().for_each(recycle_output);
    assert_eq!(output_buffer(1000).len(), 1000);
    // Mutation: a backend that leaves a cell unwritten gives the stale value there, which a
    // fresh product does not (so the equalities above see what they compare). Where the live
    // audit happens to pick that cell (16 of the 64), it refuses the product there instead.
    let want = gemm(&be, &a, 4, &w).unwrap();
    for round in 0..8 {
        recycle_output(vec![f32::from_bits(0x7fc0_0789); 64]);
        match gemm(&SkipsLast(CpuBackend::new()), &a, 4, &w) {
            Ok(skipped) => assert_ne!(
                skipped.last().map(|v| v.to_bits()),
                want.last().map(|v| v.to_bits()),
                "round {round}: the skipped cell holds a fresh product's value"
            ),
            Err(Error::AuditMismatch { row, col, .. }) => assert_eq!((row, col), (3, 15)),
            Err(e) => panic!("round {round}: {e}"),
        }
    }
}

#[test]
fn a_large_output_given_back_waits_for_a_large_one() {
    std::thread::scope(|s| {
        s.spawn(|| {
            // A prefill's gate/up output given back, then a small product's output asked for.
            let large = 1 << 20;
            let pattern = f32::from_bits(0x7fc0_0abc);
            recycle_output(vec![pattern; large]);
            let small = output_buffer(1000);
            let large_again = output_buffer(large);
            assert!(
                large_again.iter().all(|v| v.to_bits() == pattern.to_bits()),
                "the large output was lent for the small one and came back cut and zeroed"
            );
            assert_ne!(small.as_ptr(), large_again.as_ptr());
            // Small outputs (a decode token's) are lent whatever their sizes.
            drop(small);
            recycle_output(vec![0.0; 4000]);
            assert_eq!(
                output_buffer(10).capacity(),
                4000,
                "a small output was not lent"
            );
        });
    });
}

/// DeepGEMM's layout for comparison (GUIDE "DeepInfer"): one weight scale per 128 channels of K per
/// output row instead of one per row, each block's integer sum scaled by its own scale and the block
/// results added in f32, in order.
fn block_scaled(a: &[f32], t: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    const BLOCK: usize = 128;
    let qa = quantize_rows(a, t, k).unwrap();
    let mut c = Vec::with_capacity(t * n);
    for r in 0..t {
        for row in w.chunks(k).take(n) {
            let mut sum = 0f32;
            for (b, wb) in row.chunks(BLOCK).enumerate() {
                let qb = quantize_rows(wb, 1, wb.len()).unwrap();
                let acc: i32 = qa.row(r)[b * BLOCK..b * BLOCK + wb.len()]
                    .iter()
                    .zip(qb.q())
                    .map(|(&x, &y)| i32::from(x) * i32::from(y))
                    .sum();
                sum += (acc as f32 * qa.scales()[r]) * qb.scales()[0];
            }
            c.push(sum);
        }
    }
    c
}

#[test]
fn a_scale_every_128_channels_gives_other_products_than_the_contract() {
    // K = 576 (SmolLM2's hidden size): 4½ blocks of 128; one block of each weight row is larger, as
    // outlier channels are in real weights.
    let (t, n, k) = (4, 8, 576);
    let mut rng = Rng(7);
    let a: Vec<f32> = (0..t * k).map(|_| rng.unit()).collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| rng.unit() * if (i % k) / 128 == 1 { 8.0 } else { 0.05 })
        .collect();
    let scalar = CpuBackend::with_isa(Isa::Scalar).unwrap();
    let contract = gemm(&scalar, &a, t, &PackedWeights::new(&w, n, k).unwrap()).unwrap();
    assert!(
        contract
            .iter()
            .zip(independent(&a, t, &w, n, k))
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "the contract itself"
    );
    let blocks = block_scaled(&a, t, &w, n, k);
    let differ = contract
        .iter()
        .zip(&blocks)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    // Every product is another number: the block layout is not the verified GEMM.
    assert_eq!(differ, t * n, "{differ} of {} products differ", t * n);
    // The mutation: with one block per row (K ≤ 128) the two layouts are the same GEMM.
    let k1 = 96;
    let (a1, w1) = (matrix(3, t, k1), matrix(4, n, k1));
    assert_eq!(
        block_scaled(&a1, t, &w1, n, k1)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        gemm(&scalar, &a1, t, &PackedWeights::new(&w1, n, k1).unwrap())
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    );
}

/// `bytes` placed `shift` bytes into a 64-aligned buffer: a mapped shard stand-in.
struct Placed {
    chunks: Vec<Chunk>,
    range: std::ops::Range<usize>,
}

impl Placed {
    fn shared(bytes: &[u8], shift: usize) -> daisy_gemm_int8::SharedBytes {
        let mut chunks = vec![Chunk([0; 64]); (bytes.len() + shift).div_ceil(64)];
        bytemuck::cast_slice_mut::<_, u8>(&mut chunks)[shift..shift + bytes.len()]
            .copy_from_slice(bytes);
        std::sync::Arc::new(Self {
            chunks,
            range: 0..bytes.len() + shift,
        })
    }
}

#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Chunk([u8; 64]);

impl AsRef<[u8]> for Placed {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.chunks)[self.range.clone()]
    }
}

#[test]
fn weights_borrowed_from_shared_bytes_give_the_owned_products() {
    let backend = CpuBackend::new();
    for (n, k) in [(1, 3), (37, 70), (64, 576)] {
        let w = matrix(7, n, k);
        let owned = PackedWeights::new(&w, n, k).unwrap();
        // Each array where a shard puts it: its start moved up to its alignment.
        let mut bytes = Vec::new();
        let mut ranges: [std::ops::Range<usize>; 4] = Default::default();
        for ((part, align), range) in owned.parts().arrays.into_iter().zip(&mut ranges) {
            bytes.resize(bytes.len().next_multiple_of(align), 0);
            *range = bytes.len()..bytes.len() + part.len();
            bytes.extend_from_slice(part);
        }
        let shared = Placed::shared(&bytes, 0);
        let borrowed = PackedWeights::from_shared(n, k, &shared, ranges.clone()).unwrap();
        let a = matrix(11, 5, k);
        let (p, q) = (
            gemm(&backend, &a, 5, &owned).unwrap(),
            gemm(&backend, &a, 5, &borrowed).unwrap(),
        );
        assert!(
            p.iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{n}x{k}: borrowed weights gave other products"
        );
        // The mutations: one byte into the buffer the lines are misaligned, and refused by name;
        // a range one byte short is refused.
        let shifted = Placed::shared(&bytes, 1);
        let moved = ranges.clone().map(|r| r.start + 1..r.end + 1);
        match PackedWeights::from_shared(n, k, &shifted, moved) {
            Err(Error::Misaligned { what, .. }) => assert_eq!(what, "packed lines"),
            other => panic!("{n}x{k}: a misaligned view was taken: {other:?}"),
        }
        let mut short = ranges.clone();
        short[3].end -= 1;
        assert!(matches!(
            PackedWeights::from_shared(n, k, &shared, short),
            Err(Error::Shape { .. })
        ));
    }
}

/// Weights moved into a weight arena keep their id and give every kernel the same accumulators as
/// before the move, for shapes with a K leftover and a partial panel; a handle whose moved lines
/// differ from its own (one weight's sign flipped before the move) does not.
#[test]
fn weights_moved_into_the_arena_give_the_same_products() {
    let arena = daisy_gemm_int8::WeightArena::new();
    #[cfg(target_os = "linux")]
    let mut arena = arena.expect("a Linux host reserves an arena's address space");
    #[cfg(not(target_os = "linux"))]
    let Some(mut arena) = arena else {
        return;
    };
    for (seed, t, n, k) in [(1u64, 1, 37, 65), (2, 3, 576, 576), (3, 67, 34, 1536)] {
        let a = matrix(seed, t, k);
        let w = matrix(seed ^ 0xFFFF, n, k);
        let qa = quantize_rows(&a, t, k).unwrap();
        let own = PackedWeights::new(&w, n, k).unwrap();
        let mut moved = PackedWeights::new(&w, n, k).unwrap();
        let id = moved.id();
        arena.take(&mut moved).unwrap();
        assert_eq!(moved.id(), id);
        assert_eq!(moved.to_quantized(), own.to_quantized());
        let mut flipped_w = w.clone();
        flipped_w[n * k - 1] = -flipped_w[n * k - 1];
        let mut flipped = PackedWeights::new(&flipped_w, n, k).unwrap();
        arena.take(&mut flipped).unwrap();
        for be in backends() {
            let mut want = vec![0; t * n];
            be.gemm_i32(&qa, Rhs::Weights(&own), &mut want).unwrap();
            equal_and_mutant_differs(
                &be,
                &qa,
                (&moved, &flipped),
                &want,
                &format!("t={t} n={n} k={k}"),
            );
        }
    }
    assert!(arena.used() > 0);
}

/// The idle worker reads weights ahead with real loads where they lie in shared bytes: weights (and
/// the arena that holds them) dropped right after being handed to it stay mapped until it is done,
/// and products afterwards are unaffected.
#[test]
fn weights_read_ahead_may_be_dropped_at_once() {
    let (t, n, k) = (1, 2048, 1024);
    let a = matrix(5, t, k);
    let qa = quantize_rows(&a, t, k).unwrap();
    let w = matrix(6, n, k);
    let own = PackedWeights::new(&w, n, k).unwrap();
    let be = CpuBackend::new();
    let mut want = vec![0; t * n];
    reference_i32(&qa, Rhs::Weights(&own), &mut want).unwrap();
    for round in 0..20 {
        let Some(mut arena) = daisy_gemm_int8::WeightArena::new() else {
            // Hosts without an arena keep weights in their own arrays: hints only, nothing to hold.
            daisy_gemm_int8::prefetch(&own);
            continue;
        };
        let mut moved = PackedWeights::new(&w, n, k).unwrap();
        arena.take(&mut moved).unwrap();
        // Products start the pool; then the worker gets two megabytes to read and the bytes go.
        let mut got = vec![0; t * n];
        be.gemm_i32(&qa, Rhs::Weights(&moved), &mut got).unwrap();
        daisy_gemm_int8::prefetch(&moved);
        drop(moved);
        drop(arena);
        if round % 2 == 0 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        be.gemm_i32(&qa, Rhs::Weights(&own), &mut got).unwrap();
        assert_eq!(first_diff(&got, &want), None, "round {round}");
    }
}

/// Products with an activation B at the few rows where each cell is one dot product of two rows
/// (attention at decode and in short chunks): every row count up to the cut-over, K around the
/// 32-value step, and runs of B rows around the eight taken at once.
#[test]
fn row_by_row_products_equal_the_reference() {
    for t in 1..=9 {
        for k in [1, 3, 23, 31, 32, 33, 64, 65, 100] {
            for n in [1, 7, 8, 9, 23] {
                let seed = (t * 10_000 + k * 100 + n) as u64;
                let qa = quantize_rows(&matrix(seed, t, k), t, k).unwrap();
                let qb = quantize_rows(&matrix(seed ^ 0x5A5A, n, k), n, k).unwrap();
                let mut want = vec![0; t * n];
                reference_i32(&qa, Rhs::Activation(&qb), &mut want).unwrap();
                for be in backends() {
                    let mut got = vec![0; t * n];
                    be.gemm_i32(&qa, Rhs::Activation(&qb), &mut got).unwrap();
                    assert_eq!(
                        first_diff(&got, &want),
                        None,
                        "{} t={t} k={k} n={n}: (cell, got, want)",
                        be.name()
                    );
                }
            }
        }
    }
}

/// The CPU backend checks and dequantizes each block of a weight product as soon as it has written
/// it (`Backend::gemm_dequantized`): every output must be the contract's
/// `((acc as f32) · sa) · sb` over the accumulators of `gemm_i32`, bit for bit — decode's runs of
/// columns (1-4 rows, one thread or the pool), prefill's tiles by strips and by blocks (paired
/// from 16 rows on AVX2), K with values left to the scalar loop, cut panels. Its mutation, the two
/// scales applied in the other order, must differ on every shape.
#[test]
fn weight_products_dequantized_as_written_are_the_contract_over_the_integers() {
    let be = CpuBackend::new();
    let shapes = [
        (1, 576, 1536),
        (3, 64, 40),
        (4, 1539, 97),
        (16, 576, 192),
        (33, 131, 200),
        (100, 576, 576),
        (512, 576, 1536),
        (64, 1536, 576),
    ];
    for (t, k, n) in shapes {
        let a = quantize_rows(&daisy_gemm_int8::seeded_matrix(t as u64, t, k), t, k).unwrap();
        let b =
            PackedWeights::new(&daisy_gemm_int8::seeded_matrix(n as u64 ^ 77, n, k), n, k).unwrap();
        let got = gemm_quantized(&be, &a, Rhs::Weights(&b)).unwrap();
        let mut acc = vec![0i32; t * n];
        be.gemm_i32(&a, Rhs::Weights(&b), &mut acc).unwrap();
        let contract = |scales_swapped: bool| -> Vec<f32> {
            acc.iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (sa, sb) = (a.scales()[i / n], b.scales()[i % n]);
                    match scales_swapped {
                        false => (v as f32 * sa) * sb,
                        true => (v as f32 * sb) * sa,
                    }
                })
                .collect()
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&contract(false)), "{t}×{k}×{n}");
        assert_ne!(bits(&got), bits(&contract(true)), "{t}×{k}×{n}: mutation");
    }
}
