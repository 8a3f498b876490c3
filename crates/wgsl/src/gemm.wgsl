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
// tile is multiplied.
//
// `gemv` (T <= GEMV_MAX_T rows: decode and prefill chunks): each group of 32 threads owns one output column, its lanes
// stride over K one vec4 word (16 int8) at a time, so a group reads 512 contiguous bytes of B per
// step; the lanes' partial sums meet in workgroup memory.

struct Dims {
    t: u32,
    n: u32,
    k16: u32,
    _pad: u32,
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
@group(0) @binding(3) var<storage, read_write> out: array<i32>;

var<workgroup> sa: array<vec4<u32>, 512>; // KW * QUADS
var<workgroup> sb: array<vec4<u32>, 512>;

// The vec4 word `kv` of row `row` of A (of B), or zero past the last row.
fn load_a(row: u32, kv: u32) -> vec4<u32> {
    if (row < dims.t) {
        return a[row * dims.k16 + kv];
    }
    return vec4<u32>(0u);
}

fn load_b(row: u32, kv: u32) -> vec4<u32> {
    if (row < dims.n) {
        return b[row * dims.k16 + kv];
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

@compute @workgroup_size(256, 1, 1)
fn tiled(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    let tx = li % 16u;
    let ty = li / 16u;

    // acc[2i + h]: row (i < 4 ? ty*4 + i : 64 + ty*4 + i - 4), columns h*64 + tx*4 .. + 3.
    var acc: array<vec4<i32>, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = vec4<i32>(0);
    }

    // Each thread stages two vec4 words of A and two of B per tile: q = li and li + 256.
    let q0 = li;
    let q1 = li + 256u;
    let ntiles = dims.k16 / KV;
    var pa0 = load_a(row0 + q0 / KV, q0 % KV);
    var pa1 = load_a(row0 + q1 / KV, q1 % KV);
    var pb0 = load_b(col0 + q0 / KV, q0 % KV);
    var pb1 = load_b(col0 + q1 / KV, q1 % KV);
    for (var tile = 0u; tile < ntiles; tile++) {
        workgroupBarrier();
        stage_a(q0, pa0);
        stage_a(q1, pa1);
        stage_b(q0, pb0);
        stage_b(q1, pb1);
        workgroupBarrier();
        if (tile + 1u < ntiles) {
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
            acc[0] += dot4x4(a0.x, b0);
            acc[1] += dot4x4(a0.x, b1);
            acc[2] += dot4x4(a0.y, b0);
            acc[3] += dot4x4(a0.y, b1);
            acc[4] += dot4x4(a0.z, b0);
            acc[5] += dot4x4(a0.z, b1);
            acc[6] += dot4x4(a0.w, b0);
            acc[7] += dot4x4(a0.w, b1);
            acc[8] += dot4x4(a1.x, b0);
            acc[9] += dot4x4(a1.x, b1);
            acc[10] += dot4x4(a1.y, b0);
            acc[11] += dot4x4(a1.y, b1);
            acc[12] += dot4x4(a1.z, b0);
            acc[13] += dot4x4(a1.z, b1);
            acc[14] += dot4x4(a1.w, b0);
            acc[15] += dot4x4(a1.w, b1);
        }
    }

    for (var i = 0u; i < 8u; i++) {
        let row = row0 + (i / 4u) * 64u + ty * 4u + i % 4u;
        if (row < dims.t) {
            for (var h = 0u; h < 2u; h++) {
                let col = col0 + h * 64u + tx * 4u;
                let v = acc[2u * i + h];
                let o = row * dims.n + col;
                if (col < dims.n) { out[o] = v.x; }
                if (col + 1u < dims.n) { out[o + 1u] = v.y; }
                if (col + 2u < dims.n) { out[o + 2u] = v.z; }
                if (col + 3u < dims.n) { out[o + 3u] = v.w; }
            }
        }
    }
}

var<workgroup> partial: array<i32, 4096>; // GEMV_MAX_T rows x 256 threads

@compute @workgroup_size(256, 1, 1)
fn gemv(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let lane = li % LANES;
    let group = li / LANES;
    let col = (wg.y * nwg.x + wg.x) * (256u / LANES) + group;

    var acc: array<i32, 16>; // GEMV_MAX_T
    for (var r = 0u; r < GEMV_MAX_T; r++) {
        acc[r] = 0;
    }
    if (col < dims.n) {
        for (var q = lane; q < dims.k16; q += LANES) {
            let w = b[col * dims.k16 + q];
            for (var r = 0u; r < GEMV_MAX_T; r++) {
                if (r < dims.t) {
                    let x = a[r * dims.k16 + q];
                    acc[r] += dot4(x.x, w.x) + dot4(x.y, w.y) + dot4(x.z, w.z) + dot4(x.w, w.w);
                }
            }
        }
    }
    for (var r = 0u; r < GEMV_MAX_T; r++) {
        partial[r * 256u + li] = acc[r];
    }
    workgroupBarrier();
    // Lane r of each group adds row r's 32 partial sums.
    if (lane < dims.t && lane < GEMV_MAX_T && col < dims.n) {
        let base = lane * 256u + group * LANES;
        var sum = 0;
        for (var i = 0u; i < LANES; i++) {
            sum += partial[base + i];
        }
        out[lane * dims.n + col] = sum;
    }
}
