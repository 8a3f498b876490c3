//! AVX-512 VNNI kernel: `vpdpbusd` (u8 × i8, four products per i32 lane, wrapping) on A + 128 against
//! the packed weights; `128 · Σ qb` is subtracted per channel, so the result is exact modulo 2³² and
//! therefore exact (the true sum fits i32 for K ≤ 131071).
//!
//! Register tile: up to 6 rows × 4 panels (64 channels) = 24 zmm accumulators, one broadcast of 4 bytes
//! of A per row and one 64-byte load of B per panel for each group of 4 K values.

use std::arch::x86_64::*;

use super::{KC_GROUPS, STREAM_MAX_T};
use crate::packed::{PANEL, PackedWeights};

const MR: usize = 6;
const NP: usize = 4;

/// See [`super::gemm_panels`]; `a` holds `qa + 128` as u8.
///
/// # Safety
/// As [`super::gemm_panels`], and the CPU must support avx512f, avx512bw and avx512vnni.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm_panels(
    a: &[u8],
    t: usize,
    k: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    let groups = b.groups();
    if groups == 0 {
        for r in 0..t {
            for col in p0 * PANEL..(p1 * PANEL).min(n) {
                // SAFETY: r < t, col < n, inside the caller's columns.
                unsafe { *out.add(r * n + col) = 0 };
            }
        }
        return;
    }
    let kc = if t <= STREAM_MAX_T { groups } else { KC_GROUPS };
    let tile = Tile {
        a: a.as_ptr(),
        k,
        lines: b.lines().as_ptr().cast(),
        groups,
        corr: b.corr().as_ptr(),
        out,
        n,
    };
    // Panels outermost: a column block of C (t × 64 i32) stays in L2 across K blocks, the K block of
    // B (`kc` groups × 4 panels) stays in L1 across every row of A.
    let mut p = p0;
    while p < p1 {
        let np = NP.min(p1 - p);
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + kc).min(groups);
            let mut r = 0;
            while r < t {
                let mr = MR.min(t - r);
                // SAFETY: r + mr ≤ t, p + np ≤ p1 ≤ panels, g1 ≤ groups; the caller's contract covers
                // the pointers in `tile`.
                unsafe { dispatch(&tile, mr, np, r, p, g0, g1) };
                r += mr;
            }
            g0 = g1;
        }
        p += np;
    }
}

struct Tile {
    a: *const u8,
    k: usize,
    lines: *const __m512i,
    groups: usize,
    corr: *const i32,
    out: *mut i32,
    n: usize,
}

macro_rules! dispatch_np {
    ($tile:expr, $m:literal, $np:expr, $r:expr, $p:expr, $g0:expr, $g1:expr) => {
        match $np {
            1 => micro::<$m, 1>($tile, $r, $p, $g0, $g1),
            2 => micro::<$m, 2>($tile, $r, $p, $g0, $g1),
            3 => micro::<$m, 3>($tile, $r, $p, $g0, $g1),
            _ => micro::<$m, 4>($tile, $r, $p, $g0, $g1),
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dispatch(tile: &Tile, mr: usize, np: usize, r: usize, p: usize, g0: usize, g1: usize) {
    // SAFETY: forwarded from `gemm_panels`.
    unsafe {
        match mr {
            1 => dispatch_np!(tile, 1, np, r, p, g0, g1),
            2 => dispatch_np!(tile, 2, np, r, p, g0, g1),
            3 => dispatch_np!(tile, 3, np, r, p, g0, g1),
            4 => dispatch_np!(tile, 4, np, r, p, g0, g1),
            5 => dispatch_np!(tile, 5, np, r, p, g0, g1),
            _ => dispatch_np!(tile, 6, np, r, p, g0, g1),
        }
    }
}

/// Rows `[r, r + M)` × panels `[p, p + P)` over K groups `[g0, g1)`; the first block stores
/// (subtracting the offset correction), later blocks add to what is stored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn micro<const M: usize, const P: usize>(
    tile: &Tile,
    r: usize,
    p: usize,
    g0: usize,
    g1: usize,
) {
    let mut acc = [[_mm512_setzero_si512(); P]; M];
    // SAFETY: the caller guarantees rows r..r+M < t, panels p..p+P < panels and groups g0..g1 ≤ groups,
    // so every A read (4 bytes at row·k + 4g, 4g + 4 ≤ kmain ≤ k) and every B line is in bounds; lines
    // are 64-byte aligned (`Line` is `align(64)`).
    unsafe {
        for g in g0..g1 {
            let mut bv = [_mm512_setzero_si512(); P];
            for (j, v) in bv.iter_mut().enumerate() {
                *v = _mm512_load_si512(tile.lines.add((p + j) * tile.groups + g));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let quad = tile
                    .a
                    .add((r + i) * tile.k + 4 * g)
                    .cast::<i32>()
                    .read_unaligned();
                let av = _mm512_set1_epi32(quad);
                for (c, v) in row.iter_mut().zip(&bv) {
                    *c = _mm512_dpbusd_epi32(*c, av, *v);
                }
            }
        }
        let first = g0 == 0;
        for j in 0..P {
            let col0 = (p + j) * PANEL;
            let valid = PANEL.min(tile.n - col0);
            let mask: __mmask16 = if valid == PANEL {
                0xFFFF
            } else {
                (1u16 << valid) - 1
            };
            let corr = _mm512_loadu_si512(tile.corr.add(col0).cast());
            for (i, row) in acc.iter().enumerate() {
                let dst = tile.out.add((r + i) * tile.n + col0);
                let v = if first {
                    _mm512_sub_epi32(row[j], corr)
                } else {
                    _mm512_add_epi32(row[j], _mm512_maskz_loadu_epi32(mask, dst))
                };
                _mm512_mask_storeu_epi32(dst, mask, v);
            }
        }
    }
}
