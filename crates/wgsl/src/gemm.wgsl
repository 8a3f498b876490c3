// The integer part of the verified GEMM: acc[t, n] = sum_k a[t, k] * b[n, k] in i32.
//
// A is T x K and B is N x K, both int8 stored sixteen to a vec4<u32> (byte j of u32 word w of a
// row is element 4w + j), each row zero-padded to K16 vec4 words, a multiple of KV (so a row is
// 64-byte aligned and no K tile is partial). The output is T x N i32, row-major. `dot4` (the
// 4 x int8 dot product) is appended by the host: `dot4I8Packed` or a shift-and-sign-extend loop.
// Every product and every partial sum is an exact i32 (|sum| <= 127^2 * 131071 < 2^31), so the
// order in which the two entry points add is free and the result is the contract's bit for bit.
//
// `tiled` (more rows than the host sends to `gemv`): one workgroup of 16 x 16 threads owns a 128 x 128 output tile,
// each thread 8 x 8 outputs (rows ty*4 + i and 64 + ty*4 + i, columns likewise with tx), so every
// shared-memory read is one vec4 of four consecutive rows and a quarter warp reads 128 contiguous
// bytes. K is walked KV vec4 words (64 int8) at a time through workgroup memory, stored transposed
// (word-major, four rows to a vec4); the next tile's global loads are issued before the current
// tile is multiplied. Where the output has too few tiles to fill the GPU, K is split into slices
// along z whose sums are added atomically into the (zeroed) output.
//
// `gemv` (T <= GEMV_MAX_T rows: decode and prefill chunks): each group of 32 threads owns one output
// column, its lanes stride over K two vec4 words (16 int8 each) at a time, so a group reads 512
// contiguous bytes of B per load; the lanes' partial sums meet in workgroup memory.

struct Dims {
    t: u32,
    n: u32,
    k16: u32,
    // `tiled`: K stages per workgroup along z (split K); the slices' sums meet by atomic adds.
    stages: u32,
    // Where the operands start in their bindings: A's and B's first vec4 word, the first output
    // word (a device-resident stage binds whole buffers; a single product binds its own ranges).
    a0: u32,
    b0: u32,
    c0: u32,
    // Independent products of one shape in one dispatch (attention's chunks and kv heads; 0 or 1:
    // one), the z index's batch b at a0 + b * sa, b0 + (b % b_mod) * sb (b_mod 0: b * sb),
    // c0 + b * sc.
    batches: u32,
    sa: u32,
    sb: u32,
    sc: u32,
    b_mod: u32,
}

const TILE: u32 = 128u;     // output rows and columns per `tiled` workgroup
const KV: u32 = 4u;         // vec4 words of K per shared-memory stage (64 int8)
const KW: u32 = 16u;        // u32 words of K per stage (KV * 4)
const QUADS: u32 = 32u;     // vec4s of four rows per stage word (TILE / 4)
const GEMV_MAX_T: u32 = 16u; // rows of A the `gemv` entry point handles at most
const LANES: u32 = 32u;     // threads per `gemv` column

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<u32>>;
// Atomic so that split-K slices can add into it (integer adds: any order is exact); written with
// plain atomic stores otherwise.
@group(0) @binding(3) var<storage, read_write> out: array<atomic<i32>>;

var<workgroup> sa: array<vec4<u32>, 512>; // KW * QUADS
var<workgroup> sb: array<vec4<u32>, 512>;

// Where this workgroup's batch's A, B and output start (set at each entry point).
var<private> base_a: u32;
var<private> base_b: u32;
var<private> base_c: u32;

// Places the operands of batch `bz`.
fn set_batch(bz: u32) {
    base_a = dims.a0 + bz * dims.sa;
    var bb = bz;
    if (dims.b_mod > 0u) {
        bb = bz % dims.b_mod;
    }
    base_b = dims.b0 + bb * dims.sb;
    base_c = dims.c0 + bz * dims.sc;
}

// The vec4 word `kv` of row `row` of A (of B), or zero past the last row.
fn load_a(row: u32, kv: u32) -> vec4<u32> {
    if (row < dims.t) {
        return a[base_a + row * dims.k16 + kv];
    }
    return vec4<u32>(0u);
}

fn load_b(row: u32, kv: u32) -> vec4<u32> {
    if (row < dims.n) {
        return b[base_b + row * dims.k16 + kv];
    }
    return vec4<u32>(0u);
}

// Stores the vec4 word `c` of tile row `r` transposed: u32 word c*4 + j of row r goes to
// quad r / 4, lane r % 4 of stage word c*4 + j.
fn stage_a(q: u32, v: vec4<u32>) {
    let r = q / KV;
    let c = q % KV;
    let base = c * 4u * QUADS + r / 4u;
    let lane = r % 4u;
    sa[base][lane] = v.x;
    sa[base + QUADS][lane] = v.y;
    sa[base + 2u * QUADS][lane] = v.z;
    sa[base + 3u * QUADS][lane] = v.w;
}

fn stage_b(q: u32, v: vec4<u32>) {
    let r = q / KV;
    let c = q % KV;
    let base = c * 4u * QUADS + r / 4u;
    let lane = r % 4u;
    sb[base][lane] = v.x;
    sb[base + QUADS][lane] = v.y;
    sb[base + 2u * QUADS][lane] = v.z;
    sb[base + 3u * QUADS][lane] = v.w;
}

fn dot4x4(x: u32, w: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4(x, w.x), dot4(x, w.y), dot4(x, w.z), dot4(x, w.w));
}

// Writes (or, with split K, adds) the eight accumulators of one row a thread owns (columns col ..
// col + 3 and col + 64 .. col + 67), as far as the output reaches.
fn store_row(row: u32, col: u32, lo: vec4<i32>, hi: vec4<i32>, add: bool) {
    if (row >= dims.t) {
        return;
    }
    let o = row * dims.n;
    for (var j = 0u; j < 4u; j++) {
        if (col + j < dims.n) {
            put(o + col + j, lo[j], add);
        }
        if (col + 64u + j < dims.n) {
            put(o + col + 64u + j, hi[j], add);
        }
    }
}

fn put(i: u32, v: i32, add: bool) {
    if (add) {
        atomicAdd(&out[base_c + i], v);
    } else {
        atomicStore(&out[base_c + i], v);
    }
}

@compute @workgroup_size(256, 1, 1)
fn tiled(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // z: the batch, then the K slice within it.
    let slices = nwg.z / max(dims.batches, 1u);
    set_batch(wg.z / slices);
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    let tx = li % 16u;
    let ty = li / 16u;

    // Named accumulators, never an array, so that they stay in registers: c(2i + h) holds row
    // (i < 4 ? ty*4 + i : 64 + ty*4 + i - 4), columns h*64 + tx*4 .. + 3.
    var c0: vec4<i32> = vec4<i32>(0);
    var c1: vec4<i32> = vec4<i32>(0);
    var c2: vec4<i32> = vec4<i32>(0);
    var c3: vec4<i32> = vec4<i32>(0);
    var c4: vec4<i32> = vec4<i32>(0);
    var c5: vec4<i32> = vec4<i32>(0);
    var c6: vec4<i32> = vec4<i32>(0);
    var c7: vec4<i32> = vec4<i32>(0);
    var c8: vec4<i32> = vec4<i32>(0);
    var c9: vec4<i32> = vec4<i32>(0);
    var c10: vec4<i32> = vec4<i32>(0);
    var c11: vec4<i32> = vec4<i32>(0);
    var c12: vec4<i32> = vec4<i32>(0);
    var c13: vec4<i32> = vec4<i32>(0);
    var c14: vec4<i32> = vec4<i32>(0);
    var c15: vec4<i32> = vec4<i32>(0);

    // Each thread stages two vec4 words of A and two of B per tile: q = li and li + 256.
    let q0 = li;
    let q1 = li + 256u;
    let ntiles = dims.k16 / KV;
    // This workgroup's slice of K stages (all of them without split K).
    let first = (wg.z % slices) * dims.stages;
    let last = min(first + dims.stages, ntiles);
    let k0 = first * KV;
    var pa0 = load_a(row0 + q0 / KV, k0 + q0 % KV);
    var pa1 = load_a(row0 + q1 / KV, k0 + q1 % KV);
    var pb0 = load_b(col0 + q0 / KV, k0 + q0 % KV);
    var pb1 = load_b(col0 + q1 / KV, k0 + q1 % KV);
    for (var tile = first; tile < last; tile++) {
        workgroupBarrier();
        stage_a(q0, pa0);
        stage_a(q1, pa1);
        stage_b(q0, pb0);
        stage_b(q1, pb1);
        workgroupBarrier();
        if (tile + 1u < last) {
            let k = (tile + 1u) * KV;
            pa0 = load_a(row0 + q0 / KV, k + q0 % KV);
            pa1 = load_a(row0 + q1 / KV, k + q1 % KV);
            pb0 = load_b(col0 + q0 / KV, k + q0 % KV);
            pb1 = load_b(col0 + q1 / KV, k + q1 % KV);
        }
        for (var kw = 0u; kw < KW; kw++) {
            let a0 = sa[kw * QUADS + ty];
            let a1 = sa[kw * QUADS + 16u + ty];
            let b0 = sb[kw * QUADS + tx];
            let b1 = sb[kw * QUADS + 16u + tx];
            c0 += dot4x4(a0.x, b0);
            c1 += dot4x4(a0.x, b1);
            c2 += dot4x4(a0.y, b0);
            c3 += dot4x4(a0.y, b1);
            c4 += dot4x4(a0.z, b0);
            c5 += dot4x4(a0.z, b1);
            c6 += dot4x4(a0.w, b0);
            c7 += dot4x4(a0.w, b1);
            c8 += dot4x4(a1.x, b0);
            c9 += dot4x4(a1.x, b1);
            c10 += dot4x4(a1.y, b0);
            c11 += dot4x4(a1.y, b1);
            c12 += dot4x4(a1.z, b0);
            c13 += dot4x4(a1.z, b1);
            c14 += dot4x4(a1.w, b0);
            c15 += dot4x4(a1.w, b1);
        }
    }

    let add = slices > 1u;
    store_row(row0 + ty * 4u + 0u, col0 + tx * 4u, c0, c1, add);
    store_row(row0 + ty * 4u + 1u, col0 + tx * 4u, c2, c3, add);
    store_row(row0 + ty * 4u + 2u, col0 + tx * 4u, c4, c5, add);
    store_row(row0 + ty * 4u + 3u, col0 + tx * 4u, c6, c7, add);
    store_row(row0 + 64u + ty * 4u + 0u, col0 + tx * 4u, c8, c9, add);
    store_row(row0 + 64u + ty * 4u + 1u, col0 + tx * 4u, c10, c11, add);
    store_row(row0 + 64u + ty * 4u + 2u, col0 + tx * 4u, c12, c13, add);
    store_row(row0 + 64u + ty * 4u + 3u, col0 + tx * 4u, c14, c15, add);
}

var<workgroup> partial: array<i32, 4096>; // GEMV_MAX_T rows x 256 threads

// The dot product of 16 int8 pairs (one vec4 word of A against one of B).
fn dot16(x: vec4<u32>, w: vec4<u32>) -> i32 {
    return dot4(x.x, w.x) + dot4(x.y, w.y) + dot4(x.z, w.z) + dot4(x.w, w.w);
}

@compute @workgroup_size(256, 1, 1)
fn gemv(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    set_batch(wg.z);
    let lane = li % LANES;
    let group = li / LANES;
    let col = (wg.y * nwg.x + wg.x) * (256u / LANES) + group;

    // Named accumulators (row 4i + j in s_i[j]), never an array, so that they stay in registers;
    // the rows past T are skipped by uniform branches.
    var s0 = vec4<i32>(0);
    var s1 = vec4<i32>(0);
    var s2 = vec4<i32>(0);
    var s3 = vec4<i32>(0);
    if (col < dims.n) {
        let base = base_b + col * dims.k16;
        let a0 = base_a;
        let kend = dims.k16;
        // Two words of B a lane per step, both loads issued before either is used.
        for (var q = lane; q < kend; q += 2u * LANES) {
            let q1 = q + LANES;
            let w0 = b[base + q];
            var w1 = vec4<u32>(0u);
            if (q1 < kend) {
                w1 = b[base + q1];
            }
            s0.x += dot16(a[a0 + q], w0);
            if (dims.t > 1u) { s0.y += dot16(a[a0 + 1u * dims.k16 + q], w0); }
            if (dims.t > 2u) { s0.z += dot16(a[a0 + 2u * dims.k16 + q], w0); }
            if (dims.t > 3u) { s0.w += dot16(a[a0 + 3u * dims.k16 + q], w0); }
            if (dims.t > 4u) { s1.x += dot16(a[a0 + 4u * dims.k16 + q], w0); }
            if (dims.t > 5u) { s1.y += dot16(a[a0 + 5u * dims.k16 + q], w0); }
            if (dims.t > 6u) { s1.z += dot16(a[a0 + 6u * dims.k16 + q], w0); }
            if (dims.t > 7u) { s1.w += dot16(a[a0 + 7u * dims.k16 + q], w0); }
            if (dims.t > 8u) { s2.x += dot16(a[a0 + 8u * dims.k16 + q], w0); }
            if (dims.t > 9u) { s2.y += dot16(a[a0 + 9u * dims.k16 + q], w0); }
            if (dims.t > 10u) { s2.z += dot16(a[a0 + 10u * dims.k16 + q], w0); }
            if (dims.t > 11u) { s2.w += dot16(a[a0 + 11u * dims.k16 + q], w0); }
            if (dims.t > 12u) { s3.x += dot16(a[a0 + 12u * dims.k16 + q], w0); }
            if (dims.t > 13u) { s3.y += dot16(a[a0 + 13u * dims.k16 + q], w0); }
            if (dims.t > 14u) { s3.z += dot16(a[a0 + 14u * dims.k16 + q], w0); }
            if (dims.t > 15u) { s3.w += dot16(a[a0 + 15u * dims.k16 + q], w0); }
            if (q1 < kend) {
                s0.x += dot16(a[a0 + q1], w1);
                if (dims.t > 1u) { s0.y += dot16(a[a0 + 1u * dims.k16 + q1], w1); }
                if (dims.t > 2u) { s0.z += dot16(a[a0 + 2u * dims.k16 + q1], w1); }
                if (dims.t > 3u) { s0.w += dot16(a[a0 + 3u * dims.k16 + q1], w1); }
                if (dims.t > 4u) { s1.x += dot16(a[a0 + 4u * dims.k16 + q1], w1); }
                if (dims.t > 5u) { s1.y += dot16(a[a0 + 5u * dims.k16 + q1], w1); }
                if (dims.t > 6u) { s1.z += dot16(a[a0 + 6u * dims.k16 + q1], w1); }
                if (dims.t > 7u) { s1.w += dot16(a[a0 + 7u * dims.k16 + q1], w1); }
                if (dims.t > 8u) { s2.x += dot16(a[a0 + 8u * dims.k16 + q1], w1); }
                if (dims.t > 9u) { s2.y += dot16(a[a0 + 9u * dims.k16 + q1], w1); }
                if (dims.t > 10u) { s2.z += dot16(a[a0 + 10u * dims.k16 + q1], w1); }
                if (dims.t > 11u) { s2.w += dot16(a[a0 + 11u * dims.k16 + q1], w1); }
                if (dims.t > 12u) { s3.x += dot16(a[a0 + 12u * dims.k16 + q1], w1); }
                if (dims.t > 13u) { s3.y += dot16(a[a0 + 13u * dims.k16 + q1], w1); }
                if (dims.t > 14u) { s3.z += dot16(a[a0 + 14u * dims.k16 + q1], w1); }
                if (dims.t > 15u) { s3.w += dot16(a[a0 + 15u * dims.k16 + q1], w1); }
            }
        }
    }
    // Only the rows present (uniform branches).
    partial[0u * 256u + li] = s0.x;
    if (dims.t > 1u) { partial[1u * 256u + li] = s0.y; }
    if (dims.t > 2u) { partial[2u * 256u + li] = s0.z; }
    if (dims.t > 3u) { partial[3u * 256u + li] = s0.w; }
    if (dims.t > 4u) { partial[4u * 256u + li] = s1.x; }
    if (dims.t > 5u) { partial[5u * 256u + li] = s1.y; }
    if (dims.t > 6u) { partial[6u * 256u + li] = s1.z; }
    if (dims.t > 7u) { partial[7u * 256u + li] = s1.w; }
    if (dims.t > 8u) { partial[8u * 256u + li] = s2.x; }
    if (dims.t > 9u) { partial[9u * 256u + li] = s2.y; }
    if (dims.t > 10u) { partial[10u * 256u + li] = s2.z; }
    if (dims.t > 11u) { partial[11u * 256u + li] = s2.w; }
    if (dims.t > 12u) { partial[12u * 256u + li] = s3.x; }
    if (dims.t > 13u) { partial[13u * 256u + li] = s3.y; }
    if (dims.t > 14u) { partial[14u * 256u + li] = s3.z; }
    if (dims.t > 15u) { partial[15u * 256u + li] = s3.w; }
    workgroupBarrier();
    // Lane r of each group adds row r's 32 partial sums.
    if (lane < dims.t && lane < GEMV_MAX_T && col < dims.n) {
        let start = lane * 256u + group * LANES;
        var sum = 0;
        for (var i = 0u; i < LANES; i++) {
            sum += partial[start + i];
        }
        atomicStore(&out[base_c + lane * dims.n + col], sum);
    }
}
