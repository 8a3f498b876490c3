//! Everything outside the GEMMs, in f32 with one fixed order of operations (DESIGN.md §3.8).
//!
//! Transcendental functions come from the pure-Rust `libm` crate, never the platform's, so every
//! machine produces the same bits. `sqrt` is correctly rounded by IEEE 754, so `f32::sqrt` is used.

/// Number of independent partial sums in [`dot`]. Fixed: changing it changes the bits of the f32 path.
const LANES: usize = 16;

/// `Σ a[i]·b[i]` in one fixed order: lane `j` sums the indices `≡ j (mod 16)` left to right, the
/// lanes are combined in a fixed tree, then the leftover tail is added left to right.
///
/// The compiler may vectorize this but never reassociates it, so the bits do not depend on the ISA.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for j in 0..LANES {
            acc[j] += x[j] * y[j];
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    let mut sum = acc[0];
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        sum += x * y;
    }
    sum
}

/// `C = A·Bᵀ` in f32: A is `t×k`, B is `n×k`, C is `t×n`; every cell is one [`dot`].
///
/// Work is split over output channels across threads; each cell is computed the same way whatever
/// the split, so the result does not depend on the thread count.
pub(crate) fn matmul_f32(a: &[f32], t: usize, b: &[f32], n: usize, k: usize) -> Vec<f32> {
    use rayon::prelude::*;
    debug_assert_eq!(a.len(), t * k);
    debug_assert_eq!(b.len(), n * k);
    let mut c = vec![0f32; t * n];
    if t == 0 || n == 0 {
        return c;
    }
    const BLOCK: usize = 64;
    let blocks: Vec<Vec<f32>> = (0..n.div_ceil(BLOCK))
        .into_par_iter()
        .map(|blk| {
            let n0 = blk * BLOCK;
            let n1 = (n0 + BLOCK).min(n);
            let mut out = vec![0f32; t * (n1 - n0)];
            for (j, w) in b[n0 * k..n1 * k].chunks_exact(k.max(1)).enumerate() {
                for (r, x) in a.chunks_exact(k.max(1)).enumerate() {
                    out[r * (n1 - n0) + j] = dot(x, w);
                }
            }
            out
        })
        .collect();
    for (blk, out) in blocks.iter().enumerate() {
        let n0 = blk * BLOCK;
        let width = out.len() / t;
        for r in 0..t {
            c[r * n + n0..r * n + n0 + width].copy_from_slice(&out[r * width..(r + 1) * width]);
        }
    }
    c
}

/// Lanes of the vectors PyTorch's CPU reductions accumulate in (256-bit), whose orders the norms and
/// softmax follow.
const TORCH_LANES: usize = 8;

/// `Σ x` in the order of PyTorch's CPU `sum` over a contiguous row (`vectorized_inner_sum` with
/// `row_sum`'s four interleaved vector accumulators, with 8-lane vectors), so that the f32 sums feeding
/// the int8 quantizers round as the reference's do. Rows longer than 16·4·16 elements take the
/// same path without PyTorch's cascade levels (not needed by any supported width).
pub(crate) fn torch_sum(x: &[f32]) -> f32 {
    const ILP: usize = 4;
    let vecs = x.len() / TORCH_LANES;
    let groups = vecs / ILP;
    let mut acc = [[0f32; TORCH_LANES]; ILP];
    for g in 0..groups {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = &x[(g * ILP + k) * TORCH_LANES..][..TORCH_LANES];
            for l in 0..TORCH_LANES {
                a[l] += v[l];
            }
        }
    }
    for i in groups * ILP..vecs {
        let v = &x[i * TORCH_LANES..][..TORCH_LANES];
        for l in 0..TORCH_LANES {
            acc[0][l] += v[l];
        }
    }
    let mut lanes = acc[0];
    for a in &acc[1..] {
        for l in 0..TORCH_LANES {
            lanes[l] += a[l];
        }
    }
    let mut total = 0f32;
    for v in &x[vecs * TORCH_LANES..] {
        total += v;
    }
    for l in lanes {
        total += l;
    }
    total
}

/// `Σ x` in the order of PyTorch's `vec::reduce_all` (one vector accumulator, a partial last vector,
/// then a halving tree across 16 lanes), as its CPU softmax sums the exponentials.
pub(crate) fn torch_reduce_sum(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let head = x.len().min(LANES);
    acc[..head].copy_from_slice(&x[..head]);
    if x.len() >= LANES {
        let mut chunks = x[LANES..].chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
        for (l, v) in chunks.remainder().iter().enumerate() {
            acc[l] += v;
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// Llama's RMSNorm over each row: `w · (x · 1/sqrt(mean(x²) + eps))`, as `transformers` orders it.
pub(crate) fn rms_norm(x: &mut [f32], cols: usize, weight: &[f32], eps: f32) {
    let mut sq = vec![0f32; cols];
    for row in x.chunks_exact_mut(cols) {
        for (s, v) in sq.iter_mut().zip(row.iter()) {
            *s = v * v;
        }
        let inv = 1.0 / (torch_sum(&sq) / cols as f32 + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

/// GPT-2's LayerNorm over each row, as PyTorch's CPU kernel computes it: mean and biased variance
/// from [`row_moments`], `rstd = 1/sqrt(var + eps)`, then `fma((x − mean)·rstd, w, b)`.
///
/// `fma` is IEEE 754's correctly rounded fused multiply-add (from `libm`), so this is as portable as
/// `sqrt`; it is used because PyTorch's kernel uses it, and the int8 reference is PyTorch.
pub(crate) fn layer_norm(x: &mut [f32], cols: usize, weight: &[f32], bias: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(cols) {
        let (mean, var) = row_moments(row);
        let rstd = 1.0 / (var.max(0.0) + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
            *v = libm::fmaf((*v - mean) * rstd, *w, *b);
        }
    }
}

/// Lanes and chunk length (in vectors) of PyTorch's `RowwiseMoments`.
const MOMENT_LANES: usize = 8;
const MOMENT_CHUNK: usize = 16;

/// Merge moments `(n_add, m1_add, m2_add)` into `(n, m1, m2)` per lane (PyTorch's `AddMomentsVec`).
fn add_moments(
    n_add: usize,
    m1_add: &[f32; MOMENT_LANES],
    m2_add: &[f32; MOMENT_LANES],
    n: &mut usize,
    m1: &mut [f32; MOMENT_LANES],
    m2: &mut [f32; MOMENT_LANES],
) {
    let total = *n + n_add;
    let c = if total == 0 {
        0.0
    } else {
        n_add as f32 / total as f32
    };
    let m0 = *n as f32;
    for l in 0..MOMENT_LANES {
        let delta = m1_add[l] - m1[l];
        m1[l] = libm::fmaf(c, delta, m1[l]);
        m2[l] += libm::fmaf(delta * delta * c, m0, m2_add[l]);
    }
    *n = total;
}

/// Mean and biased variance of a row in the order of PyTorch's `RowwiseMoments` for f32: Welford
/// over 8-lane vectors in chunks of 16 vectors, chunks merged through a binary-counter stack, a
/// scalar Welford over the leftover elements, then the lanes merged in order.
pub(crate) fn row_moments(x: &[f32]) -> (f32, f32) {
    const L: usize = MOMENT_LANES;
    let n = x.len() / L;
    let chunks = n.div_ceil(MOMENT_CHUNK);
    let depth = if chunks <= 2 {
        1
    } else {
        (usize::BITS - (chunks - 1).leading_zeros()) as usize
    };
    let mut m0_stk = vec![0usize; depth];
    let mut m1_stk = vec![[0f32; L]; depth];
    let mut m2_stk = vec![[0f32; L]; depth];
    for i in 0..chunks {
        let m0 = MOMENT_CHUNK.min(n - i * MOMENT_CHUNK);
        let (mut m1v, mut m2v) = ([0f32; L], [0f32; L]);
        for j in 0..m0 {
            let c = 1.0 / (j + 1) as f32;
            let xv = &x[(i * MOMENT_CHUNK + j) * L..][..L];
            for l in 0..L {
                let d = xv[l] - m1v[l];
                m1v[l] = libm::fmaf(d, c, m1v[l]);
                m2v[l] = libm::fmaf(d, xv[l] - m1v[l], m2v[l]);
            }
        }
        add_moments(
            m0,
            &m1v,
            &m2v,
            &mut m0_stk[0],
            &mut m1_stk[0],
            &mut m2_stk[0],
        );
        let mut mask = i + 1;
        let mut j = 1;
        while j < depth && mask & 1 == 0 {
            let (n_add, m1_add, m2_add) = (m0_stk[j - 1], m1_stk[j - 1], m2_stk[j - 1]);
            let (mut nn, mut mm1, mut mm2) = (m0_stk[j], m1_stk[j], m2_stk[j]);
            add_moments(n_add, &m1_add, &m2_add, &mut nn, &mut mm1, &mut mm2);
            (m0_stk[j], m1_stk[j], m2_stk[j]) = (nn, mm1, mm2);
            (m0_stk[j - 1], m1_stk[j - 1], m2_stk[j - 1]) = (0, [0.0; L], [0.0; L]);
            mask >>= 1;
            j += 1;
        }
    }
    for i in 1..depth {
        let (n_add, m1_add, m2_add) = (m0_stk[i], m1_stk[i], m2_stk[i]);
        let (mut nn, mut mm1, mut mm2) = (m0_stk[0], m1_stk[0], m2_stk[0]);
        add_moments(n_add, &m1_add, &m2_add, &mut nn, &mut mm1, &mut mm2);
        (m0_stk[0], m1_stk[0], m2_stk[0]) = (nn, mm1, mm2);
    }
    let (m1a, m2a) = (m1_stk[0], m2_stk[0]);
    let (mut m0, mut m1, mut m2) = (0usize, 0f32, 0f32);
    for &v in &x[n * L..] {
        let delta = v - m1;
        m0 += 1;
        m1 += delta / m0 as f32;
        m2 = libm::fmaf(delta, v - m1, m2);
    }
    for l in 0..L {
        let total = m0 + n;
        let c = if total == 0 {
            0.0
        } else {
            n as f32 / total as f32
        };
        let d = m1a[l] - m1;
        m1 = libm::fmaf(c, d, m1);
        m2 += libm::fmaf(d * d * c, m0 as f32, m2a[l]);
        m0 = total;
    }
    (m1, m2 / x.len() as f32)
}

/// `transformers`' default rotary frequencies: `1 / theta^(2i/d)`, computed in f32.
pub(crate) fn rope_inv_freq(theta: f32, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| 1.0 / libm::powf(theta, (2 * i) as f32 / head_dim as f32))
        .collect()
}

/// Rotate each `head_dim`-wide head of each row in place, row `r` at position `pos0 + r`, with
/// `transformers`' `rotate_half` convention: `x·cos + rotate_half(x)·sin`.
pub(crate) fn apply_rope(
    x: &mut [f32],
    cols: usize,
    head_dim: usize,
    pos0: usize,
    inv_freq: &[f32],
) {
    let half = head_dim / 2;
    let mut cos = vec![0f32; half];
    let mut sin = vec![0f32; half];
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let pos = (pos0 + r) as f32;
        for i in 0..half {
            let f = pos * inv_freq[i];
            cos[i] = libm::cosf(f);
            sin[i] = libm::sinf(f);
        }
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let x1 = head[i];
                let x2 = head[i + half];
                head[i] = x1 * cos[i] - x2 * sin[i];
                head[i + half] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

/// SiLU: `x / (1 + exp(−x))`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

/// GPT-2's `gelu_new`: `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
#[inline]
pub(crate) fn gelu_new(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/π) rounded to f32
    0.5 * x * (1.0 + libm::tanhf(C * (x + 0.044715 * (x * x * x))))
}

/// Exact GELU: `0.5·x·(1 + erf(x/√2))`.
#[inline]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Softmax over one row in place; `-inf` entries become exactly 0. A row with no finite entry is
/// left all zeros (it cannot happen with a causal mask, which always keeps the diagonal).
pub(crate) fn softmax(row: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for &v in row.iter() {
        if v > max {
            max = v;
        }
    }
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    for v in row.iter_mut() {
        *v = if *v == f32::NEG_INFINITY {
            0.0
        } else {
            libm::expf(*v - max)
        };
    }
    let sum = torch_reduce_sum(row);
    // PyTorch's CPU softmax multiplies by the reciprocal of the sum.
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// The first non-finite value in `x`, if any.
pub(crate) fn first_non_finite(x: &[f32]) -> Option<f32> {
    x.iter().copied().find(|v| !v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_reference_closely() {
        let a: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..1000)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 11.0)
            .collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let got = dot(&a, &b) as f64;
        assert!(
            (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
            "{got} vs {exact}"
        );
    }

    #[test]
    fn matmul_cells_are_dots() {
        let (t, n, k) = (3, 130, 19);
        let a: Vec<f32> = (0..t * k).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.3).cos()).collect();
        let c = matmul_f32(&a, t, &b, n, k);
        for r in 0..t {
            for j in 0..n {
                assert_eq!(
                    c[r * n + j].to_bits(),
                    dot(&a[r * k..][..k], &b[j * k..][..k]).to_bits()
                );
            }
        }
    }

    #[test]
    fn softmax_masks_to_exact_zero() {
        let mut row = [1.0, f32::NEG_INFINITY, 2.0];
        softmax(&mut row);
        assert_eq!(row[1].to_bits(), 0);
        assert!((row[0] + row[2] - 1.0).abs() < 1e-6);
        assert!(row[2] > row[0]);
    }

    #[test]
    fn rope_rotates_pairs_by_position_angle() {
        // head_dim 2: one pair rotated by pos·1 (theta irrelevant for i = 0).
        let inv = rope_inv_freq(10000.0, 2);
        assert_eq!(inv, vec![1.0]);
        let mut x = vec![1.0, 0.0, 1.0, 0.0];
        apply_rope(&mut x, 2, 2, 3, &inv);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        assert!((x[2] - 4f32.cos()).abs() < 1e-6 && (x[3] - 4f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn norms_normalize() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut x, 4, &[1.0; 4], &[0.0; 4], 0.0);
        let mean: f32 = x.iter().sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6);
        let mut y = vec![3.0, 4.0];
        rms_norm(&mut y, 2, &[1.0, 2.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn activations_match_closed_forms() {
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-7);
        assert!((gelu_new(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-5);
    }
}

#[cfg(test)]
mod dump {
    use super::*;

    fn rand(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn write(name: &str, v: &[f32]) {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::create_dir_all("/tmp/opsdump").unwrap();
        std::fs::write(format!("/tmp/opsdump/{name}.bin"), bytes).unwrap();
    }

    #[test]
    fn dump_ops() {
        if std::env::var("DUMP_OPS").is_err() {
            return;
        }
        let (rows, cols) = (64, 64);
        let x = rand(rows * cols, 1, 3.0);
        let w = rand(cols, 2, 1.5);
        let b = rand(cols, 3, 0.5);
        write("x", &x);
        write("w", &w);
        write("b", &b);
        let mut ln = x.clone();
        layer_norm(&mut ln, cols, &w, &b, 1e-5);
        write("ln", &ln);
        let mut rms = x.clone();
        rms_norm(&mut rms, cols, &w, 1e-6);
        write("rms", &rms);
        write("gelu", &x.iter().map(|v| gelu_new(*v)).collect::<Vec<_>>());
        write("silu", &x.iter().map(|v| silu(*v)).collect::<Vec<_>>());
        let mut sm = x.clone();
        for row in sm.chunks_exact_mut(cols) {
            softmax(row);
        }
        write("softmax", &sm);
        let inv = rope_inv_freq(10000.0, 16);
        write("inv_freq", &inv);
        let mut r = x.clone();
        apply_rope(&mut r, cols, 16, 0, &inv);
        write("rope", &r);
    }
}
