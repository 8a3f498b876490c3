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
    let mut scales = vec![0f32; rows];
    if k == 0 {
        return Ok(Quantized {
            rows,
            k,
            q: Vec::new(),
            scales,
        });
    }
    let per = crate::pool::rows_per_chunk(rows, k, crate::PARALLEL_MIN_ELEMENTS);
    // Each row is written whole by `quantize_row` (on the thread that quantizes it) before `q`
    // takes its length.
    let mut q: Vec<i8> = Vec::with_capacity(expected);
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
            quantize_row(row, out, scale).map_err(|col| Error::NonFinite {
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

/// Quantize one row into `out`, setting `scale`; a non-finite element is refused by its column.
///
/// Compiled three times, for baseline x86-64, AVX2 and AVX-512 (only integer ops and single IEEE
/// operations, so every copy gives the same bits); the widest the CPU runs is chosen at run time.
fn quantize_row(row: &[f32], out: &mut [MaybeUninit<i8>], scale: &mut f32) -> Result<(), usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: AVX-512 F and BW were detected just above (BW implies F).
        return unsafe { quantize_row_avx512(row, out, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        return unsafe { quantize_row_avx2(row, out, scale) };
    }
    quantize_row_impl(row, out, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(
    row: &[f32],
    out: &mut [MaybeUninit<i8>],
    scale: &mut f32,
) -> Result<(), usize> {
    quantize_row_impl(row, out, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(
    row: &[f32],
    out: &mut [MaybeUninit<i8>],
    scale: &mut f32,
) -> Result<(), usize> {
    quantize_row_impl(row, out, scale)
}

#[inline(always)]
fn quantize_row_impl(
    row: &[f32],
    out: &mut [MaybeUninit<i8>],
    scale: &mut f32,
) -> Result<(), usize> {
    // |v| ordered as f32 is |v| ordered as its bits; anything at or above +inf's bits is not finite.
    let max_bits = row
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
    if max_bits >= f32::INFINITY.to_bits() {
        return Err(row.iter().position(|v| !v.is_finite()).unwrap_or(0));
    }
    let m = f32::from_bits(max_bits);
    if m < f32::MIN_POSITIVE {
        out.fill(MaybeUninit::new(0));
        return Ok(()); // zeros, scale 0
    }
    *scale = m / 127.0;
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
    Ok(())
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
