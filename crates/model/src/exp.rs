//! `e^x` for f32 arguments, evaluated in f64 and rounded once to f32, over whole slices.
//!
//! The softmax of a long window and the SiLU of every MLP row take tens of millions of exponentials
//! per prefill; one scalar `libm::exp` call each was a quarter of the prefill time. This is the same
//! function written so the compiler vectorizes it: Cody–Waite reduction `x = k·ln2 + r`, |r| ≤ ln2/2,
//! `e^r` by its Taylor polynomial to degree 13 (truncation < 2⁻⁵⁶), and `2^k` built in the exponent
//! bits; plain f64 multiplies and adds in one fixed order (Rust never fuses them), so the bits are the
//! same on every machine and every instruction set. Its f64 result is within a few f64 ulps of
//! `e^x`, so the f32 rounding is the correctly rounded value — the same as libm's f64 `exp` rounded —
//! except when `e^x` lies within ~2⁻⁵⁰ (relative) of an f32 rounding boundary; the tests count those
//! against libm over a sweep of every 64th f32.
//!
//! The polynomial is defined by Horner's rule ([`exp_f64_horner`], which the GPU's `floats.wgsl`
//! evaluates too) and evaluated by Estrin's scheme ([`exp_f64`]): pairs of terms, then pairs of
//! pairs over r², r⁴, r⁸. Horner's thirteen dependent multiply-adds made every exponential wait
//! about 110 cycles, and the core could hold only two or three of them in flight (2.3 ns each on a
//! Zen 3 core); Estrin's five levels take half as long (1.5 ns). The two f64 results differ by at
//! most 2 ulps and round to the same f32 for every f32 argument: the test
//! `estrin_equals_horner_for_every_f32` checks all 2³² of them.

/// Below this the f32 result is 0 (e^-104 < half the smallest subnormal); `-inf` lands here too.
const LO: f64 = -104.0;
/// Above this the f32 result is +inf (e^89 > f32::MAX).
const HI: f64 = 89.0;
/// 1.5·2⁵²: adding it rounds an f64 of magnitude < 2⁵¹ to an integer, ties to even.
const SHIFTER: f64 = 6_755_399_441_055_744.0;
const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 split so that `k·LN2_HI` is exact for |k| < 2²⁰ (LN2_HI has 32 significant bits).
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1/n! for n = 13 down to 2 (Horner's order).
#[cfg(test)]
const INV_FACT: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// `1/n!` for n = 0 to 13, lowest degree first: Estrin's pairs `c[2i] + c[2i+1]·r`.
const COEF: [f64; 14] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
    1.0 / 6_227_020_800.0,
];

/// The Cody–Waite reduction of `x` (clamped to `[LO, HI]`): `(r, shifted)`, `x = k·ln2 + r` with
/// k held in the low bits of `shifted`.
#[inline(always)]
fn reduce(x: f64) -> (f64, f64) {
    let x = x.clamp(LO, HI);
    let shifted = x * LOG2E + SHIFTER;
    let k = shifted - SHIFTER;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    (r, shifted)
}

/// `p · 2^k`, k from the low bits of `shifted` (two's complement in the mantissa), 2^k built in
/// its exponent bits.
#[inline(always)]
fn scale(p: f64, shifted: f64) -> f64 {
    let k_bits = shifted.to_bits().wrapping_sub(SHIFTER.to_bits());
    p * f64::from_bits(k_bits.wrapping_add(1023) << 52)
}

/// `e^x` in f64 for an f32 `x` (as f64), before the f32 rounding: the polynomial by Estrin's scheme.
#[inline(always)]
fn exp_f64(x: f64) -> f64 {
    exp_f64_estrin(x, &COEF)
}

/// [`exp_f64`] with the coefficients `c` (`1/n!` from degree 0 up).
#[inline(always)]
fn exp_f64_estrin(x: f64, c: &[f64; 14]) -> f64 {
    let (r, shifted) = reduce(x);
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let p01 = c[0] + c[1] * r;
    let p23 = c[2] + c[3] * r;
    let p45 = c[4] + c[5] * r;
    let p67 = c[6] + c[7] * r;
    let p89 = c[8] + c[9] * r;
    let p1011 = c[10] + c[11] * r;
    let p1213 = c[12] + c[13] * r;
    let q0 = p01 + p23 * r2;
    let q1 = p45 + p67 * r2;
    let q2 = p89 + p1011 * r2;
    let s0 = q0 + q1 * r4;
    let s1 = q2 + p1213 * r4;
    scale(s0 + s1 * r8, shifted)
}

/// The polynomial by Horner's rule, from the highest degree down (the form that defines it, which
/// the GPU's `floats.wgsl` evaluates): `inv_fact` holds `1/n!` from the highest degree n down to 2.
#[cfg(test)]
#[inline(always)]
fn exp_f64_horner(x: f64, inv_fact: &[f64]) -> f64 {
    let (r, shifted) = reduce(x);
    let mut p = inv_fact[0];
    for c in &inv_fact[1..] {
        p = p * r + c;
    }
    scale((p * r + 1.0) * r + 1.0, shifted)
}

/// `e^x` of one f32, rounded once: the contract's exponential (DESIGN §3.8), which every other
/// implementation of it (the GPU's, `daisy-wgsl`'s `floats.wgsl`) is held to bit for bit. Always
/// inlined, so loops compiled for a wider instruction set (`widest_simd!`) vectorize it.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_f64(f64::from(x)) as f32
}

/// Every element replaced by its [`exp`], vectorized for the machine (same bits on every path).
pub(crate) fn exp_slice(xs: &mut [f32]) {
    #[inline(always)]
    fn each(xs: &mut [f32]) {
        for v in xs.iter_mut() {
            *v = exp(*v);
        }
    }
    widest_simd!(each(xs: &mut [f32]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 64th f32 in [−110, 95]: (differences from libm's f64 `exp` rounded, count).
    fn sweep(f: impl Fn(f32) -> f32) -> (usize, usize) {
        let (mut diff, mut n) = (0, 0);
        for bits in (0u32..=u32::MAX).step_by(64) {
            let x = f32::from_bits(bits);
            if !(-110.0..=95.0).contains(&x) {
                continue;
            }
            n += 1;
            let want = libm::exp(f64::from(x)) as f32;
            let got = f(x);
            if got.to_bits() != want.to_bits() {
                diff += 1;
            }
        }
        (diff, n)
    }

    #[test]
    fn equals_libm_rounded_but_at_rare_boundaries() {
        let (diff, n) = sweep(exp);
        eprintln!("{diff} of {n} differ from libm's exp rounded to f32");
        assert!(n > 30_000_000);
        // Both are within a few f64 ulps of e^x; they can round differently only within ~2⁻⁵⁰ of
        // an f32 rounding boundary, about one argument in 10⁷.
        assert!(diff * 1_000_000 <= n, "{diff} of {n} differ");
    }

    #[test]
    fn a_shorter_polynomial_is_caught() {
        // Mutation: the Taylor series stopped at degree 8 (error ~2⁻³²) rounds differently often.
        let short = |x: f32| exp_f64_horner(f64::from(x), &INV_FACT[5..]) as f32;
        let (diff, n) = sweep(short);
        assert!(diff * 1_000_000 > n, "only {diff} of {n} differ");
    }

    /// Every element replaced by Horner's [`exp_f64_horner`], rounded (vectorized where it can be:
    /// the exhaustive sweep's reference).
    fn horner_slice(xs: &mut [f32]) {
        #[inline(always)]
        fn each(xs: &mut [f32]) {
            for x in xs.iter_mut() {
                *x = exp_f64_horner(f64::from(*x), &INV_FACT) as f32;
            }
        }
        widest_simd!(each(xs: &mut [f32]))
    }

    /// Every f32 in `[LO, HI]` (`f32` from `f64`: these bounds are f32 values), in runs of
    /// consecutive bit patterns over two threads: `(arguments, the first whose f32 results differ)`,
    /// stopping at the first difference when `first_only`. Arguments outside the range are clamped
    /// to its ends before either evaluation sees them.
    fn every_f32_in_range(
        evaluate: impl Fn(&mut [f32]) + Sync,
        first_only: bool,
    ) -> (u64, Option<f32>) {
        // The f32 bit patterns of [−0, LO] (sign set, growing magnitude) and [0, HI].
        let ends = [
            ((-0.0f32).to_bits(), (LO as f32).to_bits()),
            (0, (HI as f32).to_bits()),
        ];
        let found = std::sync::Mutex::new(None::<f32>);
        let count = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for (lo, hi) in ends {
                let (found, count, evaluate) = (&found, &count, &evaluate);
                scope.spawn(move || {
                    const RUN: u32 = 1 << 16;
                    let mut xs = vec![0f32; RUN as usize];
                    let mut start = lo;
                    while start <= hi {
                        if first_only && found.lock().unwrap().is_some() {
                            return;
                        }
                        let end = start.saturating_add(RUN - 1).min(hi);
                        let xs = &mut xs[..(end - start + 1) as usize];
                        for (x, bits) in xs.iter_mut().zip(start..=end) {
                            *x = f32::from_bits(bits);
                        }
                        let mut got = xs.to_vec();
                        evaluate(&mut got);
                        let mut want = xs.to_vec();
                        horner_slice(&mut want);
                        for ((x, got), want) in xs.iter().zip(&got).zip(&want) {
                            if want.to_bits() != got.to_bits() {
                                found.lock().unwrap().get_or_insert(*x);
                                if first_only {
                                    return;
                                }
                            }
                        }
                        count.fetch_add(xs.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        if end == u32::MAX {
                            break;
                        }
                        start = end + 1;
                    }
                });
            }
        });
        (count.into_inner(), found.into_inner().unwrap())
    }

    #[test]
    fn estrin_equals_horner_for_every_f32() {
        // The path every product takes (vectorized where the CPU has the width).
        let (n, first) = every_f32_in_range(exp_slice, false);
        assert_eq!(
            first, None,
            "Estrin's and Horner's f32 results differ at {first:?}"
        );
        assert!(n > 2_200_000_000, "{n} arguments");
        // Outside the range both clamp to its ends; NaN stays NaN, infinities go to 0 and +inf.
        for x in [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1e30,
            1e30,
        ] {
            let want = exp_f64_horner(f64::from(x), &INV_FACT) as f32;
            assert_eq!(exp(x).to_bits(), want.to_bits(), "at {x}");
        }
    }

    #[test]
    fn estrin_without_its_last_terms_is_caught() {
        // Mutation: the series stopped at degree 11 (truncation ~2⁻⁴⁸, a few f64 ulps, as far from
        // Horner's result as Estrin's own rounding is near it): the sweep finds an argument whose
        // f32 rounds differently. (Without its degree-13 term alone the polynomial still rounds
        // every f32 the same.)
        let mut short = COEF;
        short[12] = 0.0;
        short[13] = 0.0;
        let evaluate = |xs: &mut [f32]| {
            for x in xs.iter_mut() {
                *x = exp_f64_estrin(f64::from(*x), &short) as f32;
            }
        };
        let (_, first) = every_f32_in_range(evaluate, true);
        assert!(
            first.is_some(),
            "no argument tells the shorter polynomial apart"
        );
    }

    #[test]
    fn slices_equal_scalars_and_edges() {
        let mut xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 600.0) * 0.37).collect();
        xs.extend([
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            -104.0,
            -103.9,
            88.72,
            88.73,
            1e-30,
        ]);
        let want: Vec<f32> = xs.iter().map(|&x| exp(x)).collect();
        let mut got = xs.clone();
        exp_slice(&mut got);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(88.73), f32::INFINITY);
        assert_eq!(exp(88.72), libm::exp(88.72f32 as f64) as f32);
        assert!(exp(-103.0) > 0.0 && exp(-103.0) < f32::MIN_POSITIVE);
    }
}
