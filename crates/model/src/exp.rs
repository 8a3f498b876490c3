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
/// 1/n! for n = 13 down to 2.
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

/// `e^x` in f64 for an f32 `x` (as f64), before the f32 rounding.
#[inline(always)]
fn exp_f64(x: f64) -> f64 {
    exp_f64_taylor(x, &INV_FACT)
}

/// [`exp_f64`] with the Taylor coefficients `1/n!` from the highest degree down to 2.
#[inline(always)]
fn exp_f64_taylor(x: f64, inv_fact: &[f64]) -> f64 {
    let x = x.clamp(LO, HI);
    let shifted = x * LOG2E + SHIFTER;
    let k = shifted - SHIFTER;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = inv_fact[0];
    for c in &inv_fact[1..] {
        p = p * r + c;
    }
    let p = (p * r + 1.0) * r + 1.0;
    // The low bits of `shifted` hold k (two's complement in the mantissa); 2^k by its exponent bits.
    let k_bits = shifted.to_bits().wrapping_sub(SHIFTER.to_bits());
    let scale = f64::from_bits(k_bits.wrapping_add(1023) << 52);
    p * scale
}

/// `e^x` of one f32, rounded once: the contract's exponential (DESIGN §3.8), which every other
/// implementation of it (the GPU's, `daisy-wgsl`'s `floats.wgsl`) is held to bit for bit.
#[inline]
pub fn exp(x: f32) -> f32 {
    exp_f64(f64::from(x)) as f32
}

#[inline(always)]
fn exp_slice_generic(xs: &mut [f32]) {
    for v in xs.iter_mut() {
        *v = exp_f64(f64::from(*v)) as f32;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_slice_avx512(xs: &mut [f32]) {
    exp_slice_generic(xs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_slice_avx2(xs: &mut [f32]) {
    exp_slice_generic(xs);
}

/// Every element replaced by its [`exp`], vectorized for the machine (same bits on every path).
pub(crate) fn exp_slice(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { exp_slice_avx512(xs) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { exp_slice_avx2(xs) };
        }
    }
    exp_slice_generic(xs);
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
        let short = |x: f32| exp_f64_taylor(f64::from(x), &INV_FACT[5..]) as f32;
        let (diff, n) = sweep(short);
        assert!(diff * 1_000_000 > n, "only {diff} of {n} differ");
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
