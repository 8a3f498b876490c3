//! The integer kernels over the panel layout: a scalar loop (every target) and, on x86-64, AVX2,
//! AVX-512 VNNI and AMX-INT8, chosen at run time by [`crate::Isa`]. Each computes the grouped part of K (`K − K mod 4`)
//! for a range of panels; the leftover `K mod 4` is the shared scalar loop in `backend.rs`.

use crate::Isa;
use crate::packed::{PANEL, PackedWeights};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod paired;
#[cfg(target_arch = "x86_64")]
mod rows;
mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) use paired::PairedRows;
#[cfg(target_arch = "x86_64")]
pub(crate) use rows::{rows_available, rows_dot};

/// Write `out[r][col] = Σ_{k < kmain} qa[r][k] · qb[col][k]` for every row `r < t` and every column of
/// panels `[p0, p1)` that is below `n`.
///
/// `a` is `t × k` row-major: `qa + 128` as u8 for [`Isa::Avx512Vnni`], the i8 bytes otherwise.
///
/// # Safety
/// `isa` must be supported by this CPU; `a.len() == t·k`, `k == b.k()`, `p1 ≤ b.panels()`; `out` must
/// point to `t × n` writable i32 (`n == b.n()`) that no other thread touches in these columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_panels(
    isa: Isa,
    a: &[u8],
    t: usize,
    k: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    if b.groups() == 0 {
        // SAFETY: forwarded from the caller's contract.
        return unsafe { zero_columns(t, b, p0, p1, out, n) };
    }
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        match isa {
            Isa::Scalar => scalar::gemm_panels(a, t, k, b, p0, p1, out, n),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::gemm_panels(a, t, k, b, p0, p1, out, n),
            // Below `AMX_MIN_T` rows (the only calls that come here) AMX is AVX-512 VNNI.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni | Isa::Amx => avx512::gemm_panels(a, t, k, b, p0, p1, out, n),
            #[cfg(not(target_arch = "x86_64"))]
            _ => scalar::gemm_panels(a, t, k, b, p0, p1, out, n),
        }
    }
}

/// [`gemm_panels`] for rows `[r0, r1)` of an A widened for the paired AVX2 kernel; `out` points at
/// row `r0`'s first cell.
///
/// # Safety
/// avx2 (which [`PairedRows::new`] already needed); `a` widened from this product's A; `r0 ≤ r1 ≤`
/// its rows, `r0` a multiple of 4 (a register tile); `p1 ≤ b.panels()`; `out` must point to `(r1 − r0) × n` writable i32 (`n == b.n()`)
/// that no other thread touches in these columns.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn paired_panels(
    a: &PairedRows,
    r0: usize,
    r1: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        if b.groups() == 0 {
            return zero_columns(r1 - r0, b, p0, p1, out, n);
        }
        paired::paired_panels(a, r0, r1, b, p0, p1, out, n)
    }
}

/// Rows of A from which the AVX2 backend multiplies by pairs (`paired.rs`: B's widening, once per
/// panel and block of K a call, is then shared by at least four register tiles).
pub(crate) const PAIRED_MIN_T: usize = 16;

/// Rows of A in one strip of paired work: a panel's widened B serves eight register tiles.
pub(crate) const PAIRED_ROWS: usize = 32;

/// K groups per cache block, at most (K is cut into equal blocks no longer than this): a 4-panel tile
/// of B is up to `KC_GROUPS × 256` bytes (96 KiB), kept in L2 while every row of A passes over it.
/// Measured on Zen 4, blocking K more finely (down to L1-sized tiles) was no faster for K ≤ 1536.
pub(crate) const KC_GROUPS: usize = 384;

/// Rows of A in the widest register tile (the AVX-512 kernel's); work is cut in multiples of it.
pub(crate) const MR: usize = 6;

/// Panels in the widest register tile; work is cut in multiples of it.
pub(crate) const NP: usize = 4;

/// Groups ahead that a decode tile asks for B.
pub(crate) const PREFETCH_GROUPS: usize = 16;

/// Rows of A up to which K is not blocked (decode streams B once, front to back).
pub(crate) const STREAM_MAX_T: usize = 4;

/// Rows of A in one AMX tile (and groups of 4 K values in one B tile).
pub(crate) const AMX_TILE: usize = 16;

/// Rows of A in the AMX kernel's register block; row strips are cut in multiples of it.
pub(crate) const AMX_ROWS: usize = 2 * AMX_TILE;

/// Whether AMX-INT8 runs here, with the OS's permission for its tile state.
pub(crate) fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`gemm_panels`] in AMX tiles: `a` holds the rows as i8 bytes at row stride `kp` (a multiple of
/// 64, at least `K − K mod 4`), zero past each row's grouped part, and rows up to a multiple of
/// [`AMX_TILE`] past `t` (zero).
///
/// # Safety
/// [`amx_available`] must be true; `a` as above; the rest as [`gemm_panels`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn amx_panels(
    a: &[u8],
    kp: usize,
    t: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    if b.groups() == 0 {
        // SAFETY: forwarded from the caller's contract.
        return unsafe { zero_columns(t, b, p0, p1, out, n) };
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        amx::gemm_panels(a, kp, t, b, p0, p1, out, n)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, kp, t, b, p0, p1, out, n);
        unreachable!("AMX is never available off x86-64")
    }
}

/// With no group of 4 K values (K < 4) the grouped part of every sum is 0: write it.
///
/// # Safety
/// As [`gemm_panels`].
unsafe fn zero_columns(t: usize, b: &PackedWeights, p0: usize, p1: usize, out: *mut i32, n: usize) {
    debug_assert_eq!(n, b.n());
    for r in 0..t {
        for col in p0 * PANEL..(p1 * PANEL).min(n) {
            // SAFETY: r < t, col < n, inside the caller's columns.
            unsafe { *out.add(r * n + col) = 0 };
        }
    }
}
