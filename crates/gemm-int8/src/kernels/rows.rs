//! Products whose B is a row-major activation used once (attention's K rows and Vᵀ rows at a few
//! query rows): each cell one dot product of an A row and a B row, straight from the quantized rows,
//! with nothing packed. Packing B for the panel kernels costs more than such a product itself.
//!
//! The sums are exact: every product of two values in `-127..=127` fits i16 widened to i32 pairs
//! (`vpmaddwd`), and for K ≤ [`crate::MAX_K`] no partial sum leaves i32.

use crate::Isa;

/// Whether [`rows_dot`] runs on `isa` (AVX2 and the AVX-512 instruction sets; scalar packs B).
pub(crate) fn rows_available(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx)
}

/// `out[r][c] = Σ_k a[r][k] · b[c][k]` for rows `r < t` of `a` and rows `c` in `[c0, c1)` of `b`, on
/// `isa`'s kernel ([`rows_dot_avx512`] or [`rows_dot_avx2`]).
///
/// # Safety
/// [`rows_available`] for `isa`, which this CPU supports; the rest as [`rows_dot_avx512`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dot(
    isa: Isa,
    a: &[i8],
    t: usize,
    b: &[i8],
    k: usize,
    cols: (usize, usize),
    out: *mut i32,
    n: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if isa == Isa::Avx2 {
            rows_dot_avx2(a, t, b, k, cols, out, n)
        } else {
            rows_dot_avx512(a, t, b, k, cols, out, n)
        }
    }
}

/// `out[r][c] = Σ_k a[r][k] · b[c][k]` for rows `r < t` of `a` (`t × k`) and rows `c` in `[c0, c1)`
/// of `b` (`n × k`, `n = b.len() / k`): eight B rows against one A row at a time in eight
/// accumulators, summed across their lanes together (one transposing `vphaddd` tree instead of a
/// horizontal reduction per cell); the last `k mod 32` values by a masked load of zeros past them,
/// the last `< 8` B rows by repeating the last one and storing only theirs.
///
/// # Safety
/// This CPU supports AVX-512 F, BW and VL;
/// `a.len() == t·k`, `c1·k ≤ b.len()`, `c0 < c1`; `out` must point to `t × n` writable i32 that no
/// other thread touches in columns `[c0, c1)`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn rows_dot_avx512(
    a: &[i8],
    t: usize,
    b: &[i8],
    k: usize,
    (c0, c1): (usize, usize),
    out: *mut i32,
    n: usize,
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == t * k && b.len() >= c1 * k && c0 < c1 && c1 <= n);
    let main = k - k % 32;
    let tail: __mmask32 = if k.is_multiple_of(32) {
        0
    } else {
        (1u32 << (k % 32)) - 1
    };
    // 32 values at `p` (or the first `k mod 32` of them, zeros after) widened to i16.
    let load = |p: *const i8, full: bool| -> __m512i {
        // SAFETY: the caller's bounds: a full load lies inside its row, a masked one reads only
        // the row's last `k mod 32` bytes.
        unsafe {
            _mm512_cvtepi8_epi16(if full {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_maskz_loadu_epi8(tail, p)
            })
        }
    };
    for r in 0..t {
        let ar = a[r * k..].as_ptr();
        let mut c = c0;
        while c < c1 {
            let m = (c1 - c).min(8);
            // B rows c..c + 8, the last real one standing in for those past c1.
            let rows: [*const i8; 8] =
                std::array::from_fn(|j| b[(c + j.min(m - 1)) * k..].as_ptr());
            let mut acc = [_mm512_setzero_si512(); 8];
            let mut i = 0;
            while i < k {
                let full = i < main;
                // SAFETY: i < k: inside row r of A and each of the eight B rows.
                let av = load(unsafe { ar.add(i) }, full);
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let bv = load(unsafe { row.add(i) }, full);
                    *acc = _mm512_add_epi32(*acc, _mm512_madd_epi16(av, bv));
                }
                i += 32;
            }
            let h = acc.map(|z| {
                _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64::<1>(z))
            });
            let sums = sum_across(h);
            // SAFETY: cells (r, c..c + m) lie inside the caller's columns of `out`; the mask
            // stores only those.
            unsafe { _mm256_mask_storeu_epi32(out.add(r * n + c), ((1u16 << m) - 1) as u8, sums) };
            c += m;
        }
    }
}

/// [`rows_dot_avx512`] with AVX2: 32 values of a row at a time as `vpmaddubsw(|a|, sign(b, a))` (as
/// the AVX2 panel kernel: each pair sum is at most 2 · 127 · 127 < 2¹⁵, never saturating), widened
/// by `vpmaddwd` with ones; eight B rows against one A row in eight accumulators, summed across
/// their lanes together; the last `k mod 32` values from copies padded with zeros.
///
/// # Safety
/// This CPU supports AVX2; `a.len() == t·k`, `c1·k ≤ b.len()`, `c0 < c1`; `out` must point to
/// `t × n` writable i32 that no other thread touches in columns `[c0, c1)`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
unsafe fn rows_dot_avx2(
    a: &[i8],
    t: usize,
    b: &[i8],
    k: usize,
    (c0, c1): (usize, usize),
    out: *mut i32,
    n: usize,
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == t * k && b.len() >= c1 * k && c0 < c1 && c1 <= n);
    let main = k - k % 32;
    // The last `k mod 32` values of a row, zeros after.
    let padded = |row: &[i8]| -> __m256i {
        let mut buf = [0i8; 32];
        buf[..k - main].copy_from_slice(&row[main..k]);
        // SAFETY: `buf` is 32 bytes.
        unsafe { _mm256_loadu_si256(buf.as_ptr().cast()) }
    };
    let ones = _mm256_set1_epi16(1);
    for r in 0..t {
        let a_row = &a[r * k..(r + 1) * k];
        let a_tail = padded(a_row);
        let mut c = c0;
        while c < c1 {
            let m = (c1 - c).min(8);
            // B rows c..c + 8, the last real one standing in for those past c1.
            let rows: [&[i8]; 8] =
                std::array::from_fn(|j| &b[(c + j.min(m - 1)) * k..(c + j.min(m - 1) + 1) * k]);
            let mut acc = [_mm256_setzero_si256(); 8];
            let step = |acc: &mut [__m256i; 8], av: __m256i, bv: [__m256i; 8]| {
                let mag = _mm256_abs_epi8(av);
                for (acc, bv) in acc.iter_mut().zip(bv) {
                    let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(bv, av));
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
                }
            };
            let mut i = 0;
            while i < main {
                // SAFETY: i + 32 ≤ main ≤ k: inside row r of A and each of the eight B rows.
                let av = unsafe { _mm256_loadu_si256(a_row.as_ptr().add(i).cast()) };
                let bv = rows.map(|row| unsafe { _mm256_loadu_si256(row.as_ptr().add(i).cast()) });
                step(&mut acc, av, bv);
                i += 32;
            }
            if main < k {
                step(&mut acc, a_tail, rows.map(padded));
            }
            // SAFETY: cells (r, c..c + m) lie inside the caller's columns of `out`.
            unsafe { super::avx2::store_lanes(out.add(r * n + c), sum_across(acc), m, false) };
            c += m;
        }
    }
}

/// Eight vectors of eight i32 lanes each to the sum of each vector's lanes, in order: one
/// transposing `vphaddd` tree (the reduction both row kernels end a run of eight B rows with).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn sum_across(h: [std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
    let u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(h[4], h[5]), _mm256_hadd_epi32(h[6], h[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}
