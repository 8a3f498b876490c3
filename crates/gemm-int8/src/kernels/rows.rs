//! Products whose B is a row-major activation used once (attention's K rows and Vᵀ rows at a few
//! query rows): each cell one dot product of an A row and a B row, straight from the quantized rows,
//! with nothing packed. Packing B for the panel kernels costs more than such a product itself.
//!
//! The sums are exact: every product of two values in `-127..=127` fits i16 widened to i32 pairs
//! (`vpmaddwd`), and for K ≤ [`crate::MAX_K`] no partial sum leaves i32.

use crate::Isa;

/// Whether [`rows_dot`] runs on `isa` (the AVX-512 instruction sets; the others pack B).
pub(crate) fn rows_available(isa: Isa) -> bool {
    matches!(isa, Isa::Avx512Vnni | Isa::Amx)
}

/// `out[r][c] = Σ_k a[r][k] · b[c][k]` for rows `r < t` of `a` (`t × k`) and rows `c` in `[c0, c1)`
/// of `b` (`n × k`, `n = b.len() / k`): eight B rows against one A row at a time in eight
/// accumulators, summed across their lanes together (one transposing `vphaddd` tree instead of a
/// horizontal reduction per cell); the last `k mod 32` values by a masked load of zeros past them,
/// the last `< 8` B rows by repeating the last one and storing only theirs.
///
/// # Safety
/// [`rows_available`] for an instruction set this CPU supports (AVX-512 F, BW and VL);
/// `a.len() == t·k`, `c1·k ≤ b.len()`, `c0 < c1`; `out` must point to `t × n` writable i32 that no
/// other thread touches in columns `[c0, c1)`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn rows_dot(
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
            let u0 =
                _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
            let u1 =
                _mm256_hadd_epi32(_mm256_hadd_epi32(h[4], h[5]), _mm256_hadd_epi32(h[6], h[7]));
            let sums = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(u0, u1),
                _mm256_permute2x128_si256::<0x31>(u0, u1),
            );
            // SAFETY: cells (r, c..c + m) lie inside the caller's columns of `out`; the mask
            // stores only those.
            unsafe { _mm256_mask_storeu_epi32(out.add(r * n + c), ((1u16 << m) - 1) as u8, sums) };
            c += m;
        }
    }
}
