// The bindings and entry points of `FloatLab` (`floats.rs`): the library's operations over
// bit-typed buffers, and probes of the adapter's own arithmetic.

struct Params {
    // Lanes (elementwise entry points) or rows (row entry points).
    n: u32,
    // 1.0f32 as bits; `one` is its f64 widening, the value `g` tests (never negative).
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

// One int8 of the row quantization from v's bits (A) and the row's 127 / max (B), as i32 bits.
@compute @workgroup_size(256)
fn quantize_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = bitcast<u32>(quantize1(A[i], B[i]));
}

@compute @workgroup_size(256)
fn div_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = start(gid, groups);
    if i >= P.n {
        return;
    }
    O[i] = div32(A[i], B[i]);
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
