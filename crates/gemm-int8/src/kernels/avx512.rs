//! AVX-512 VNNI kernel: `vpdpbusd` (u8 × i8, four products per i32 lane, wrapping) on A + 128 against
//! the packed weights; `128 · Σ qb` is subtracted per channel, so the result is exact modulo 2³² and
//! therefore exact (the true sum fits i32 for K ≤ 131071).
//!
//! Register tile: up to 6 rows × 4 panels (64 channels) = 24 zmm accumulators, one broadcast of 4 bytes
//! of A per row and one 64-byte load of B per panel for each group of 4 K values.

use std::arch::x86_64::*;

use super::{KC_GROUPS, MR, NP, PREFETCH_GROUPS, STREAM_MAX_T};
use crate::packed::{PANEL, PackedWeights};

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
    debug_assert!(groups > 0, "the dispatcher handles K < 4");
    let kc = if t <= STREAM_MAX_T {
        groups
    } else {
        groups.div_ceil(groups.div_ceil(KC_GROUPS))
    };
    let tile = Tile {
        stream: t <= STREAM_MAX_T,
        a: a.as_ptr(),
        k,
        corr: b.corr().as_ptr(),
        out,
        n,
    };
    // Panel blocks outermost: a column block of C (t × 64 i32) stays in L2 across K blocks, the K
    // block of B (`kc` groups × 4 panels, contiguous) stays in L1 across every row of A.
    let mut p = p0;
    while p < p1 {
        let (first, stride) = b.line_place(p);
        // The rest of p's block, within [p0, p1).
        let np = (stride - p % NP).min(p1 - p);
        // SAFETY: `first` is the index of a line of `b` (p < panels and groups > 0).
        let lines = unsafe { b.lines().as_ptr().add(first) }.cast::<__m512i>();
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + kc).min(groups);
            let mut r = 0;
            while r < t {
                let mr = MR.min(t - r);
                let at = At {
                    lines,
                    stride,
                    r,
                    p,
                    g0,
                    g1,
                };
                // SAFETY: r + mr ≤ t, p + np ≤ p1 ≤ panels and within one block, g1 ≤ groups; the
                // caller's contract covers the pointers in `tile`.
                unsafe { dispatch(&tile, mr, np, &at) };
                r += mr;
            }
            g0 = g1;
        }
        p += np;
    }
}

struct Tile {
    /// Decode (t ≤ [`STREAM_MAX_T`], K unblocked): prefetch B.
    stream: bool,
    a: *const u8,
    k: usize,
    corr: *const i32,
    out: *mut i32,
    n: usize,
}

/// Where a register tile works: rows from `r`, panels from `p` (whose group-0 line is `lines`, the
/// next group `stride` lines on, its block's later panels the lines right after), groups `[g0, g1)`.
#[derive(Clone, Copy)]
struct At {
    lines: *const __m512i,
    stride: usize,
    r: usize,
    p: usize,
    g0: usize,
    g1: usize,
}

macro_rules! dispatch_np {
    ($tile:expr, $m:literal, $np:expr, $at:expr) => {
        match $np {
            1 => micro::<$m, 1>($tile, $at),
            2 => micro::<$m, 2>($tile, $at),
            3 => micro::<$m, 3>($tile, $at),
            _ => micro::<$m, 4>($tile, $at),
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dispatch(tile: &Tile, mr: usize, np: usize, at: &At) {
    // SAFETY: forwarded from `gemm_panels`.
    unsafe {
        match mr {
            1 => dispatch_np!(tile, 1, np, at),
            2 => dispatch_np!(tile, 2, np, at),
            3 => dispatch_np!(tile, 3, np, at),
            4 => dispatch_np!(tile, 4, np, at),
            5 => dispatch_np!(tile, 5, np, at),
            _ => dispatch_np!(tile, 6, np, at),
        }
    }
}

/// Rows `[r, r + M)` × panels `[p, p + P)` over K groups `[g0, g1)`; the first block stores
/// (subtracting the offset correction), later blocks add to what is stored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn micro<const M: usize, const P: usize>(tile: &Tile, at: &At) {
    let At {
        lines,
        stride,
        r,
        p,
        g0,
        g1,
    } = *at;
    let mut acc = [[_mm512_setzero_si512(); P]; M];
    // SAFETY: the caller guarantees rows r..r+M < t, panels p..p+P < panels in one block and groups
    // g0..g1 ≤ groups, so every A read (4 bytes at row·k + 4g, 4g + 4 ≤ kmain ≤ k) and every B line is
    // in bounds, and so is every line prefetched (groups below g1 only); lines are 64-byte aligned
    // (`Line` is `align(64)`).
    unsafe {
        // Decode streams B from memory, one run of lines per unit: ask for the first lines of the
        // run at once, then keep requests a fixed distance ahead of the loads. Non-temporal: each
        // line is used once per token, and lines that pass through L2 (and from there to the
        // shared L3) evict what the rest of the token comes back to — a ring member's network
        // stack found cold took 45-65 µs to encrypt or decrypt one activation, against 8-12 µs warm.
        let stream = tile.stream;
        if stream {
            for g in g0..(g0 + PREFETCH_GROUPS).min(g1) {
                for j in 0..P {
                    _mm_prefetch::<_MM_HINT_NTA>(lines.add(g * stride + j).cast());
                }
            }
        }
        for g in g0..g1 {
            let line = lines.add(g * stride);
            if stream && g + PREFETCH_GROUPS < g1 {
                for j in 0..P {
                    _mm_prefetch::<_MM_HINT_NTA>(line.add(PREFETCH_GROUPS * stride + j).cast());
                }
            }
            let mut bv = [_mm512_setzero_si512(); P];
            for (j, v) in bv.iter_mut().enumerate() {
                *v = _mm512_load_si512(line.add(j));
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
