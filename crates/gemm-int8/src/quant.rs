//! Row quantization (DESIGN.md §3.1–3.3): one f32 scale per row, values rounded ties-to-even into ±127.

use std::mem::MaybeUninit;
use std::sync::Mutex;

use crate::{Error, MAX_K, Operand};

/// Rows of i8 values in `-127..=127`, row-major `rows × k`, with one scale per row.
///
/// A row whose largest magnitude is below `f32::MIN_POSITIVE` (zero or subnormal) is all zeros with
/// scale 0. The fields are private so every `Quantized` keeps these invariants; read them with the
/// accessors.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    rows: usize,
    k: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
}

impl Quantized {
    /// Assemble already-quantized rows, checking lengths, `k ≤ 131071`, values in `-127..=127` and
    /// scales finite and non-negative.
    pub fn from_parts(rows: usize, k: usize, q: Vec<i8>, scales: Vec<f32>) -> Result<Self, Error> {
        check_k(k)?;
        let expected = rows.checked_mul(k).ok_or(Error::Shape {
            what: "quantized rows",
            got: usize::MAX,
            expected: usize::MAX,
        })?;
        if q.len() != expected {
            return Err(Error::Shape {
                what: "quantized values",
                got: q.len(),
                expected,
            });
        }
        if scales.len() != rows {
            return Err(Error::Shape {
                what: "row scales",
                got: scales.len(),
                expected: rows,
            });
        }
        if let Some(index) = q.iter().position(|&v| v == i8::MIN) {
            return Err(Error::OutOfRange {
                value: i32::from(i8::MIN),
                row: index / k,
                col: index % k,
            });
        }
        if let Some(row) = scales.iter().position(|s| !s.is_finite() || *s < 0.0) {
            return Err(Error::BadScale {
                value: scales[row],
                row,
            });
        }
        Ok(Self { rows, k, q, scales })
    }

    /// No rows yet, `k` wide: a key cache that [`Quantized::append`] grows.
    pub fn empty(k: usize) -> Result<Self, Error> {
        Self::from_parts(0, k, Vec::new(), Vec::new())
    }

    /// The values' and the scales' memory, for [`quantize_reusing`].
    pub(crate) fn into_buffers(self) -> (Vec<i8>, Vec<f32>) {
        (self.q, self.scales)
    }

    /// Append the rows of `other` (rows quantize independently, so this is what quantizing all the
    /// rows together gives).
    pub fn append(&mut self, other: &Quantized) -> Result<(), Error> {
        if other.k != self.k {
            return Err(Error::Shape {
                what: "appended row length",
                got: other.k,
                expected: self.k,
            });
        }
        self.q.extend_from_slice(&other.q);
        self.scales.extend_from_slice(&other.scales);
        self.rows += other.rows;
        Ok(())
    }

    /// Keep the first `rows` rows (each row's scale is its own, so the rest is unchanged); no-op when
    /// there are fewer.
    pub fn truncate(&mut self, rows: usize) {
        if rows < self.rows {
            self.q.truncate(rows * self.k);
            self.scales.truncate(rows);
            self.rows = rows;
        }
    }

    /// The first `rows` rows and, of each, its first `cols` values, into `(q, scales)`' memory.
    /// Each row keeps the scale of its whole length, so this is not what quantizing the shorter
    /// rows would give: it is the operand of a product whose other operand is zero past column
    /// `cols` (attention's causal triangle), whose cells are then exactly those of the whole rows.
    pub(crate) fn leading_into(
        &self,
        rows: usize,
        cols: usize,
        (mut q, mut scales): (Vec<i8>, Vec<f32>),
    ) -> Result<Quantized, Error> {
        if rows > self.rows || cols > self.k {
            return Err(Error::Shape {
                what: "leading corner of quantized rows",
                got: rows.max(cols),
                expected: if rows > self.rows { self.rows } else { self.k },
            });
        }
        q.clear();
        scales.clear();
        q.reserve(rows * cols);
        if cols == self.k {
            q.extend_from_slice(&self.q[..rows * cols]);
        } else {
            for row in self.q.chunks_exact(self.k).take(rows) {
                q.extend_from_slice(&row[..cols]);
            }
        }
        scales.extend_from_slice(&self.scales[..rows]);
        Ok(Quantized {
            rows,
            k: cols,
            q,
            scales,
        })
    }

    /// Rows whose invariants the caller already holds (unpacked from a `PackedWeights`).
    pub(crate) fn from_raw(rows: usize, k: usize, q: Vec<i8>, scales: Vec<f32>) -> Self {
        Self { rows, k, q, scales }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The values, row-major `rows × k`.
    pub fn q(&self) -> &[i8] {
        &self.q
    }

    /// Row `r` of the values.
    pub fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..(r + 1) * self.k]
    }

    /// One scale per row (`m / 127`, or 0 for a zero or subnormal row).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
}

pub(crate) fn check_k(k: usize) -> Result<(), Error> {
    if k > MAX_K {
        return Err(Error::KTooLarge { k });
    }
    Ok(())
}

/// Quantize the rows of an activation matrix `a` (`rows × k`, row-major), the A operand of a GEMM.
///
/// Refuses a non-finite element (naming operand A, its row and column) and `k > 131071`.
pub fn quantize_rows(a: &[f32], rows: usize, k: usize) -> Result<Quantized, Error> {
    quantize(Operand::A, a, rows, k)
}

/// The second plane of `a` under the two-plane precision (DESIGN.md §3.9): each element's residual
/// `a − f32(q)·s` against its first plane `first` (= `quantize_rows(a)`: one f32 multiply, then one
/// f32 subtraction, never fused), quantized per row like any operand. `first` plus this plane carry
/// about 15 bits of each row instead of 8.
pub fn quantize_residual(a: &[f32], first: &Quantized) -> Result<Quantized, Error> {
    let (rows, k) = (first.rows, first.k);
    if a.len() != rows * k {
        return Err(Error::Shape {
            what: "rows of the residual",
            got: a.len(),
            expected: rows * k,
        });
    }
    let mut r = Vec::with_capacity(a.len());
    if k > 0 {
        for ((x, q), s) in a
            .chunks_exact(k)
            .zip(first.q.chunks_exact(k))
            .zip(&first.scales)
        {
            r.extend(x.iter().zip(q).map(|(x, q)| x - f32::from(*q) * s));
        }
    }
    quantize(Operand::A, &r, rows, k)
}

/// Quantize `rows × k` values, naming `operand` in a refusal.
pub(crate) fn quantize(
    operand: Operand,
    x: &[f32],
    rows: usize,
    k: usize,
) -> Result<Quantized, Error> {
    quantize_reusing(operand, x, rows, k, (Vec::new(), Vec::new()))
}

/// [`quantize`] into the memory of `spare` (the buffers of an earlier result, see
/// [`Quantized::into_buffers`]), so that a caller that quantizes the same shapes over and over does
/// not allocate each time. What `spare` held is irrelevant: every value is written.
pub(crate) fn quantize_reusing(
    operand: Operand,
    x: &[f32],
    rows: usize,
    k: usize,
    (mut q, mut scales): (Vec<i8>, Vec<f32>),
) -> Result<Quantized, Error> {
    check_k(k)?;
    let expected = rows.checked_mul(k).ok_or(Error::Shape {
        what: "rows × k",
        got: usize::MAX,
        expected: usize::MAX,
    })?;
    if x.len() != expected {
        return Err(Error::Shape {
            what: operand.matrix_name(),
            got: x.len(),
            expected,
        });
    }
    scales.clear();
    scales.resize(rows, 0.0);
    q.clear();
    if k == 0 {
        return Ok(Quantized { rows, k, q, scales });
    }
    let per = crate::pool::rows_per_chunk(rows, k, crate::PARALLEL_MIN_ELEMENTS);
    // Each row is written whole by `quantize_row` (on the thread that quantizes it) before `q`
    // takes its length.
    q.reserve(expected);
    let q_rows = &mut q.spare_capacity_mut()[..expected];
    // Rows `[r0, …)` of `x` into `q` and `scales`; the first refusal by row order.
    type Rows<'a> = (
        usize,
        (&'a [f32], (&'a mut [MaybeUninit<i8>], &'a mut [f32])),
    );
    let job = |(r0, (x, (q, scales))): Rows<'_>| {
        for (i, ((row, out), scale)) in x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(k))
            .zip(scales.iter_mut())
            .enumerate()
        {
            *scale = quantize_row(row, out, None).map_err(|col| Error::NonFinite {
                operand,
                row: r0 + i,
                col,
                value: row[col],
            })?;
        }
        Ok(())
    };
    if per >= rows {
        job((0, (x, (q_rows, &mut scales))))?;
    } else {
        let first: Mutex<Option<Error>> = Mutex::new(None);
        let items: Vec<_> = (0..rows)
            .step_by(per)
            .zip(
                x.chunks(per * k)
                    .zip(q_rows.chunks_mut(per * k).zip(scales.chunks_mut(per))),
            )
            .collect();
        crate::pool::for_each_item(items, |item| {
            if let Err(e) = job(item) {
                let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
                let earlier = match (&*first, &e) {
                    (Some(Error::NonFinite { row: old, .. }), Error::NonFinite { row, .. }) => {
                        row < old
                    }
                    (None, _) => true,
                    _ => false,
                };
                if earlier {
                    *first = Some(e);
                }
            }
        });
        if let Some(e) = first.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
    }
    // SAFETY: no refusal, so every row of the first `expected` elements was written above.
    unsafe { q.set_len(expected) };
    Ok(Quantized { rows, k, q, scales })
}

simd_versions! {
    /// Quantize one row into `out` and return its scale; a non-finite element is refused by its
    /// column. With `known`, the values are finite and `known` is the largest magnitude (its bits)
    /// of the row they belong to — part of a row then quantizes as the whole row does.
    fn quantize_row(
        row: &[f32],
        out: &mut [MaybeUninit<i8>],
        known: Option<u32>,
    ) -> Result<f32, usize> {
        let max_bits = match known {
            Some(bits) => bits,
            None => magnitude_bits(row),
        };
        if max_bits >= f32::INFINITY.to_bits() {
            return Err(row.iter().position(|v| !v.is_finite()).unwrap_or(0));
        }
        Ok(quantize_with_max(row, out, max_bits))
    }
}

/// The bits of the largest magnitude in `row` (|v| ordered as f32 is |v| ordered as its bits;
/// anything at or above +inf's bits is not finite).
#[inline(always)]
fn magnitude_bits(row: &[f32]) -> u32 {
    row.iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF))
}

/// Quantize the finite values of `row` into `out` against the largest magnitude of the row they
/// belong to (its bits: `max_bits`, finite); returns the row's scale. Each value's quantization
/// depends on itself and that magnitude only, so part of a row quantizes as the whole row does.
#[inline(always)]
fn quantize_with_max(row: &[f32], out: &mut [MaybeUninit<i8>], max_bits: u32) -> f32 {
    let m = f32::from_bits(max_bits);
    if m < f32::MIN_POSITIVE {
        out.fill(MaybeUninit::new(0));
        return 0.0; // zeros, scale 0
    }
    let scale = m / 127.0;
    let inv = 127.0 / m;
    if inv.is_finite() {
        for (o, &v) in out.iter_mut().zip(row) {
            o.write(round_clamp_finite(v * inv));
        }
    } else {
        // For m < 3.8e-37 `inv` overflows to +inf; `0 · inf` is NaN, which `as i8` maps to 0, and
        // every other element saturates to ±127. That is the contract read literally, and it is the
        // same on every machine because quantization only ever runs here.
        for (o, &v) in out.iter_mut().zip(row) {
            o.write((v * inv).round_ties_even().clamp(-127.0, 127.0) as i8);
        }
    }
    scale
}

/// Rows that grow by columns, kept quantized as they grow: attention's Vᵀ (a row per value channel,
/// a column per position), appended one position at a time at decode.
///
/// A row's quantization depends on its largest magnitude only, so new columns quantize alone
/// while that stays the same, and only a row whose largest magnitude changed is quantized again
/// (from its f32 values, kept here). [`GrowingRows::quantized`] is always exactly what quantizing
/// the rows' values whole gives. Made with `quantized: false`, only the f32 values are kept.
#[derive(Clone, Debug)]
pub struct GrowingRows {
    /// The f32 values: row `r` at `r · cap`, its first `len` columns held.
    values: Vec<f32>,
    cap: usize,
    /// Each row's largest magnitude (its bits).
    max_bits: Vec<u32>,
    /// The rows quantized (`rows × len`), when kept.
    q: Option<Quantized>,
    rows: usize,
    len: usize,
}

impl GrowingRows {
    /// `rows` rows of no columns, kept quantized as well when `quantized`.
    pub fn new(rows: usize, quantized: bool) -> Self {
        Self {
            values: Vec::new(),
            cap: 0,
            max_bits: vec![0; rows],
            q: quantized.then(|| Quantized {
                rows,
                k: 0,
                q: Vec::new(),
                scales: vec![0.0; rows],
            }),
            rows,
            len: 0,
        }
    }

    /// Columns held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no column is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rows quantized (`rows × len`, one scale per row), when they are kept.
    pub fn quantized(&self) -> Option<&Quantized> {
        self.q.as_ref()
    }

    /// Row `r`'s f32 values (`len` of them).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.values[r * self.cap..r * self.cap + self.len]
    }

    /// Append `t` columns, given column after column (`cols[j · rows + r]` is row r of new column
    /// j). When the rows are kept quantized, a non-finite value is refused by its row and column,
    /// and nothing changes.
    pub fn push_columns(&mut self, cols: &[f32], t: usize) -> Result<(), Error> {
        let (rows, len) = (self.rows, self.len);
        if cols.len() != t * rows {
            return Err(Error::Shape {
                what: "appended columns",
                got: cols.len(),
                expected: t * rows,
            });
        }
        check_k(len + t)?;
        if let Some(i) = cols
            .iter()
            .position(|v| !v.is_finite())
            .filter(|_| self.q.is_some())
        {
            return Err(Error::NonFinite {
                operand: Operand::B,
                row: i % rows.max(1),
                col: len + i / rows.max(1),
                value: cols[i],
            });
        }
        if t == 0 || rows == 0 {
            self.len = len + t;
            if let Some(q) = &mut self.q {
                q.k = len + t;
            }
            return Ok(());
        }
        let k = len + t;
        if k > self.cap {
            let cap = k.max(2 * self.cap).max(16);
            let mut wider = vec![0f32; rows * cap];
            if self.cap > 0 {
                for (new, old) in wider
                    .chunks_exact_mut(cap)
                    .zip(self.values.chunks_exact(self.cap))
                {
                    new[..len].copy_from_slice(&old[..len]);
                }
            }
            self.values = wider;
            self.cap = cap;
        }
        let cap = self.cap;
        for (j, col) in cols.chunks_exact(rows).enumerate() {
            for (r, &v) in col.iter().enumerate() {
                self.values[r * cap + len + j] = v;
            }
        }
        self.len = k;
        let Some(quantized) = &mut self.q else {
            return Ok(());
        };
        // Widen every quantized row in place, last row first (each moves right).
        let q = &mut quantized.q;
        q.resize(rows * k, 0);
        for r in (1..rows).rev() {
            q.copy_within(r * len..(r + 1) * len, r * k);
        }
        for r in 0..rows {
            let row = &self.values[r * cap..r * cap + k];
            let old = self.max_bits[r];
            let max = old.max(magnitude_bits(&row[len..]));
            let out = as_uninit(&mut q[r * k..(r + 1) * k]);
            let scale = if max == old {
                rescale(&row[len..], &mut out[len..], max)
            } else {
                rescale(row, out, max)
            };
            self.max_bits[r] = max;
            quantized.scales[r] = scale;
        }
        quantized.k = k;
        Ok(())
    }

    /// Keep the first `len` columns (no-op when there are fewer); rows whose largest magnitude was
    /// among the dropped columns are quantized again.
    pub fn truncate(&mut self, len: usize) {
        let (rows, old_len) = (self.rows, self.len);
        if len >= old_len {
            return;
        }
        self.len = len;
        let Some(quantized) = &mut self.q else {
            return;
        };
        let q = &mut quantized.q;
        for r in 0..rows {
            let row = &self.values[r * self.cap..r * self.cap + len];
            let max = magnitude_bits(row);
            q.copy_within(r * old_len..r * old_len + len, r * len);
            let out = as_uninit(&mut q[r * len..(r + 1) * len]);
            if max != self.max_bits[r] {
                quantized.scales[r] = rescale(row, out, max);
                self.max_bits[r] = max;
            }
        }
        q.truncate(rows * len);
        quantized.k = len;
    }
}

/// [`quantize_row`] of finite values against their row's largest magnitude `max` (its bits), which
/// cannot refuse them.
fn rescale(row: &[f32], out: &mut [MaybeUninit<i8>], max: u32) -> f32 {
    match quantize_row(row, out, Some(max)) {
        Ok(scale) => scale,
        Err(_) => unreachable!("a row of finite values has a finite largest magnitude"),
    }
}

/// Initialized bytes viewed as possibly uninitialized, to be written over.
fn as_uninit(q: &mut [i8]) -> &mut [MaybeUninit<i8>] {
    // SAFETY: `MaybeUninit<i8>` has the layout of `i8`, and only initialized values are written
    // through the view.
    unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast(), q.len()) }
}

/// `clamp(round_ties_even(y), -127, 127) as i8` for finite `y`, written so it vectorizes
/// (`round_ties_even` is a library call on baseline x86-64, and `as i8` a saturating conversion).
///
/// Clamping first changes nothing: rounding is monotonic and ±127 are integers. For |y| ≤ 127,
/// `y + 1.5·2²³` lies in [2²³, 2²⁴), where the f32 spacing is exactly 1, so the addition rounds `y` to an
/// integer ties-to-even (the IEEE default mode, which Rust never changes), and that integer is the
/// sum's bit pattern minus the bits of 1.5·2²³.
#[inline]
pub(crate) fn round_clamp_finite(y: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    let biased = y.clamp(-127.0, 127.0) + MAGIC;
    (biased.to_bits() as i32 - MAGIC.to_bits() as i32) as i8
}

#[cfg(test)]
mod tests {
    use super::round_clamp_finite as round_clamp;

    /// Against the definition on every f32 from 2⁻² to 130 (both signs) and the finite special values.
    #[test]
    fn round_clamp_is_round_ties_even_then_clamp() {
        let definition = |y: f32| y.round_ties_even().clamp(-127.0, 127.0) as i8;
        for bits in 0x3E80_0000u32..=0x4302_0000 {
            for y in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(round_clamp(y), definition(y), "{y:e}");
            }
        }
        let special = [0.0, -0.0, 1e-45, -1e-45, 0.2499, f32::MAX, -f32::MAX, 1e30];
        for y in special {
            assert_eq!(round_clamp(y), definition(y), "{y:e}");
        }
    }

    /// Growing rows by columns, in steps of one and of several, with rows whose largest magnitude
    /// rises late, stays, or falls back when columns are dropped (and an all-zero row), always
    /// quantize as the whole rows do; a mutant (a column's value changed behind the cache's back)
    /// shows. A non-finite column is refused by its place and changes nothing.
    #[test]
    fn growing_rows_quantize_as_the_whole_rows() {
        let rows = 5;
        let value = |r: usize, c: usize| -> f32 {
            match r {
                0 => 0.0,
                1 => (c as f32 * 0.37).sin(),
                2 => c as f32 * 0.5 - 3.0,
                3 => ((c * 7919 % 101) as f32 - 50.0) * 1e-3,
                _ => 1e-39 * c as f32,
            }
        };
        let column = |c: usize| (0..rows).map(move |r| value(r, c));
        let whole = |len: usize| {
            let x: Vec<f32> = (0..rows)
                .flat_map(|r| (0..len).map(move |c| value(r, c)))
                .collect();
            super::quantize_rows(&x, rows, len).unwrap()
        };
        let mut g = super::GrowingRows::new(rows, true);
        let mut len = 0;
        for step in [1, 1, 3, 1, 8, 1, 1, 20, 1] {
            let cols: Vec<f32> = (len..len + step).flat_map(column).collect();
            g.push_columns(&cols, step).unwrap();
            len += step;
            assert_eq!(g.quantized().unwrap(), &whole(len), "after {len} columns");
        }
        for back in [30, 31, 12, 2] {
            g.truncate(back);
            assert_eq!(g.quantized().unwrap(), &whole(back), "truncated to {back}");
            let cols: Vec<f32> = (back..back + 2).flat_map(column).collect();
            g.push_columns(&cols, 2).unwrap();
            assert_eq!(g.quantized().unwrap(), &whole(back + 2));
        }
        assert_eq!(
            g.row(2),
            &(0..4).map(|c| value(2, c)).collect::<Vec<_>>()[..]
        );
        let before = g.quantized().unwrap().clone();
        let mut bad: Vec<f32> = column(4).collect();
        bad[3] = f32::NAN;
        let err = g.push_columns(&bad, 1).unwrap_err();
        assert!(
            matches!(err, super::Error::NonFinite { row: 3, col: 4, .. }),
            "{err:?}"
        );
        assert_eq!(g.quantized().unwrap(), &before);
        assert_eq!(g.len(), 4);
        // Mutation: a kept column whose value differs from the one quantized shows.
        let mut m = super::GrowingRows::new(rows, true);
        let cols: Vec<f32> = (0..6).flat_map(column).collect();
        m.push_columns(&cols, 6).unwrap();
        let mut x: Vec<f32> = (0..rows)
            .flat_map(|r| (0..6).map(move |c| value(r, c)))
            .collect();
        x[2 * 6 + 1] += 0.25;
        assert_ne!(
            m.quantized().unwrap(),
            &super::quantize_rows(&x, rows, 6).unwrap()
        );
        // Kept as f32 only: no quantized rows, nothing refused.
        let mut f = super::GrowingRows::new(rows, false);
        f.push_columns(&bad, 1).unwrap();
        assert!(f.quantized().is_none() && f.row(3)[0].is_nan());
    }

    /// The second plane holds what the first dropped: each element's residual against the first
    /// plane, computed as `x − f32(q)·s` in f32 and quantized per row; the two planes together are
    /// far closer to the row than the first alone. A row of zeros stays zeros; a shape is checked.
    #[test]
    fn the_residual_plane_is_the_quantized_f32_residual() {
        let (rows, k) = (3, 37);
        let mut x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 3.0)
            .collect();
        x[2 * k..].fill(0.0);
        let first = super::quantize_rows(&x, rows, k).unwrap();
        let second = super::quantize_residual(&x, &first).unwrap();
        let r: Vec<f32> = x
            .chunks(k)
            .zip(first.q().chunks(k).zip(first.scales()))
            .flat_map(|(x, (q, s))| x.iter().zip(q).map(move |(x, q)| x - f32::from(*q) * s))
            .collect();
        let want = super::quantize_rows(&r, rows, k).unwrap();
        assert_eq!(second.q(), want.q());
        assert_eq!(second.scales(), want.scales());
        for row in 0..2 {
            let (s1, s2) = (first.scales()[row], second.scales()[row]);
            assert!(
                s2 > 0.0 && s2 <= s1 / 2.0 / 127.0 * 1.001,
                "row {row}: {s2} vs {s1}"
            );
            let worst = |planes: &[&super::Quantized]| {
                (0..k)
                    .map(|c| {
                        let v: f32 = planes
                            .iter()
                            .map(|p| f32::from(p.row(row)[c]) * p.scales()[row])
                            .sum();
                        (v - x[row * k + c]).abs()
                    })
                    .fold(0f32, f32::max)
            };
            assert!(worst(&[&first, &second]) * 100.0 < worst(&[&first]));
        }
        assert!(second.row(2).iter().all(|q| *q == 0) && second.scales()[2] == 0.0);
        assert!(super::quantize_residual(&x[1..], &first).is_err());
    }
}
