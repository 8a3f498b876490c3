// The steps between a Llama layer's integer products, on the device with the CPU's bits (the
// library in `floats.wgsl` says how): `layers.rs` records a layer as these kernels and the GEMM
// kernel's dispatches, every operand in device buffers. One workgroup of 256 threads a row; a
// dispatch of more rows than one dimension allows folds them into y. Every value is bits: f32 as
// u32, the GEMM's accumulators as i32, int8 operands four to a word in the GEMM kernel's padded rows.
//
// Bindings: `acc` the GEMM kernel's outputs; `res` what a pass only reads (norm weights, biases,
// weight scales, RoPE's tables); `fl` the residual stream, activation scales and scratch rows;
// `ops` the packed int8 operands of the next products; `kq` the KV cache's packed key rows, `kf`
// its key scales and f32 values. P.p* are word offsets into those bindings and shapes, named in
// each kernel's comment.

struct L {
    // Rows of the dispatch.
    n: u32,
    // 1.0f32 as bits (`one`, the value `g` tests: never negative).
    one_bits: u32,
    p0: u32,
    p1: u32,
    p2: u32,
    p3: u32,
    p4: u32,
    p5: u32,
    p6: u32,
    p7: u32,
    p8: u32,
    p9: u32,
    p10: u32,
    p11: u32,
    p12: u32,
    p13: u32,
    p14: u32,
    p15: u32,
    p16: u32,
    p17: u32,
    p18: u32,
    p19: u32,
    p20: u32,
    p21: u32,
    p22: u32,
    p23: u32,
    p24: u32,
    p25: u32,
}

@group(0) @binding(0) var<uniform> P: L;
@group(0) @binding(1) var<storage, read_write> acc: array<i32>;
@group(0) @binding(2) var<storage, read> res: array<u32>;
@group(0) @binding(3) var<storage, read_write> fl: array<u32>;
@group(0) @binding(4) var<storage, read_write> ops: array<u32>;
@group(0) @binding(5) var<storage, read_write> kq: array<u32>;
@group(0) @binding(6) var<storage, read_write> kf: array<u32>;

var<workgroup> wg_u: u32;
var<workgroup> wg_max: array<u32, 256>;
// A tile of a row widened to f64 (squared where asked), for the one thread that adds it in order.
var<workgroup> wg_sum: array<f64, 1024>;
// Per head of a row (q/k/v): its max |x| (atomic), then its quantization's 127 / max.
var<workgroup> wg_head_max: array<atomic<u32>, 256>;
var<workgroup> wg_head_inv: array<u32, 256>;

// The f64 sum, left to right (the contract's order), of fl[base + j] (or of its square) for j in
// [lo, hi). Every thread widens (and squares: exact in f64) a tile of the row into workgroup
// memory; the thread that adds (thread 0, where the result is valid) then only loads and adds.
// Called by every thread of the workgroup.
fn ordered_sum(base: u32, lo: u32, hi: u32, squares: bool, li: u32) -> f64 {
    var sum = 0.0lf;
    for (var t0 = lo; t0 < hi; t0 = t0 + 1024u) {
        let n = min(1024u, hi - t0);
        workgroupBarrier();
        for (var i = li; i < n; i = i + 256u) {
            var v = widen(fl[base + t0 + i]);
            if squares {
                v = v * v;
            }
            wg_sum[i] = v;
        }
        workgroupBarrier();
        if li == 0u {
            var i = 0u;
            for (; i + 4u <= n; i = i + 4u) {
                let v0 = wg_sum[i];
                let v1 = wg_sum[i + 1u];
                let v2 = wg_sum[i + 2u];
                let v3 = wg_sum[i + 3u];
                sum = sum + v0;
                sum = sum + v1;
                sum = sum + v2;
                sum = sum + v3;
            }
            for (; i < n; i = i + 1u) {
                sum = sum + wg_sum[i];
            }
        }
    }
    return sum;
}

// The row a workgroup owns (dispatches fold rows past 65535 into y).
fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    one = f64(bitcast<f32>(P.one_bits));
    return wid.x + wid.y * nwg.x;
}

// A pass's chunks (attention is chunk by chunk: each attends to the keys before it and its own).
// `fl[rtab + r]` is row r's chunk k; `fl[ctab + 4k ..]` chunk k's first row, rows, first position
// and keys (first position + rows). Attention's operands are laid out chunk after chunk, each with
// TQ (the most rows a chunk has) rows a head and NK (the pass's keys) keys a row.
struct Chunk {
    first: u32,
    rows: u32,
    pos: u32,
    nk: u32,
}

fn chunk_at(ctab: u32, k: u32) -> Chunk {
    let c = ctab + 4u * k;
    return Chunk(fl[c], fl[c + 1u], fl[c + 2u], fl[c + 3u]);
}

// Row r's chunk k and its row i within it.
struct ChunkRow {
    k: u32,
    i: u32,
}

fn chunk_of_row(rtab: u32, ctab: u32, r: u32) -> ChunkRow {
    let k = fl[rtab + r];
    return ChunkRow(k, r - chunk_at(ctab, k).first);
}

fn accb(i: u32) -> u32 {
    return bitcast<u32>(acc[i]);
}

fn non_finite(v: u32) -> bool {
    return (v & 0x7f800000u) == 0x7f800000u;
}

// What the contract's quantization of a row needs once its max |y| is known.
struct Quant {
    // 127 / max as f32 bits (the multiplier of every value).
    inv: u32,
    // Max below f32::MIN_POSITIVE: a row of zeros, scale 0.
    tiny: bool,
    max: u32,
}

// The largest of every thread's `m`, for every thread. Called by every thread of the workgroup.
fn workgroup_max(m: u32, li: u32) -> u32 {
    wg_max[li] = m;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride = stride >> 1u) {
        if li < stride {
            wg_max[li] = max(wg_max[li], wg_max[li + stride]);
        }
        workgroupBarrier();
    }
    let mb = wg_max[0];
    // Every thread has read the max before any can start another reduction.
    workgroupBarrier();
    return mb;
}

// The row's max |y| from every thread's `m` (f32 magnitudes as bits order as unsigned integers).
// Called by every thread of the workgroup; the row's values must be visible to all (a storage
// barrier before).
fn row_quant(m: u32, li: u32) -> Quant {
    let mb = workgroup_max(m, li);
    let tiny = mb < 0x00800000u;
    var inv = 0u;
    if !tiny {
        inv = div32(0x42fe0000u, mb);
    }
    return Quant(inv, tiny, mb);
}

// The scale of a quantized row: max / 127 (0 for a tiny row).
fn row_scale(q: Quant) -> u32 {
    if q.tiny {
        return 0u;
    }
    return div32(q.max, 0x42fe0000u);
}

// Packed word `wd` of the quantized row of `h` values at fl[y ..]: four int8, zero past h.
fn pack4(y: u32, h: u32, wd: u32, q: Quant) -> u32 {
    var word = 0u;
    if q.tiny {
        return 0u;
    }
    for (var b = 0u; b < 4u; b = b + 1u) {
        let j = 4u * wd + b;
        if j < h {
            word = word | ((u32(quantize1(fl[y + j], q.inv)) & 0xffu) << (8u * b));
        }
    }
    return word;
}

// The contract's quantization of the row of h values at fl[y ..], whose max |y| every thread folded
// into its `m`: packed into ops[q .. q + rw] (zero-padded), the scale into fl[s]. Called by every
// thread of the workgroup after it wrote its values.
fn store_quantized(m: u32, y: u32, h: u32, q: u32, rw: u32, s: u32, li: u32) {
    storageBarrier();
    let quant = row_quant(m, li);
    if li == 0u {
        fl[s] = row_scale(quant);
    }
    for (var wd = li; wd < rw; wd = wd + 256u) {
        ops[q + wd] = pack4(y, h, wd, quant);
    }
}

// The residual stream after a product, then (with p8 = 1) the next product's operand, one
// workgroup a row t:
//   x' = x + ((f32(acc) * sa) * sb)            (with p3 = 1: dequantization, then the addition)
//   y  = w * (x' * f32(1 / sqrt(mean(x'^2) + eps)))   (RMSNorm, the sum in f64 in column order)
//   y quantized: packed into ops, its scale into fl.
// p0 H, p1 eps bits, p2 RW (words of a packed row of H), p3 add, p4 x (fl), p5 acc, p6 sa (fl),
// p7 sb (res), p8 norm, p9 w (res), p10 y (fl scratch), p11 q (ops), p12 scales (fl),
// p13 the non-finite flag (fl): a non-finite x' leaves its bits there.
@compute @workgroup_size(256)
fn residual_norm_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = row_of(wid, nwg);
    if t >= P.n {
        return;
    }
    let h = P.p0;
    let rw = P.p2;
    let row = P.p4 + t * h;
    if P.p3 == 1u {
        let sa = fl[P.p6 + t];
        for (var j = li; j < h; j = j + 256u) {
            let c = dequant(accb(P.p5 + t * h + j), sa, res[P.p7 + j]);
            let v = narrow(widen(fl[row + j]) + widen(c));
            fl[row + j] = v;
            if non_finite(v) {
                fl[P.p13] = v;
            }
        }
    }
    if P.p8 == 0u {
        return;
    }
    storageBarrier();
    let sum = ordered_sum(row, 0u, h, true, li);
    if li == 0u {
        let ms = div_rn(sum, f64(h));
        wg_u = narrow(div_rn(1.0lf, sqrt_rn(ms + widen(P.p1))));
    }
    workgroupBarrier();
    let inv = wg_u;
    let y = P.p10 + t * h;
    var m = 0u;
    for (var j = li; j < h; j = j + 256u) {
        let v = mul32(res[P.p9 + j], mul32(fl[row + j], inv));
        fl[y + j] = v;
        m = max(m, v & 0x7fffffffu);
    }
    store_quantized(m, y, h, P.p11 + t * rw, rw, P.p12 + t, li);
}

// After the q/k/v product, one workgroup a token t (W = (H + 2G) * hd columns):
//   c = (f32(acc) * sa) * sb (+ bias, where the model has one)
//   RoPE on each query and key head: x1 * cos - x2 * sin, x2 * cos + x1 * sin (f32, from the
//   CPU's cos/sin tables: `daisy_model::rope_cos_sin`)
//   each query head's row of hd quantized on its own into ops ([h][t] rows), each key head's
//   into the cache at position pos0 + t, the values kept as f32 in the cache.
// p0 H, p1 G, p2 hd, p3 bias, p4 RW (words of a packed hd row), p5 acc, p6 sa (fl), p7 sb (res),
// p8 bias (res), p9 cos (fl, T * hd/2; sin follows), p10 scratch (fl, T * (H + G) * hd),
// p11 Q (ops, [chunk][h][TQ] rows), p12 Q's scales (fl, likewise), p13 K (kq, [g][cap] rows),
// p14 K's scales (kf, [g][cap]), p15 V (kf, [g][cap][hd]), p16 cap, p17 pos0, p18 rtab, p19 ctab,
// p20 TQ.
@compute @workgroup_size(256)
fn qkv_rope_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = row_of(wid, nwg);
    let rows = P.n;
    if t >= rows {
        return;
    }
    let heads = P.p0;
    let kv = P.p1;
    let hd = P.p2;
    let rw = P.p4;
    let cap = P.p16;
    let pos = P.p17 + t;
    let half = hd / 2u;
    let qk = (heads + kv) * hd;
    let w = qk + kv * hd;
    let scr = P.p10 + t * qk;
    let sa = fl[P.p6 + t];
    for (var j = li; j < w; j = j + 256u) {
        var c = dequant(accb(P.p5 + t * w + j), sa, res[P.p7 + j]);
        if P.p3 == 1u {
            c = narrow(widen(c) + widen(res[P.p8 + j]));
        }
        if j < qk {
            fl[scr + j] = c;
        } else {
            let jj = j - qk;
            kf[P.p15 + ((jj / hd) * cap + pos) * hd + jj % hd] = c;
        }
    }
    storageBarrier();
    workgroupBarrier();
    let cos0 = P.p9 + t * half;
    let sin0 = P.p9 + rows * half + t * half;
    for (var idx = li; idx < (heads + kv) * half; idx = idx + 256u) {
        let p = scr + (idx / half) * hd + idx % half;
        let i = idx % half;
        let x1 = fl[p];
        let x2 = fl[p + half];
        let c = fl[cos0 + i];
        let s = fl[sin0 + i];
        fl[p] = narrow(widen(mul32(x1, c)) - widen(mul32(x2, s)));
        fl[p + half] = narrow(widen(mul32(x2, c)) + widen(mul32(x1, s)));
    }
    // Every head of the row quantized at once: its max |x| (atomic), its 127 / max and scale (a
    // thread a head), then every packed word.
    let nh = heads + kv;
    let cr = chunk_of_row(P.p18, P.p19, t);
    atomicStore(&wg_head_max[li], 0u);
    storageBarrier();
    workgroupBarrier();
    for (var idx = li; idx < nh * hd; idx = idx + 256u) {
        atomicMax(&wg_head_max[idx / hd], fl[scr + idx] & 0x7fffffffu);
    }
    workgroupBarrier();
    for (var head = li; head < nh; head = head + 256u) {
        let mb = atomicLoad(&wg_head_max[head]);
        let tiny = mb < 0x00800000u;
        var inv = 0u;
        if !tiny {
            inv = div32(0x42fe0000u, mb);
        }
        wg_head_inv[head] = inv;
        let scale = row_scale(Quant(inv, tiny, mb));
        if head < heads {
            fl[P.p12 + (cr.k * heads + head) * P.p20 + cr.i] = scale;
        } else {
            kf[P.p14 + (head - heads) * cap + pos] = scale;
        }
    }
    workgroupBarrier();
    for (var wi = li; wi < nh * rw; wi = wi + 256u) {
        let head = wi / rw;
        let wd = wi % rw;
        let mb = atomicLoad(&wg_head_max[head]);
        let word = pack4(scr + head * hd, hd, wd, Quant(wg_head_inv[head], mb < 0x00800000u, mb));
        if head < heads {
            ops[P.p11 + ((cr.k * heads + head) * P.p20 + cr.i) * rw + wd] = word;
        } else {
            kq[P.p13 + ((head - heads) * cap + pos) * rw + wd] = word;
        }
    }
}

// Vᵀ for the values' product, chunk by chunk: one row per chunk k, kv head g and value channel c
// over the chunk's nk keys, quantized on its own into a row of NK keys (zero past nk). One
// workgroup a row r = (k * G + g) * hd + c.
// p0 NK, p1 hd, p2 RW (words of a packed NK row), p3 V (kf, [g][cap][hd]), p4 cap,
// p5 scratch (fl, rows * NK), p6 q (ops), p7 scales (fl), p8 G * hd, p9 ctab.
@compute @workgroup_size(256)
fn values_transposed_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg);
    if r >= P.n {
        return;
    }
    let hd = P.p1;
    let rw = P.p2;
    let k = r / P.p8;
    let rr = r % P.p8;
    let nk = chunk_at(P.p9, k).nk;
    let g = rr / hd;
    let c = rr % hd;
    let scr = P.p5 + r * P.p0;
    var m = 0u;
    for (var j = li; j < nk; j = j + 256u) {
        let v = kf[P.p3 + (g * P.p4 + j) * hd + c];
        fl[scr + j] = v;
        m = max(m, v & 0x7fffffffu);
    }
    store_quantized(m, scr, nk, P.p6 + r * rw, rw, P.p7 + r, li);
}

// Attention's scores after their product, one workgroup a row r = (k * H + h) * TQ + t (chunk k,
// query head h, the chunk's token t at position pos_k + t; rows past the chunk's skipped) of NK
// keys:
//   s = ((f32(acc) * sa) * sb) * scale on the row's visible keys [lo, hi), 0 elsewhere
//   p = the contract's softmax of the visible run (max, e = exp(s - max), the f64 sum left to
//       right, inv = f32(1 / sum), p = e * inv), masked entries exactly 0
//   then p quantized as the values product's operand.
// hi = pos_k + t + 1; lo = pos_k + t + 1 - window (saturating; 0 without a window).
// p0 NK, p1 scale bits, p2 RW (words of a packed NK row), p3 TQ, p4 ctab, p5 window (0: none),
// p6 acc ([k][h][TQ][NK]), p7 sa (fl, Q's scales [k][h][TQ]), p8 sb (kf, K's scales [g][cap]),
// p9 heads per kv head, p10 cap, p11 scratch (fl, rows * NK), p12 q (ops), p13 scales (fl),
// p14 H.
@compute @workgroup_size(256)
fn scores_softmax_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg);
    if r >= P.n {
        return;
    }
    let nk = P.p0;
    let rw = P.p2;
    let t = r % P.p3;
    let head = (r / P.p3) % P.p14;
    let c = chunk_at(P.p4, r / (P.p3 * P.p14));
    if t >= c.rows {
        return;
    }
    let g = head / P.p9;
    let qpos = c.pos + t;
    let hi = min(qpos + 1u, nk);
    var lo = 0u;
    if P.p5 > 0u && qpos + 1u > P.p5 {
        lo = qpos + 1u - P.p5;
    }
    let row = P.p11 + r * nk;
    let sa = fl[P.p7 + r];
    let sb0 = P.p8 + g * P.p10;
    var mx = 0xff800000u;
    for (var j = li; j < nk; j = j + 256u) {
        var v = 0u;
        if j >= lo && j < hi {
            v = mul32(dequant(accb(P.p6 + r * nk + j), sa, kf[sb0 + j]), P.p1);
            if widen(v) > widen(mx) {
                mx = v;
            }
        }
        fl[row + j] = v;
    }
    wg_max[li] = mx;
    storageBarrier();
    workgroupBarrier();
    // The row's max (any order gives the same value; +0 and -0 give the same exp).
    for (var stride = 128u; stride > 0u; stride = stride >> 1u) {
        if li < stride && widen(wg_max[li + stride]) > widen(wg_max[li]) {
            wg_max[li] = wg_max[li + stride];
        }
        workgroupBarrier();
    }
    let best = wg_max[0];
    workgroupBarrier();
    let live = lo < hi && best != 0xff800000u;
    for (var j = li; j < nk; j = j + 256u) {
        var e = 0u;
        if live && j >= lo && j < hi {
            e = narrow(exp_f64(widen(narrow(widen(fl[row + j]) - widen(best)))));
        }
        fl[row + j] = e;
    }
    storageBarrier();
    let sum = ordered_sum(row, lo, hi, false, li);
    if li == 0u && live {
        wg_u = narrow(div_rn(1.0lf, sum));
    }
    workgroupBarrier();
    let inv = wg_u;
    var m = 0u;
    for (var j = li; j < nk; j = j + 256u) {
        if live && j >= lo && j < hi {
            let p = mul32(fl[row + j], inv);
            fl[row + j] = p;
            m = max(m, p & 0x7fffffffu);
        }
    }
    store_quantized(m, row, nk, P.p12 + r * rw, rw, P.p13 + r, li);
}

// The attention output for the o product, one workgroup a token t (of the pass; in chunk k at row
// i): head h's values product dequantized, (f32(acc) * sa) * sb with sa the probability row's scale
// and sb the chunk's Vᵀ row's, placed at columns h * hd.., and the row of H * hd quantized.
// p0 H, p1 G, p2 hd, p3 RW (words of a packed H * hd row), p4 acc ([k][h][TQ][c]), p5 sa (fl,
// [k][h][TQ]), p6 sb (fl, [k][g][c]), p7 y (fl scratch, T * H * hd), p8 q (ops), p9 scales (fl),
// p10 rtab, p11 ctab, p12 TQ.
@compute @workgroup_size(256)
fn attention_out_quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = row_of(wid, nwg);
    let rows = P.n;
    if t >= rows {
        return;
    }
    let heads = P.p0;
    let hd = P.p2;
    let rw = P.p3;
    let qd = heads * hd;
    let group = heads / P.p1;
    let y = P.p7 + t * qd;
    let cr = chunk_of_row(P.p10, P.p11, t);
    var m = 0u;
    for (var j = li; j < qd; j = j + 256u) {
        let h = j / hd;
        let c = j % hd;
        let hr = (cr.k * heads + h) * P.p12 + cr.i;
        let v = dequant(accb(P.p4 + hr * hd + c), fl[P.p5 + hr], fl[P.p6 + (cr.k * P.p1 + h / group) * hd + c]);
        fl[y + j] = v;
        m = max(m, v & 0x7fffffffu);
    }
    store_quantized(m, y, qd, P.p8 + t * rw, rw, P.p9 + t, li);
}

// The MLP's activation after the gate/up product, one workgroup a segment of 256 values of a
// token's row (r = t * S + s, S = p8 segments a row; a decode row spreads over many workgroups):
//   g, u = (f32(acc) * sa) * sb for the row's first and second I columns
//   a = g / (1 + exp(-g)) * u       (SiLU, each step an f32 operation, exp the contract's)
// into fl, and the segment's max |a| for `quantize_segments`.
// p0 I, p1 RW (unused), p2 acc (T * 2I), p3 sa (fl), p4 sb (res, 2I), p5 y (fl scratch, T * I),
// p6 (unused), p7 (unused), p8 S, p9 the segments' max (fl, T * S).
@compute @workgroup_size(256)
fn gate_up_silu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg);
    if r >= P.n {
        return;
    }
    let n = P.p0;
    let t = r / P.p8;
    let j = (r % P.p8) * 256u + li;
    var m = 0u;
    if j < n {
        let sa = fl[P.p3 + t];
        let a0 = P.p2 + 2u * t * n;
        let g = dequant(accb(a0 + j), sa, res[P.p4 + j]);
        let u = dequant(accb(a0 + n + j), sa, res[P.p4 + n + j]);
        let e = narrow(exp_f64(-widen(g)));
        let a = mul32(div32(g, narrow(1.0lf + widen(e))), u);
        fl[P.p5 + t * n + j] = a;
        m = a & 0x7fffffffu;
    }
    let mb = workgroup_max(m, li);
    if li == 0u {
        fl[P.p9 + r] = mb;
    }
}

// The contract's quantization of rows whose values and segments' max |y| are in place, one
// workgroup a block of 256 packed words of a row (r = t * B + b, B = p6 blocks a row): each
// workgroup folds its row's S maxima, forms 127 / max, and packs its words; the first writes the
// row's scale.
// p0 H (values a row), p1 RW (words of a packed row), p2 y (fl, T * H), p3 the segments' max
// (fl, T * S), p4 S, p5 q (ops), p6 B, p7 scales (fl).
@compute @workgroup_size(256)
fn quantize_segments(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg);
    if r >= P.n {
        return;
    }
    let t = r / P.p6;
    let b = r % P.p6;
    var mb = 0u;
    for (var i = 0u; i < P.p4; i = i + 1u) {
        mb = max(mb, fl[P.p3 + t * P.p4 + i]);
    }
    let tiny = mb < 0x00800000u;
    var inv = 0u;
    if !tiny {
        inv = div32(0x42fe0000u, mb);
    }
    let q = Quant(inv, tiny, mb);
    if b == 0u && li == 0u {
        fl[P.p7 + t] = row_scale(q);
    }
    let wd = b * 256u + li;
    if wd < P.p1 {
        ops[P.p5 + t * P.p1 + wd] = pack4(P.p2 + t * P.p0, P.p0, wd, q);
    }
}

// The logits: (f32(acc) * sa) * sb for the head's rows, 256 values a workgroup (r = t * S + s).
// p0 V (values a row), p1 acc (T * V), p2 sa (fl), p3 sb (res), p4 out (fl, T * V), p5 S.
@compute @workgroup_size(256)
fn dequantize_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = row_of(wid, nwg);
    if r >= P.n {
        return;
    }
    let t = r / P.p5;
    let j = (r % P.p5) * 256u + li;
    if j < P.p0 {
        fl[P.p4 + t * P.p0 + j] = dequant(accb(P.p1 + t * P.p0 + j), fl[P.p2 + t], res[P.p3 + j]);
    }
}

// The live audit's operands (DESIGN §3.7): one workgroup a segment of the gather table in fl
// (four words a segment: source (0 acc, 1 ops, 2 kq), its first word, the first word in fl, words),
// each copied into fl for the read-back. p0 the table.
@compute @workgroup_size(256)
fn audit_gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let s = row_of(wid, nwg);
    if s >= P.n {
        return;
    }
    let e = P.p0 + 4u * s;
    let kind = fl[e];
    let src = fl[e + 1u];
    let dst = fl[e + 2u];
    let words = fl[e + 3u];
    for (var i = li; i < words; i = i + 256u) {
        var v = 0u;
        if kind == 0u {
            v = accb(src + i);
        } else if kind == 1u {
            v = ops[src + i];
        } else {
            v = kq[src + i];
        }
        fl[dst + i] = v;
    }
}

// Zeroes p1 accumulators from p0: the output of a product whose K slices add into it.
@compute @workgroup_size(256)
fn zero_acc(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = row_of(wid, nwg) * 256u + li;
    if i < P.p1 {
        acc[P.p0 + i] = 0;
    }
}
