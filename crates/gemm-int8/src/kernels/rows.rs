//! Products whose B is a row-major activation used once (attention's K rows and Vᵀ rows at a few
//! query rows): each cell one dot product of an A row and a B row, straight from the quantized rows,
//! with nothing packed. Packing B for the panel kernels costs more than such a product itself.
//!
//! The sums are exact: every product of two values in `-127..=127` fits i16 widened to i32 pairs
//! (`vpmaddwd`), and for K ≤ [`crate::MAX_K`] no partial sum leaves i32.

use crate::Isa;

/// `out[r][c] = Σ_k a[r][k] · b[c][k]` for rows `r < t` of `a` (`t × k`) and rows `c` in `[c0, c1)`
/// of `b` (`n × k`, `n = b.len() / k`).
///
/// # Safety
/// `isa` must be supported by this CPU; `a.len() == t·k`, `c1·k ≤ b.len()`; `out` must point to
/// `t × n` writable i32 that no other thread touches in columns `[c0, c1)`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dot(
    isa: Isa,
    a: &[i8],
    t: usize,
    b: &[i8],
    k: usize,
    (c0, c1): (usize, usize),
    out: *mut i32,
    n: usize,
) {
    debug_assert!(a.len() == t * k && b.len() >= c1 * k && c1 <= n);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx512Vnni | Isa::Amx) && std::arch::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: forwarded from the caller (AVX-512 VNNI and AMX imply F and BW); VL was
        // detected just above.
        return unsafe { rows_dot_avx512(a, t, b, k, (c0, c1), out, n) };
    }
    for c in c0..c1 {
        let bc = &b[c * k..(c + 1) * k];
        for r in 0..t {
            let v = dot(isa, &a[r * k..(r + 1) * k], bc);
            // SAFETY: r < t and c < n: inside the caller's cells.
            unsafe { *out.add(r * n + c) = v };
        }
    }
}

/// [`rows_dot`] eight cells of a row of A at a time: eight B rows against one A row in eight
/// accumulators, summed across their lanes together (one transposing `vphaddd` tree instead of a
/// horizontal reduction per cell); the last `k mod 32` values by a masked load of zeros past them.
///
/// # Safety
/// As [`rows_dot`], and the CPU must support avx512f, avx512bw, avx512vl and avx2.
#[cfg(target_arch = "x86_64")]
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
        while c + 8 <= c1 {
            let mut acc = [_mm512_setzero_si512(); 8];
            let mut i = 0;
            while i < k {
                let full = i < main;
                // SAFETY: i < k: inside row r of A and rows c..c + 8 of B.
                let av = load(unsafe { ar.add(i) }, full);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let bv = load(unsafe { b.as_ptr().add((c + j) * k + i) }, full);
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
            // SAFETY: cells (r, c..c + 8) lie inside the caller's columns of `out`.
            unsafe { _mm256_storeu_si256(out.add(r * n + c).cast(), sums) };
            c += 8;
        }
        for c in c..c1 {
            // SAFETY: the CPU supports AVX-512 F and BW (this function's features).
            let v = unsafe { dot_avx512(&a[r * k..(r + 1) * k], &b[c * k..(c + 1) * k]) };
            // SAFETY: r < t and c < n: inside the caller's cells.
            unsafe { *out.add(r * n + c) = v };
        }
    }
}

/// One exact dot product of two i8 rows of equal length.
#[inline]
fn dot(isa: Isa, x: &[i8], y: &[i8]) -> i32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend only runs an instruction set this CPU supports; AVX-512 VNNI and AMX
        // imply AVX-512 F and BW.
        Isa::Avx512Vnni | Isa::Amx => unsafe { dot_avx512(x, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { dot_avx2(x, y) },
        _ => dot_scalar(x, y),
    }
}

fn dot_scalar(x: &[i8], y: &[i8]) -> i32 {
    x.iter()
        .zip(y)
        .map(|(&p, &q)| i32::from(p) * i32::from(q))
        .sum()
}

/// # Safety
/// The CPU must support avx512f and avx512bw.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot_avx512(x: &[i8], y: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let len = x.len().min(y.len());
    let main = len - len % 32;
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    while i < main {
        // SAFETY: i + 32 ≤ main ≤ both lengths.
        let (p, q) = unsafe {
            (
                _mm256_loadu_si256(x.as_ptr().add(i).cast()),
                _mm256_loadu_si256(y.as_ptr().add(i).cast()),
            )
        };
        let pairs = _mm512_madd_epi16(_mm512_cvtepi8_epi16(p), _mm512_cvtepi8_epi16(q));
        acc = _mm512_add_epi32(acc, pairs);
        i += 32;
    }
    _mm512_reduce_add_epi32(acc) + dot_scalar(&x[main..len], &y[main..len])
}

/// # Safety
/// The CPU must support avx2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(x: &[i8], y: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let len = x.len().min(y.len());
    let main = len - len % 16;
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    while i < main {
        // SAFETY: i + 16 ≤ main ≤ both lengths.
        let (p, q) = unsafe {
            (
                _mm_loadu_si128(x.as_ptr().add(i).cast()),
                _mm_loadu_si128(y.as_ptr().add(i).cast()),
            )
        };
        let pairs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(p), _mm256_cvtepi8_epi16(q));
        acc = _mm256_add_epi32(acc, pairs);
        i += 16;
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` holds 32 bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc) };
    lanes.iter().sum::<i32>() + dot_scalar(&x[main..len], &y[main..len])
}
