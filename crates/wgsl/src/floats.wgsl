// DESIGN §3.8's float operations in WGSL, in the form that gives the CPU's bits: the library the
// layer kernels (`layer.wgsl`) and `FloatLab` (`lab.wgsl`, with the probes of the adapter's own
// arithmetic) are built on. Needs `SHADER_F64`. Every value crosses the bindings as bits
// (f32 as u32; f64 as its two u32 halves, low first), so no load or store can flush a subnormal.
//
// Three rules make a driver reproduce the contract:
// - No contraction. naga's SPIR-V carries no `NoContraction`, so a driver may fuse `a * b + c` into
//   one rounding. Every product that feeds an addition goes through `g`, a choice between the
//   product and its negation on a condition the compiler cannot see (it comes from the uniform and
//   is false): the addition's operand is a select, not a multiply, so nothing fuses into it. (A
//   multiply by a 1.0 from the uniform is not enough: NVIDIA's compiler fused through it, and the
//   H100's quotients and roots below came out an ulp off in a tenth to a fifth of the lanes.)
// - No subnormal through the float unit. `widen` and `narrow` build and take apart f32 subnormals
//   in integers; f32 arithmetic is done in f64 on widened operands and narrowed once, which is the
//   correctly rounded f32 result for +, -, * (53 >= 2 * 24 + 2).
// - No algebra on the driver's side. Drivers reassociate float operations that SPIR-V does not
//   mark exact (Mesa folds `(a + 2^52) - 2^52` to `a`): a rounding the CPU does by adding and
//   removing a constant is done the same way here with the sum behind `g` (`round_even`).
// - No rounding to an integer of the driver's: the built-in `round` is not trusted with ties
//   (Mesa 22.3's lavapipe on an AVX2 host without AVX-512 rounds every f64 x.5 toward zero, so
//   a quantized 75.5 came out 75 where the contract's ties to even give 76).
// - No division or square root of the driver's on trust (their precision is not specified):
//   `div_rn` and `sqrt_rn` take the driver's result as a first guess, refine it by one Newton step,
//   compute the exact remainder with Dekker's product (guarded: no fused multiply-add needed), and
//   step to the correctly rounded neighbour, ties to even. (The H100's own f64 division and square
//   root are off by an ulp on some inputs: the step is needed there.)

var<private> one: f64;

// A product rounded on its own (see the first rule): `x`, as `one` (1.0) is never negative.
fn g(x: f64) -> f64 {
    return select(x, -x, one < 0.0lf);
}

// 1.5 * 2^52: adding it rounds an f64 of magnitude below 2^51 to an integer, ties to even.
const ROUND_SHIFTER: f64 = 6755399441055744.0lf;

// v rounded to an integer, ties to even, for |v| < 2^51: by the shifter, as the CPU does, the sum
// behind `g` so that no compiler cancels the pair.
fn round_even(v: f64) -> f64 {
    return g(v + ROUND_SHIFTER) - ROUND_SHIFTER;
}

// 2^k for |k| <= 1023, exactly (`ldexp` scales by a power of two without rounding).
fn pow2(k: i32) -> f64 {
    return ldexp(1.0lf, k);
}

// An f32 given by its bits, exactly as f64; subnormals built in integers.
fn widen(bits: u32) -> f64 {
    let mag = bits & 0x7fffffffu;
    if mag >= 0x00800000u {
        return f64(bitcast<f32>(bits));
    }
    let v = f64(mag) * pow2(-149);
    return select(v, -v, (bits & 0x80000000u) != 0u);
}

// f64 -> f32 bits, rounded to nearest, ties to even, subnormals and overflow included.
fn narrow(v: f64) -> u32 {
    let a = abs(v);
    if a >= 1.1754943508222875e-38lf || a == 0.0lf {
        // F32_ROUND_TO_INF: the least value that rounds to infinity (f32::MAX + half an ulp).
        if a >= 3.4028235677973366e38lf {
            return select(0x7f800000u, 0xff800000u, v < 0.0lf);
        }
        return bitcast<u32>(f32(v));
    }
    // Subnormal result: the integer multiple of 2^-149 nearest to |v|, ties to even (|v| * 2^149
    // < 2^23 is exact).
    let m = round_even(a * pow2(149));
    return select(0u, 0x80000000u, v < 0.0lf) | u32(m);
}

struct Pair {
    hi: f64,
    lo: f64,
}

// The exponent e of a positive normal f64: 2^e <= a < 2^(e+1). (Bounded: an infinite or NaN `a`,
// which no caller passes, ends the loop with a wrong e rather than hanging the device. naga's
// `frexp` of an f64 needs 64-bit integers, which not every adapter has.)
fn exponent(a: f64) -> i32 {
    var e = clamp(i32(floor(log2(f32(a)))), -1022, 1023);
    for (var i = 0; i < 2100; i = i + 1) {
        if pow2(e) > a {
            e = e - 1;
        } else if pow2(e + 1) <= a {
            e = e + 1;
        } else {
            break;
        }
    }
    return e;
}

// Veltkamp's split: hi holds the top 26 bits of a, a = hi + lo exactly.
fn split(a: f64) -> Pair {
    let c = g(134217729.0lf * a);
    let hi = c - g(c - a);
    return Pair(hi, a - hi);
}

// Dekker's product: a * b = hi + lo exactly (no overflow or underflow in our ranges).
fn two_prod(a: f64, b: f64) -> Pair {
    let p = g(a * b);
    let x = split(a);
    let y = split(b);
    let lo = g(x.lo * y.lo) - (((p - g(x.hi * y.hi)) - g(x.lo * y.hi)) - g(x.hi * y.lo));
    return Pair(p, lo);
}

// Whether the last mantissa bit of q (positive, exponent e) is 1.
fn odd(q: f64, e: i32) -> bool {
    return fract(ldexp(q, 51 - e)) != 0.0lf;
}

// a - x * y exactly, where x * y lies within a factor 2 of a (a - hi by Sterbenz's lemma; the
// remainder of a quotient or root within a few ulps is representable).
fn remainder(a: f64, x: f64, y: f64) -> f64 {
    let p = two_prod(x, y);
    return g(a - p.hi) - p.lo;
}

// Half the gap from a positive q (exponent e) to its neighbour above (hi) and below (lo: half as
// much at a power of two).
fn half_gaps(q: f64, e: i32) -> Pair {
    let h = pow2(e - 53);
    return Pair(h, select(h, pow2(e - 54), q == pow2(e)));
}

// a / b correctly rounded (ties to even), a >= 0, b > 0, the quotient a normal f64.
fn div_rn(a: f64, b: f64) -> f64 {
    if a == 0.0lf {
        return 0.0lf;
    }
    var q = a / b;
    // One Newton step on the remainder takes a guess that is many ulps off to within about one.
    q = q + remainder(a, q, b) / b;
    for (var i = 0; i < 4; i = i + 1) {
        // q is too small when a / b > q + h, i.e. r > h * b (a tie goes to the even neighbour).
        let r = remainder(a, q, b);
        let e = exponent(q);
        let gap = half_gaps(q, e);
        let up = g(gap.hi * b);
        let down = g(gap.lo * b);
        if r > up || (r == up && odd(q, e)) {
            q = q + 2.0lf * gap.hi;
        } else if r < -down || (r == -down && odd(q, e)) {
            q = q - 2.0lf * gap.lo;
        } else {
            break;
        }
    }
    return q;
}

// sqrt(x) correctly rounded, x >= 0 normal (a square root has no ties).
fn sqrt_rn(x: f64) -> f64 {
    if x == 0.0lf {
        return 0.0lf;
    }
    var s = sqrt(x);
    s = s + remainder(x, s, s) / (2.0lf * s);
    for (var i = 0; i < 4; i = i + 1) {
        // s is too small when x > (s + h)^2, i.e. r > 2 s h, and too large when x < (s - hd)^2,
        // i.e. r <= -2 s hd (the h^2 terms are below r's ulp).
        let r = remainder(x, s, s);
        let gap = half_gaps(s, exponent(s));
        if r > g(s * (2.0lf * gap.hi)) {
            s = s + 2.0lf * gap.hi;
        } else if r <= -g(s * (2.0lf * gap.lo)) {
            s = s - 2.0lf * gap.lo;
        } else {
            break;
        }
    }
    return s;
}

// The contract's e^x of an f32 (crates/model/src/exp.rs, `exp_f64`): the same multiplies and
// adds in the same order, each rounded alone; returns the f64 before the f32 rounding.
fn exp_f64(x0: f64) -> f64 {
    let x = min(max(x0, EXP_LO), EXP_HI);
    // The CPU rounds x * log2(e) to an integer, ties to even, by adding and removing 1.5 * 2^52.
    let k = round_even(g(x * EXP_LOG2E));
    let r = (x - g(k * EXP_LN2_HI)) - g(k * EXP_LN2_LO);
    var p = EXP_C13;
    p = g(p * r) + EXP_C12;
    p = g(p * r) + EXP_C11;
    p = g(p * r) + EXP_C10;
    p = g(p * r) + EXP_C9;
    p = g(p * r) + EXP_C8;
    p = g(p * r) + EXP_C7;
    p = g(p * r) + EXP_C6;
    p = g(p * r) + EXP_C5;
    p = g(p * r) + EXP_C4;
    p = g(p * r) + EXP_C3;
    p = g(p * r) + EXP_C2;
    p = g(p * r) + 1.0lf;
    p = g(p * r) + 1.0lf;
    return p * pow2(i32(k));
}

// f32 a / b (bits), correctly rounded: the f64 quotient rounded once more (53 >= 2 * 24 + 2).
fn div32(a_bits: u32, b_bits: u32) -> u32 {
    let a = widen(a_bits);
    let b = widen(b_bits);
    let q = div_rn(abs(a), abs(b));
    return narrow(select(q, -q, (a < 0.0lf) != (b < 0.0lf)));
}

// f32 a * b (bits), correctly rounded.
fn mul32(a_bits: u32, b_bits: u32) -> u32 {
    return narrow(widen(a_bits) * widen(b_bits));
}

// The contract's dequantization of one accumulator (i32 bits): (f32(acc) * sa) * sb, DESIGN §3.5.
fn dequant(acc: u32, sa: u32, sb: u32) -> u32 {
    return mul32(mul32(narrow(f64(bitcast<i32>(acc))), sa), sb);
}

// One int8 of the contract's row quantization: clamp(round_ties_even(v * inv), -127, 127), with
// `v * inv` an f32 product; `inv` infinite (a row whose max is below 127 / f32::MAX) maps 0 to 0
// (NaN as i8) and everything else to +-127, as the CPU does.
fn quantize1(v: u32, inv: u32) -> i32 {
    let p = widen(mul32(v, inv));
    if inv == 0x7f800000u {
        if (v & 0x7fffffffu) == 0u {
            return 0;
        }
        return select(127, -127, p < 0.0lf);
    }
    return i32(clamp(round_even(p), -127.0lf, 127.0lf));
}
