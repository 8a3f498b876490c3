//! Everything outside the GEMMs, in f32 with one fixed order of operations (DESIGN.md §3.8).
//!
//! Reductions (norm moments, softmax sums) are accumulated in f64 and rounded once to f32, so their
//! bits do not depend on a summation order. Transcendental functions come from the pure-Rust `libm`
//! crate, never the platform's, so every machine produces the same bits. Each one is libm's f64 function of the widened f32 argument,
//! rounded once to f32 ([`exp`], [`cos`], …): libm's f64 results are within one f64 ulp, so the f32
//! rounding is the correctly rounded value except when the exact result lies within about 2⁻²⁹ of
//! an f32 rounding boundary. An independent implementation of the same formula (the fixtures'
//! PyTorch reference computes these in float64 and rounds) therefore gets the same bits, which an
//! f32 libm function (≈0.5–1 ulp, its own rounding errors) would not. `sqrt` is correctly rounded by
//! IEEE 754, so `f32::sqrt` is used.

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

/// Llama's RMSNorm over each row: `w · (x · inv)` in f32 as `transformers` orders it, where
/// `inv = 1/sqrt(mean(x²) + eps)` is computed in f64 (the squares of f32 values are exact there; the
/// sum's rounding errors are far below an f32 ulp, so its order does not matter) and rounded once.
pub fn rms_norm(x: &mut [f32], cols: usize, weight: &[f32], eps: f32) {
    for_each_rows(x, cols, |_, rows| {
        for row in rows.chunks_exact_mut(cols) {
            let ms = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / cols as f64;
            let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
            for (v, w) in row.iter_mut().zip(weight) {
                *v = w * (*v * inv);
            }
        }
    });
}

/// GPT-2's LayerNorm over each row: mean and biased variance in f64, `y = (x − mean)/sqrt(var + eps)`
/// in f64 rounded once to f32, then `y·w + b` in f32 (two roundings, no fused multiply-add).
pub(crate) fn layer_norm(x: &mut [f32], cols: usize, weight: &[f32], bias: &[f32], eps: f32) {
    let n = cols as f64;
    for row in x.chunks_exact_mut(cols) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean) * (f64::from(v) - mean))
            .sum::<f64>()
            / n;
        let rstd = 1.0 / (var + f64::from(eps)).sqrt();
        for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
            let y = ((f64::from(*v) - mean) * rstd) as f32;
            *v = y * w + b;
        }
    }
}

/// `transformers`' default rotary frequencies `1 / theta^(2i/d)`, computed in f64 and rounded once.
pub fn rope_inv_freq(theta: f32, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| (1.0 / libm::pow(f64::from(theta), (2 * i) as f64 / head_dim as f64)) as f32)
        .collect()
}

pub(crate) use crate::exp::exp;
use daisy_gemm_int8::for_each_rows;

use crate::exp::exp_slice;

/// A transcendental of DESIGN §3.8: libm's f64 function `f` of the widened argument, rounded once.
#[inline]
fn rounded(f: fn(f64) -> f64, x: f32) -> f32 {
    f(f64::from(x)) as f32
}

/// Rotate each `head_dim`-wide head of each row in place, row `r` at position `pos0 + r`, with
/// `transformers`' `rotate_half` convention: `x·cos + rotate_half(x)·sin`. The angle is the f32
/// product `pos · inv_freq[i]`, as `transformers` forms it.
pub fn apply_rope(x: &mut [f32], cols: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
    let rows = x.len() / cols.max(1);
    rotate(x, cols, cols, &Rope::new(inv_freq, head_dim, pos0, rows));
}

/// RoPE's tables for the rows of one pass (positions `pos0..pos0 + rows`), made once on first use
/// and shared by every layer of the pass.
pub(crate) struct Rope<'a> {
    inv_freq: &'a [f32],
    head_dim: usize,
    pos0: usize,
    rows: usize,
    /// `cos` then `sin`, `rows × head_dim/2` each.
    tables: std::sync::OnceLock<(Vec<f32>, Vec<f32>)>,
}

impl<'a> Rope<'a> {
    pub(crate) fn new(inv_freq: &'a [f32], head_dim: usize, pos0: usize, rows: usize) -> Self {
        Self {
            inv_freq,
            head_dim,
            pos0,
            rows,
            tables: std::sync::OnceLock::new(),
        }
    }

    fn tables(&self) -> &(Vec<f32>, Vec<f32>) {
        self.tables.get_or_init(|| {
            let half = self.head_dim / 2;
            let mut cos = vec![0f32; self.rows * half];
            let mut sin = vec![0f32; self.rows * half];
            if half > 0 {
                for (r, (c, s)) in cos
                    .chunks_exact_mut(half)
                    .zip(sin.chunks_exact_mut(half))
                    .enumerate()
                {
                    rope_cos_sin(self.pos0 + r, &self.inv_freq[..half], c, s);
                }
            }
            (cos, sin)
        })
    }
}

/// RoPE on every head in the first `heads` columns of each row of `x` (`cols` wide, one row per
/// position of `rope`).
pub(crate) fn rotate(x: &mut [f32], cols: usize, heads: usize, rope: &Rope<'_>) {
    let (hd, half) = (rope.head_dim, rope.head_dim / 2);
    if half == 0 || cols == 0 {
        return;
    }
    let (cos, sin) = rope.tables();
    for_each_rows(x, cols, |r0, rows| {
        for (r, row) in rows.chunks_exact_mut(cols).enumerate() {
            let at = (r0 + r) * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            for head in row[..heads].chunks_exact_mut(hd) {
                for i in 0..half {
                    let x1 = head[i];
                    let x2 = head[i + half];
                    head[i] = x1 * cos[i] - x2 * sin[i];
                    head[i + half] = x2 * cos[i] + x1 * sin[i];
                }
            }
        }
    });
}

/// RoPE's `cos` and `sin` at position `pos` for each frequency: the f64 functions of the f32
/// angle `pos · inv_freq[i]`, rounded once (a device that rotates takes these tables as input).
pub fn rope_cos_sin(pos: usize, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    let pos = pos as f32;
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let angle = pos * f;
        *c = rounded(libm::cos, angle);
        *s = rounded(libm::sin, angle);
    }
}

/// SiLU: `x / (1 + exp(−x))`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// The activation of the gated MLP over `t` rows of `gu` (each row its gate, then its up values,
/// `inter` of each): `silu(gate) · up` per element, rows shared out over the GEMM's threads.
pub(crate) fn silu_mul_rows(gu: &[f32], inter: usize) -> Vec<f32> {
    // Every element is written below.
    let mut act = daisy_gemm_int8::output_buffer(gu.len() / 2);
    for_each_rows(&mut act, inter, |r0, rows| {
        for (r, out) in rows.chunks_exact_mut(inter).enumerate() {
            let (g, u) = gu[(r0 + r) * 2 * inter..(r0 + r + 1) * 2 * inter].split_at(inter);
            silu_mul_into(g, u, out);
        }
    });
    act
}

/// `silu(g[i]) · u[i]` for each i, appended to `out` (the bits of [`silu`], vectorized).
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut Vec<f32>) {
    let start = out.len();
    out.resize(start + g.len(), 0.0);
    silu_mul_into(g, u, &mut out[start..]);
}

/// [`silu_mul`] into `out` (as long as `g`): one pass, `g / (1 + exp(−g)) · u` per element,
/// compiled for the widest instruction set the CPU has, as [`exp_slice`] is (the same f32 and f64
/// operations on every path).
fn silu_mul_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[inline(always)]
    fn each(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
    widest_simd!(each(g: &[f32], u: &[f32], out: &mut [f32]))
}

/// GPT-2's `gelu_new`: `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
#[inline]
pub(crate) fn gelu_new(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/π) rounded to f32
    0.5 * x * (1.0 + rounded(libm::tanh, C * (x + 0.044715 * (x * x * x))))
}

/// Softmax over one row in place; `-inf` entries become exactly 0. A row with no finite entry is
/// left all zeros (it cannot happen with a causal mask, which always keeps the diagonal).
///
/// `e_i = exp(x_i − max)` (f32 subtraction, then [`exp`]); the sum of the `e_i` is accumulated in
/// f64, whose rounding errors are far below an f32 ulp, so its f32 reciprocal `inv = 1/Σ` does not
/// depend on the summation order; `p_i = e_i · inv` in f32.
#[cfg(test)]
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
    // Masked entries: −∞ − max = −∞, whose exp is exactly 0.
    for v in row.iter_mut() {
        *v -= max;
    }
    exp_slice(row);
    let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
    let inv = (1.0 / sum) as f32;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// The largest value of `v` as the loop `if x > max { max = x }` from −∞ finds it (NaN never
/// taken), in 16 lanes so that it vectorizes: the maximum of a set does not depend on the order it
/// is visited in (a zero's sign may, which no later step sees: `x − (±0)` and `exp(±0)` agree).
#[inline(always)]
fn max_of(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            if x > *m {
                *m = x;
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        if x > max {
            max = x;
        }
    }
    max
}

/// Rows whose sums [`softmax_visible_rows`] advances together.
const SUM_ROWS: usize = 4;

/// [`softmax`] of each row of `rows` (`n` columns) whose entries outside `visible[i]` are masked
/// (as if −∞), with the same bits and the work done on the visible runs only. A masked entry's exp
/// is exactly 0, and adding +0 to the f64 sum, in front of the visible entries or after them, or
/// scaling it, changes nothing. Each row's f64 sum still adds its values left to right, but up to
/// [`SUM_ROWS`] rows' sums advance together, so that their additions overlap instead of each
/// waiting for the one before it.
///
/// Compiled for the widest instruction set the CPU has (the same operations in the same order on
/// every path).
pub fn softmax_visible_rows(rows: &mut [f32], n: usize, visible: &[std::ops::Range<usize>]) {
    widest_simd!(softmax_visible_rows_each(
        rows: &mut [f32],
        n: usize,
        visible: &[std::ops::Range<usize>]
    ))
}

/// [`softmax_visible_rows`]' body, inlined into each instruction set's copy.
#[inline(always)]
fn softmax_visible_rows_each(rows: &mut [f32], n: usize, visible: &[std::ops::Range<usize>]) {
    debug_assert_eq!(rows.len(), n * visible.len());
    if n == 0 {
        return;
    }
    for (chunk, runs) in rows.chunks_mut(SUM_ROWS * n).zip(visible.chunks(SUM_ROWS)) {
        let mut live: [&mut [f32]; SUM_ROWS] = Default::default();
        let mut count = 0;
        for (row, run) in chunk.chunks_exact_mut(n).zip(runs) {
            let (lo, hi) = (run.start, run.end.min(n));
            if lo >= hi {
                row.fill(0.0);
                continue;
            }
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            let v = &mut row[lo..hi];
            let max = max_of(v);
            if max == f32::NEG_INFINITY {
                v.fill(0.0);
                continue;
            }
            for x in v.iter_mut() {
                *x -= max;
            }
            exp_slice(v);
            live[count] = v;
            count += 1;
        }
        let live = &mut live[..count];
        let mut sums = [0f64; SUM_ROWS];
        let common = live.iter().map(|v| v.len()).min().unwrap_or(0);
        if let [a, b, c, d] = live {
            // Four sums in registers (an array indexed in the loop would round-trip memory).
            let (mut sa, mut sb, mut sc, mut sd) = (0f64, 0f64, 0f64, 0f64);
            for (((&x, &y), &z), &w) in a[..common]
                .iter()
                .zip(&b[..common])
                .zip(&c[..common])
                .zip(&d[..common])
            {
                sa += f64::from(x);
                sb += f64::from(y);
                sc += f64::from(z);
                sd += f64::from(w);
            }
            sums = [sa, sb, sc, sd];
        } else {
            for j in 0..common {
                for (s, v) in sums.iter_mut().zip(live.iter()) {
                    *s += f64::from(v[j]);
                }
            }
        }
        for (s, v) in sums.iter_mut().zip(live.iter()) {
            for &x in &v[common..] {
                *s += f64::from(x);
            }
        }
        for (s, v) in sums.iter().zip(live.iter_mut()) {
            let inv = (1.0 / s) as f32;
            for x in v.iter_mut() {
                *x *= inv;
            }
        }
    }
}

/// `x += y` element by element (the residual stream: `cols` values a row), rows shared out over the
/// GEMM's threads.
pub(crate) fn add_rows(x: &mut [f32], y: &[f32], cols: usize) {
    for_each_rows(x, cols, |r0, rows| {
        for (v, w) in rows.iter_mut().zip(&y[r0 * cols..]) {
            *v += w;
        }
    });
}

/// The first non-finite value in `x`, if any.
pub(crate) fn first_non_finite(x: &[f32]) -> Option<f32> {
    widest_simd!(first_non_finite_each(x: &[f32]) -> Option<f32>)
}

/// [`first_non_finite`]'s body: 64 values at a time looked at whole (no early exit inside, so the
/// compiler keeps them in vector registers), the first of a block that holds one found after.
#[inline(always)]
fn first_non_finite_each(x: &[f32]) -> Option<f32> {
    let mut blocks = x.chunks_exact(64);
    for block in &mut blocks {
        let bad = block.iter().fold(false, |bad, v| bad | !v.is_finite());
        if bad {
            return block.iter().copied().find(|v| !v.is_finite());
        }
    }
    blocks.remainder().iter().copied().find(|v| !v.is_finite())
}

/// The largest value of `v` (NaNs passed over; `-inf` when there is none).
pub(crate) fn max_value(v: &[f32]) -> f32 {
    widest_simd!(max_of(v: &[f32]) -> f32)
}

/// The largest and the second-largest values of `v`, as one scan that keeps the two would find
/// them (a value equal to the largest counts as the second; NaNs passed over; `-inf` for each one
/// missing).
pub(crate) fn top_two(v: &[f32]) -> (f32, f32) {
    widest_simd!(top_two_each(v: &[f32]) -> (f32, f32))
}

#[inline(always)]
fn top_two_each(v: &[f32]) -> (f32, f32) {
    let mut a = [f32::NEG_INFINITY; 16];
    let mut b = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for ((a, b), &x) in a.iter_mut().zip(b.iter_mut()).zip(c) {
            let above = x > *a;
            *b = if above {
                *a
            } else if x > *b {
                x
            } else {
                *b
            };
            *a = if above { x } else { *a };
        }
    }
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in a.iter().chain(&b).chain(chunks.remainder()) {
        if x > first {
            second = first;
            first = x;
        } else if x > second {
            second = x;
        }
    }
    (first, second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_finite_value_is_the_first_a_scan_meets() {
        for n in [0usize, 1, 63, 64, 65, 200, 49_152] {
            let clean: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
            assert_eq!(first_non_finite(&clean), None, "{n} values");
            for at in [0, n / 3, n.saturating_sub(1)] {
                if at >= n {
                    continue;
                }
                for bad in [f32::INFINITY, f32::NEG_INFINITY] {
                    let mut v = clean.clone();
                    v[at] = bad;
                    // A second, later one is not the first.
                    if at + 70 < n {
                        v[at + 70] = f32::NAN;
                    }
                    assert_eq!(first_non_finite(&v), Some(bad), "{n} values, at {at}");
                }
                let mut v = clean.clone();
                v[at] = f32::NAN;
                assert!(
                    first_non_finite(&v).is_some_and(f32::is_nan),
                    "{n} values, at {at}"
                );
            }
        }
    }

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

    /// A visible run gives the bits of the whole row with −∞ outside it, wherever the run lies.
    #[test]
    fn softmax_of_a_visible_run_equals_the_masked_row() {
        let base: Vec<f32> = (0..67)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.731)
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut masks = Vec::new();
        for (lo, hi) in [
            (0, 67),
            (0, 1),
            (0, 40),
            (13, 40),
            (66, 67),
            (5, 5),
            (30, 90),
        ] {
            let mut masked = base.clone();
            for (j, v) in masked.iter_mut().enumerate() {
                if j < lo || j >= hi {
                    *v = f32::NEG_INFINITY;
                }
            }
            softmax(&mut masked);
            let mut run = base.clone();
            softmax_visible_rows(&mut run, base.len(), std::slice::from_ref(&(lo..hi)));
            assert_eq!(bits(&run), bits(&masked), "visible {lo}..{hi}");
            masks.push((lo, hi, masked));
        }
        // Every count of rows, runs of unequal lengths together, through the multi-row path.
        for count in 1..=masks.len() {
            let mut rows: Vec<f32> = (0..count).flat_map(|_| base.iter().copied()).collect();
            let runs: Vec<_> = masks[..count].iter().map(|m| m.0..m.1).collect();
            softmax_visible_rows(&mut rows, base.len(), &runs);
            for (row, m) in rows.chunks_exact(base.len()).zip(&masks) {
                assert_eq!(
                    bits(row),
                    bits(&m.2),
                    "rows of {count}, run {}..{}",
                    m.0,
                    m.1
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
    fn the_vectorized_silu_gate_equals_the_scalar_one() {
        // Every 4099th f32 bit pattern that is finite, as gates (and shifted, as ups), plus edges:
        // whichever instruction set runs here must give `silu(g) · u` bit for bit.
        let mut g: Vec<f32> = (0..u32::MAX / 4099)
            .map(|i| f32::from_bits(i * 4099))
            .filter(|x| x.is_finite())
            .collect();
        g.extend([
            0.0,
            -0.0,
            88.7,
            -88.7,
            104.0,
            -104.0,
            1e-40,
            -1e-40,
            f32::MAX,
            f32::MIN,
        ]);
        let u: Vec<f32> = g.iter().map(|x| x * 0.75 + 1.0).collect();
        let mut got = vec![7.0];
        silu_mul(&g, &u, &mut got);
        assert_eq!(got[0], 7.0, "what was there is kept");
        let want: Vec<u32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| (silu(*g) * u).to_bits())
            .collect();
        let got: Vec<u32> = got[1..].iter().map(|v| v.to_bits()).collect();
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(first, None, "differs at gate {:?}", first.map(|i| g[i]));
    }

    #[test]
    fn activations_match_closed_forms() {
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-7);
        assert!((gelu_new(1.0) - 0.841_192).abs() < 1e-5);
    }
}
