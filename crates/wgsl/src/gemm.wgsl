// The integer part of the verified GEMM: acc[t, n] = sum_k a[t, k] * b[n, k] in i32.
//
// A is T x K and B is N x K, both int8 stored four to a u32 (byte j of word w is element 4w + j,
// rows zero-padded to K4 = ceil(K / 4) words). The output is T x N i32, row-major. `dot4` (the
// 4 x int8 dot product) is appended by the host: `dot4I8Packed` or a shift-and-sign-extend loop.
//
// Tiling: one workgroup of 16 x 16 threads owns a 64 x 64 output tile; each thread owns 4 x 4
// outputs strided by 16 (so stores and shared-memory reads stay contiguous). K is walked in tiles
// of TK words staged through workgroup memory, stored transposed with a padded stride.

struct Dims {
    t: u32,
    n: u32,
    k4: u32,
    _pad: u32,
}

const TM: u32 = 64u;   // output rows (T) per workgroup
const TN: u32 = 64u;   // output columns (N) per workgroup
const TK: u32 = 16u;   // K words (64 int8) per shared-memory tile
const WG: u32 = 16u;   // threads per workgroup edge
const STRIDE: u32 = 65u; // padded stride of the transposed tiles (64 + 1)

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;

var<workgroup> a_tile: array<u32, 1040>; // TK * STRIDE
var<workgroup> b_tile: array<u32, 1040>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let row0 = wg.y * TM;
    let col0 = wg.x * TN;
    let li = lid.y * WG + lid.x;

    var acc: array<i32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0;
    }

    let ntiles = (dims.k4 + TK - 1u) / TK;
    for (var tile = 0u; tile < ntiles; tile++) {
        let k0 = tile * TK;
        // Stage a 64 x TK block of A and of B; out-of-range words read as zero.
        for (var s = 0u; s < 4u; s++) {
            let idx = li + s * 256u;
            let r = idx / TK;
            let c = idx % TK;
            let kw = k0 + c;
            var wa = 0u;
            if (row0 + r < dims.t && kw < dims.k4) {
                wa = a[(row0 + r) * dims.k4 + kw];
            }
            a_tile[c * STRIDE + r] = wa;
            var wb = 0u;
            if (col0 + r < dims.n && kw < dims.k4) {
                wb = b[(col0 + r) * dims.k4 + kw];
            }
            b_tile[c * STRIDE + r] = wb;
        }
        workgroupBarrier();

        for (var kk = 0u; kk < TK; kk++) {
            var ar: array<u32, 4>;
            var br: array<u32, 4>;
            for (var i = 0u; i < 4u; i++) {
                ar[i] = a_tile[kk * STRIDE + lid.y + i * WG];
                br[i] = b_tile[kk * STRIDE + lid.x + i * WG];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    let idx = i * 4u + j;
                    acc[idx] = acc[idx] + dot4(ar[i], br[j]);
                }
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < 4u; i++) {
        let row = row0 + lid.y + i * WG;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x + j * WG;
            if (row < dims.t && col < dims.n) {
                let idx = i * 4u + j;
                out[row * dims.n + col] = acc[idx];
            }
        }
    }
}
