// DESIGN §3.8's float operations in WGSL, in the form that gives the CPU's bits, and probes of the
// adapter's own float arithmetic. Needs `SHADER_F64`. Every value crosses the bindings as bits
// (f32 as u32; f64 as its two u32 halves, low first), so no load or store can flush a subnormal.
//
// Three rules make a driver reproduce the contract:
// - No contraction. naga's SPIR-V carries no `NoContraction`, so a driver may fuse `a * b + c` into
//   one rounding. Every product that feeds an addition goes through `g`, a multiply by a 1.0 the
//   compiler cannot see (it comes from the uniform): `g(a * b) + c` may still be fused, but only
//   as `fma(a * b, 1, c)`, whose one rounding is that of the addition alone.
// - No subnormal through the float unit. `widen` and `narrow` build and take apart f32 subnormals
//   in integers; f32 arithmetic is done in f64 on widened operands and narrowed once, which is the
//   correctly rounded f32 result for +, -, * (53 >= 2 * 24 + 2).
// - No algebra on the driver's side. Drivers reassociate float operations that SPIR-V does not
//   mark exact (Mesa folds `(a + 2^52) - 2^52` to `a`): a rounding the CPU does by adding and
//   removing a constant is `round` (ties to even) here.
// - No division or square root of the driver's on trust (their precision is not specified):
//   `div_rn` and `sqrt_rn` take the driver's result as a first guess, refine it by one Newton step,
//   compute the exact remainder with Dekker's product (guarded: no fused multiply-add needed), and
//   step to the correctly rounded neighbour, ties to even. (The H100's own f64 division and square
//   root are off by an ulp on some inputs: the step is needed there.)

struct Params {
    // Lanes (elementwise entry points) or rows (row entry points).
    n: u32,
    // 1.0f32 as bits; `one` is its f64 widening, the value `g` multiplies by.
    one_bits: u32,
    // Shapes and scalars of the row entry points.
    d0: u32,
    d1: u32,
    d2: u32,
    d3: u32,
    d4: u32,
    d5: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> A: array<u32>;
@group(0) @binding(2) var<storage, read> B: array<u32>;
@group(0) @binding(3) var<storage, read> C: array<u32>;
@group(0) @binding(4) var<storage, read_write> O: array<u32>;

var<private> one: f64;

// A product rounded on its own (see the first rule).
fn g(x: f64) -> f64 {
    return x * one;
}

// 2^k for |k| <= 1023, exactly (products of powers of two).
fn pow2(k: i32) -> f64 {
    var s = 1.0lf;
    var b = select(2.0lf, 0.5lf, k < 0);
    var e = u32(abs(k));
    loop {
        if e == 0u {
            break;
        }
        if (e & 1u) != 0u {
            s = s * b;
        }
        b = b * b;
        e = e >> 1u;
    }
    return s;
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
    let m = round(a * pow2(149));
    return select(0u, 0x80000000u, v < 0.0lf) | u32(m);
}

struct Pair {
    hi: f64,
    lo: f64,
}

// The exponent e of a positive normal f64: 2^e <= a < 2^(e+1). (Bounded: an infinite or NaN `a`,
// which no caller passes, ends the loop with a wrong e rather than hanging the device.)
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
    let m = (q * pow2(-e)) * pow2(51);
    return fract(m) != 0.0lf;
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

// An f64 into O[2i] (low word) and O[2i + 1] (sign, exponent, top of the mantissa); v normal or 0.
fn store64(i: u32, v: f64) {
    let sign = select(0u, 0x80000000u, v < 0.0lf);
    let a = abs(v);
    if a == 0.0lf {
        O[2u * i] = 0u;
        O[2u * i + 1u] = sign;
        return;
    }
    let e = exponent(a);
    let m = (a * pow2(-e)) * pow2(52);
    let top = floor(m / 4294967296.0lf);
    O[2u * i] = u32(m - top * 4294967296.0lf);
    O[2u * i + 1u] = sign | (u32(e + 1023) << 20u) | (u32(top) & 0xfffffu);
}

// The contract's e^x of an f32 (crates/model/src/exp.rs, `exp_f64`): the same multiplies and
// adds in the same order, each rounded alone; returns the f64 before the f32 rounding.
fn exp_f64(x0: f64) -> f64 {
    let x = min(max(x0, EXP_LO), EXP_HI);
    // The CPU rounds x * log2(e) to an integer, ties to even, by adding and removing 1.5 * 2^52;
    // `round` is the same, and a compiler may not cancel it (Mesa's NIR folds `(a + C) - C` to
    // `a` in an instruction not marked exact, and naga marks none).
    let k = round(g(x * EXP_LOG2E));
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

fn lane(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * 256u;
}

fn start(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    one = f64(bitcast<f32>(P.one_bits));
    return lane(gid, groups);
}

// f64 from its two u32 halves (low first) in binding `buf` (0: A, 1: B, 2: C), exactly.
fn load64(buf: u32, i: u32) -> f64 {
    var lo: u32;
    var hi: u32;
    if buf == 0u {
        lo = A[2u * i];
        hi = A[2u * i + 1u];
    } else if buf == 1u {
        lo = B[2u * i];
        hi = B[2u * i + 1u];
    } else {
        lo = C[2u * i];
        hi = C[2u * i + 1u];
    }
    // (f64 subnormals, which the probes do not use, read as zero.)
    let e = i32((hi >> 20u) & 0x7ffu);
    let frac = f64(hi & 0xfffffu) * 4294967296.0lf + f64(lo);
    var v = 0.0lf;
    if e != 0 {
        v = (frac * pow2(-52) + 1.0lf) * pow2(e - 1023);
    }
    return select(v, -v, (hi & 0x80000000u) != 0u);
}

// --- The contract's operations (asserted equal to the CPU's bits) ---

// e^x of f32 bits -> f32 bits.
@compute @workgroup_size(256)
fn exp_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(exp_f64(widen(A[i])));
}

// f32 a * b + c, each rounded alone.
@compute @workgroup_size(256)
fn mul_add_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    let p = widen(narrow(widen(A[i]) * widen(B[i])));
    O[i] = narrow(p + widen(C[i]));
}

// f64 a * b + c, each rounded alone, narrowed to f32.
@compute @workgroup_size(256)
fn mul_add_f64_guarded(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(g(load64(0u, i) * load64(1u, i)) + load64(2u, i));
}

// f64 a / b and sqrt(a), correctly rounded (a >= 0, b > 0), as f64 words.
@compute @workgroup_size(256)
fn div_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    store64(i, div_rn(load64(0u, i), load64(1u, i)));
}

@compute @workgroup_size(256)
fn sqrt_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    store64(i, sqrt_rn(load64(0u, i)));
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

@compute @workgroup_size(256)
fn div_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = div32(A[i], B[i]);
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
    return i32(clamp(round(p), -127.0lf, 127.0lf));
}

// Where a row kernel's usual output lies in O, for rows of n values: the values (rows * n), the
// packed rows (rows * rw words), the scales (rows); `end` is the first word after them.
struct RowLayout {
    q0: u32,
    s0: u32,
    end: u32,
}

fn row_layout(n: u32, rw: u32) -> RowLayout {
    let q0 = P.n * n;
    let s0 = q0 + P.n * rw;
    return RowLayout(q0, s0, s0 + P.n);
}

var<workgroup> wg_inv: u32;
var<workgroup> wg_max: array<u32, 256>;

// The contract's quantization of one row held in O[y .. y + h] by a workgroup, each thread having
// folded max |y| of its columns into `m`: four int8 a word into O[q .. q + rw] (zero-padded), the
// scale into O[s] (m / 127; 0 and a row of zeros below f32::MIN_POSITIVE). Non-finite rows are
// refused before they get here. Called by every thread of the workgroup.
fn quantize_row(m: u32, y: u32, h: u32, q: u32, rw: u32, s: u32, li: u32) {
    wg_max[li] = m;
    storageBarrier();
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride = stride >> 1u) {
        if li < stride {
            wg_max[li] = max(wg_max[li], wg_max[li + stride]);
        }
        workgroupBarrier();
    }
    let mb = wg_max[0];
    // Every thread has read the max before any can start another row's reduction.
    workgroupBarrier();
    let tiny = mb < 0x00800000u;
    var qinv = 0u;
    if !tiny {
        qinv = div32(0x42fe0000u, mb);
    }
    if li == 0u {
        var scale = 0u;
        if !tiny {
            scale = div32(mb, 0x42fe0000u);
        }
        O[s] = scale;
    }
    for (var wd = li; wd < rw; wd = wd + 256u) {
        var word = 0u;
        for (var b = 0u; b < 4u; b = b + 1u) {
            let j = 4u * wd + b;
            if j < h && !tiny {
                word = word | ((u32(quantize1(O[y + j], qinv)) & 0xffu) << (8u * b));
            }
        }
        O[q + wd] = word;
    }
}

// The residual stream after a product, then the next product's operand, one workgroup a row t:
//   x' = x + ((f32(acc) * sa) * sb)            (dequantization, then the residual addition)
//   y  = w * (x' * f32(1 / sqrt(mean(x'^2) + eps)))   (RMSNorm, the sum in f64 in column order)
//   q, s = the contract's quantization of y (s = m / 127, inv = 127 / m, m = max |y|)
// A: x (T*H f32 bits), then acc (T*H i32). B: sa (T), sb (H), w (H). d0 = H, d1 = eps's bits,
// d2 = RW, the u32 words of a packed row (the GEMM kernel's padded layout).
// O: x' (T*H) | q (T*RW words, four int8 a word) | s (T) | y (T*H, scratch).
@compute @workgroup_size(256)
fn residual_norm_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let h = P.d0;
    let rw = P.d2;
    let t = wid.x;
    let row = t * h;
    let out = row_layout(h, rw);
    let y0 = out.end;
    let sa = B[t];
    for (var j = li; j < h; j = j + 256u) {
        let c = dequant(A[rows * h + row + j], sa, B[rows + j]);
        O[row + j] = narrow(widen(A[row + j]) + widen(c));
    }
    storageBarrier();
    if li == 0u {
        var sum = 0.0lf;
        for (var j = 0u; j < h; j = j + 1u) {
            let v = widen(O[row + j]);
            // v * v is exact in f64: fused or not, one rounding (the addition's).
            sum = sum + v * v;
        }
        let ms = div_rn(sum, f64(h));
        wg_inv = narrow(div_rn(1.0lf, sqrt_rn(ms + widen(P.d1))));
    }
    workgroupBarrier();
    let inv = wg_inv;
    var m = 0u;
    for (var j = li; j < h; j = j + 256u) {
        let y = mul32(B[rows + h + j], mul32(O[row + j], inv));
        O[y0 + row + j] = y;
        m = max(m, y & 0x7fffffffu);
    }
    quantize_row(m, y0 + row, h, out.q0 + t * rw, rw, out.s0 + t, li);
}

// RMSNorm's scale of a row, f32(1 / sqrt(ms + eps)) in f64, from ms's f64 words and eps's f32 bits.
@compute @workgroup_size(256)
fn inv_rms(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(div_rn(1.0lf, sqrt_rn(load64(0u, i) + widen(B[i]))));
}

// --- Probes of the adapter's own arithmetic (reported, not relied on) ---

// f32 a * b + c as written: a driver may fuse it.
@compute @workgroup_size(256)
fn probe_mul_add_f32_plain(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = bitcast<u32>(bitcast<f32>(A[i]) * bitcast<f32>(B[i]) + bitcast<f32>(C[i]));
}

// f64 a * b + c as written, narrowed to f32.
@compute @workgroup_size(256)
fn probe_mul_add_f64_plain(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(load64(0u, i) * load64(1u, i) + load64(2u, i));
}

// f32 a * b in the float unit (subnormal results may be flushed).
@compute @workgroup_size(256)
fn probe_mul_f32_plain(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = bitcast<u32>(bitcast<f32>(A[i]) * bitcast<f32>(B[i]));
}

// f64 a / b and sqrt(a), narrowed to f32 by `narrow` (an f64 that is off by an ulp shows up
// only near an f32 rounding boundary; the inputs are chosen there).
@compute @workgroup_size(256)
fn probe_div_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(load64(0u, i) / load64(1u, i));
}

@compute @workgroup_size(256)
fn probe_sqrt_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = narrow(sqrt(load64(0u, i)));
}

// f64 -> f32 by the driver's conversion alone (subnormal results may be flushed).
@compute @workgroup_size(256)
fn probe_narrow_hw(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = bitcast<u32>(f32(load64(0u, i)));
}

// Attention's scores after their product, one workgroup a row t of n keys:
//   s = ((f32(acc) * sa) * sb) * scale on the row's visible keys [lo, hi), 0 elsewhere
//   p = the contract's softmax of the visible run (max, e = exp(s - max), the f64 sum left to
//       right, inv = f32(1 / sum), p = e * inv), masked entries exactly 0
//   then p quantized as the next product's operand.
// A: acc (T*n i32). B: sa (T), sb (n), lo (T), hi (T). d0 = n, d1 = scale's bits, d2 = RW.
// O: p (T*n) | q (T*RW) | scales (T).
@compute @workgroup_size(256)
fn scores_softmax_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let n = P.d0;
    let rw = P.d2;
    let t = wid.x;
    let row = t * n;
    let out = row_layout(n, rw);
    let sa = B[t];
    let lo = B[rows + n + t];
    let hi = min(B[rows + n + rows + t], n);
    var mx = 0xff800000u;
    for (var j = li; j < n; j = j + 256u) {
        var v = 0u;
        if j >= lo && j < hi {
            v = mul32(dequant(A[row + j], sa, B[rows + j]), P.d1);
            if widen(v) > widen(mx) {
                mx = v;
            }
        }
        O[row + j] = v;
    }
    wg_max[li] = mx;
    storageBarrier();
    workgroupBarrier();
    // The row's max (any order gives the same value; +0 and -0 give the same exp).
    if li == 0u {
        var best = 0xff800000u;
        for (var i = 0u; i < 256u; i = i + 1u) {
            if widen(wg_max[i]) > widen(best) {
                best = wg_max[i];
            }
        }
        wg_inv = best;
    }
    workgroupBarrier();
    let best = wg_inv;
    let live = lo < hi && best != 0xff800000u;
    for (var j = li; j < n; j = j + 256u) {
        var e = 0u;
        if live && j >= lo && j < hi {
            e = narrow(exp_f64(widen(narrow(widen(O[row + j]) - widen(best)))));
        }
        O[row + j] = e;
    }
    storageBarrier();
    workgroupBarrier();
    if li == 0u && live {
        var sum = 0.0lf;
        for (var j = lo; j < hi; j = j + 1u) {
            sum = sum + widen(O[row + j]);
        }
        wg_inv = narrow(div_rn(1.0lf, sum));
    }
    workgroupBarrier();
    let inv = wg_inv;
    var m = 0u;
    for (var j = li; j < n; j = j + 256u) {
        if live && j >= lo && j < hi {
            let p = mul32(O[row + j], inv);
            O[row + j] = p;
            m = max(m, p & 0x7fffffffu);
        }
    }
    quantize_row(m, row, n, out.q0 + t * rw, rw, out.s0 + t, li);
}

// The MLP's activation after the gate/up product, one workgroup a row t:
//   g, u = (f32(acc) * sa) * sb for the row's first and second I columns
//   a = g / (1 + exp(-g)) * u       (SiLU, each step an f32 operation, exp the contract's)
//   then a quantized as the down product's operand.
// A: acc (T*2I i32). B: sa (T), sb (2I). d0 = I, d2 = RW. O: a (T*I) | q (T*RW) | scales (T).
@compute @workgroup_size(256)
fn gate_up_silu_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let n = P.d0;
    let rw = P.d2;
    let t = wid.x;
    let out = row_layout(n, rw);
    let sa = B[t];
    var m = 0u;
    for (var j = li; j < n; j = j + 256u) {
        let g = dequant(A[2u * t * n + j], sa, B[rows + j]);
        let u = dequant(A[2u * t * n + n + j], sa, B[rows + n + j]);
        let e = narrow(exp_f64(-widen(g)));
        let a = mul32(div32(g, narrow(1.0lf + widen(e))), u);
        O[t * n + j] = a;
        m = max(m, a & 0x7fffffffu);
    }
    quantize_row(m, t * n, n, out.q0 + t * rw, rw, out.s0 + t, li);
}

// After the q/k/v product, one workgroup a token t (W = (H + 2G) * hd columns):
//   c = (f32(acc) * sa) * sb (+ bias, where the model has one)
//   RoPE on each query and key head: x1 * cos - x2 * sin, x2 * cos + x1 * sin (f32, from the
//   CPU's cos/sin tables: `daisy_model::rope_cos_sin`)
//   each query head's and key head's row of hd quantized on its own (the scores' A and B), the
//   value heads kept as f32 for their transposed quantization over every key.
// A: acc (T*W i32). B: sa (T) | sb (W) | bias (W) | cos (T*hd/2) | sin (T*hd/2).
// d0 = H, d1 = G, d2 = hd, d3 = 1 with a bias, d4 = RW (words of a packed hd row).
// O: Q's q ([h][t] rows, H*T*RW) | Q's scales (H*T) | K's q ([g][t], G*T*RW) | K's scales (G*T) |
//    V ([g][t][hd] f32) | scratch (T*(H+G)*hd).
@compute @workgroup_size(256)
fn qkv_rope_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let heads = P.d0;
    let kv = P.d1;
    let hd = P.d2;
    let rw = P.d4;
    let half = hd / 2u;
    let qk = (heads + kv) * hd;
    let w = qk + kv * hd;
    let t = wid.x;
    let qs0 = heads * rows * rw;
    let kq0 = qs0 + heads * rows;
    let ks0 = kq0 + kv * rows * rw;
    let v0 = ks0 + kv * rows;
    let scr = v0 + kv * rows * hd + t * qk;
    let sa = B[t];
    for (var j = li; j < w; j = j + 256u) {
        var c = dequant(A[t * w + j], sa, B[rows + j]);
        if P.d3 == 1u {
            c = narrow(widen(c) + widen(B[rows + w + j]));
        }
        if j < qk {
            O[scr + j] = c;
        } else {
            let jj = j - qk;
            O[v0 + ((jj / hd) * rows + t) * hd + jj % hd] = c;
        }
    }
    storageBarrier();
    workgroupBarrier();
    let cos0 = rows + 2u * w + t * half;
    let sin0 = rows + 2u * w + rows * half + t * half;
    for (var idx = li; idx < (heads + kv) * half; idx = idx + 256u) {
        let p = scr + (idx / half) * hd + idx % half;
        let i = idx % half;
        let x1 = O[p];
        let x2 = O[p + half];
        let c = B[cos0 + i];
        let s = B[sin0 + i];
        O[p] = narrow(widen(mul32(x1, c)) - widen(mul32(x2, s)));
        O[p + half] = narrow(widen(mul32(x2, c)) + widen(mul32(x1, s)));
    }
    storageBarrier();
    workgroupBarrier();
    for (var head = 0u; head < heads + kv; head = head + 1u) {
        let p = scr + head * hd;
        var m = 0u;
        for (var j = li; j < hd; j = j + 256u) {
            m = max(m, O[p + j] & 0x7fffffffu);
        }
        if head < heads {
            quantize_row(m, p, hd, (head * rows + t) * rw, rw, qs0 + head * rows + t, li);
        } else {
            let g = head - heads;
            quantize_row(m, p, hd, kq0 + (g * rows + t) * rw, rw, ks0 + g * rows + t, li);
        }
    }
}

// Vᵀ for the values' product: one row per kv head g and value channel c over the nk keys present,
// quantized on its own. One workgroup a row r = g * hd + c.
// A: V ([g][key][c] f32, G*nk*hd). d0 = nk, d1 = hd, d2 = RW (words of a packed nk row).
// O: q (G*hd*RW) | scales (G*hd) | scratch (G*hd*nk).
@compute @workgroup_size(256)
fn values_transposed_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let nk = P.d0;
    let hd = P.d1;
    let rw = P.d2;
    let r = wid.x;
    let g = r / hd;
    let c = r % hd;
    let scr = rows * rw + rows + r * nk;
    var m = 0u;
    for (var j = li; j < nk; j = j + 256u) {
        let v = A[(g * nk + j) * hd + c];
        O[scr + j] = v;
        m = max(m, v & 0x7fffffffu);
    }
    quantize_row(m, scr, nk, r * rw, rw, rows * rw + r, li);
}

// The attention output for the o product, one workgroup a token t: head h's values product
// dequantized, (f32(acc) * sa) * sb with sa the probability row's scale and sb the Vᵀ row's,
// placed at columns h * hd.., and the row of H * hd quantized.
// A: acc ([h][t][c] i32). B: sa ([h][t]) | sb ([g][c]). d0 = H, d1 = G, d2 = hd, d3 = RW.
// O: out (T*H*hd f32) | q (T*RW) | scales (T).
@compute @workgroup_size(256)
fn attention_out_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    one = f64(bitcast<f32>(P.one_bits));
    let rows = P.n;
    let heads = P.d0;
    let kv = P.d1;
    let hd = P.d2;
    let rw = P.d3;
    let qd = heads * hd;
    let group = heads / kv;
    let t = wid.x;
    var m = 0u;
    for (var j = li; j < qd; j = j + 256u) {
        let h = j / hd;
        let c = j % hd;
        let v = dequant(A[(h * rows + t) * hd + c], B[h * rows + t], B[heads * rows + (h / group) * hd + c]);
        O[t * qd + j] = v;
        m = max(m, v & 0x7fffffffu);
    }
    let out = row_layout(qd, rw);
    quantize_row(m, t * qd, qd, out.q0 + t * rw, rw, out.s0 + t, li);
}
