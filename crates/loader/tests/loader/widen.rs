//! BF16 and F16 widening checked over all 65,536 bit patterns against an exact formula evaluated
//! in f64 from sign, exponent and mantissa (subnormals and signed zeros included), plus the
//! mutations the check must catch.

use daisy_loader::{bf16_from_f32, widen_bf16, widen_f16};

/// An IEEE-style binary format with `exp_bits` exponent bits and `man_bits` mantissa bits,
/// decoded exactly in f64 (both formats fit in f64 without rounding).
fn exact(bits: u16, exp_bits: u32, man_bits: u32) -> f64 {
    let sign = if bits >> (exp_bits + man_bits) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let exp = i32::from((bits >> man_bits) & ((1 << exp_bits) - 1));
    let man = f64::from(bits & ((1 << man_bits) - 1));
    let bias = (1 << (exp_bits - 1)) - 1;
    let scale = f64::from(1u32 << man_bits);
    if exp == (1 << exp_bits) - 1 {
        return if man == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if exp == 0 {
        return sign * (man / scale) * 2f64.powi(1 - bias);
    }
    sign * (1.0 + man / scale) * 2f64.powi(exp - bias)
}

/// The first pattern where `widen` disagrees with the exact value (NaN for NaN, the sign of zero
/// included), or `None`.
fn first_mismatch(widen: impl Fn(u16) -> f32, exp_bits: u32, man_bits: u32) -> Option<u16> {
    (0..=u16::MAX).find(|&bits| {
        let want = exact(bits, exp_bits, man_bits);
        let got = f64::from(widen(bits));
        let same = if want.is_nan() {
            got.is_nan()
        } else {
            got == want && got.is_sign_negative() == want.is_sign_negative()
        };
        !same
    })
}

#[test]
fn f16_all_patterns_exact() {
    assert_eq!(first_mismatch(widen_f16, 5, 10), None);
}

#[test]
fn bf16_all_patterns_exact() {
    assert_eq!(first_mismatch(widen_bf16, 8, 7), None);
}

#[test]
fn the_check_sees_subnormals_signed_zero_and_swapped_formats() {
    // Flushing subnormals to zero.
    let flush = |b: u16| {
        if (b >> 10) & 0x1f == 0 {
            widen_f16(b & 0x8000)
        } else {
            widen_f16(b)
        }
    };
    assert_eq!(first_mismatch(flush, 5, 10), Some(1));
    // Losing the sign of zero.
    let unsigned_zero = |b: u16| if b == 0x8000 { 0.0 } else { widen_f16(b) };
    assert_eq!(first_mismatch(unsigned_zero, 5, 10), Some(0x8000));
    // A one-ulp error in one normal value.
    let off_by_ulp = |b: u16| {
        if b == 0x3c01 {
            f32::from_bits(widen_f16(b).to_bits() + 1)
        } else {
            widen_f16(b)
        }
    };
    assert_eq!(first_mismatch(off_by_ulp, 5, 10), Some(0x3c01));
    // The formats are not interchangeable.
    assert!(first_mismatch(widen_bf16, 5, 10).is_some());
    assert!(first_mismatch(widen_f16, 8, 7).is_some());
}

/// The BF16 values either side of `x` (by truncation and the next pattern up in magnitude).
fn neighbours(x: f32) -> (u16, u16) {
    let lo = (x.to_bits() >> 16) as u16;
    (lo, lo.wrapping_add(1))
}

#[test]
fn bf16_rounding_is_nearest_ties_to_even() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut samples: Vec<f32> = (0..200_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f32::from_bits(state as u32)
        })
        .filter(|x| x.is_finite() && x.abs() < 3.0e38)
        .collect();
    // Exact ties, both parities, both signs.
    samples.extend([
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0xbf80_8000),
        f32::from_bits(0xbf81_8000),
        0.0,
        -0.0,
        f32::from_bits(1),
    ]);
    for x in samples {
        let (lo, hi) = neighbours(x);
        let (dl, dh) = (
            (f64::from(x) - f64::from(widen_bf16(lo))).abs(),
            (f64::from(x) - f64::from(widen_bf16(hi))).abs(),
        );
        let want = if dl < dh || (dl == dh && lo & 1 == 0) {
            lo
        } else {
            hi
        };
        assert_eq!(
            bf16_from_f32(x),
            want,
            "rounding {x:e} ({:#010x})",
            x.to_bits()
        );
    }
}
