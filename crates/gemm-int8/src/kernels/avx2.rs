//! AVX2 kernel: `vpmaddubsw` needs u8 × i8 and saturates its pair sums at i16, so it takes |a| against
//! `sign(b, a)` (`vpsignb`): each pair sum is at most 2 · 127 · 127 = 32258 < 2¹⁵, never saturating;
//! `vpmaddwd` with ones then widens to i32. A 64-byte panel line is two ymm of 8 channels × 4 K values.
//!
//! Register tile: up to 4 rows × 1 panel (16 channels) = 8 ymm accumulators; one row (decode) × a
//! block of [`NP`] panels, read in the order they lie.

use std::arch::x86_64::*;

use super::{KC_GROUPS, NP, PREFETCH_GROUPS, STREAM_MAX_T};
use crate::packed::{PANEL, PackedWeights};

const MR: usize = 4;

/// See [`super::gemm_panels`]; `a` holds the i8 bytes.
///
/// # Safety
/// As [`super::gemm_panels`], and the CPU must support avx2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
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
    if t == 1 {
        // SAFETY: the caller's contract.
        return unsafe { row_panels(a, b, p0, p1, out, n) };
    }
    let kc = if t <= STREAM_MAX_T { groups } else { KC_GROUPS };
    for p in p0..p1 {
        let (first, stride) = b.line_place(p);
        let tile = Tile {
            a: a.as_ptr(),
            k,
            // SAFETY: `first` is the index of a line of `b` (p < panels and groups > 0).
            lines: unsafe { b.lines().as_ptr().add(first) }.cast(),
            stride,
            out,
            n,
        };
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + kc).min(groups);
            let mut r = 0;
            while r < t {
                let mr = MR.min(t - r);
                // SAFETY: r + mr ≤ t, p < panels, g1 ≤ groups; the caller's contract covers `tile`.
                unsafe {
                    match mr {
                        1 => micro::<1>(&tile, r, p, g0, g1),
                        2 => micro::<2>(&tile, r, p, g0, g1),
                        3 => micro::<3>(&tile, r, p, g0, g1),
                        _ => micro::<4>(&tile, r, p, g0, g1),
                    }
                }
                r += mr;
            }
            g0 = g1;
        }
    }
}

/// One row of A (decode) against panels `[p0, p1)`: each whole block of [`NP`] panels at once, its
/// lines in the order they lie (the block's panels side by side, group after group), so that B
/// streams from memory front to back; panels of a block cut by `p0` or `p1` one at a time.
///
/// # Safety
/// As [`gemm_panels`] with `t == 1`.
#[target_feature(enable = "avx2")]
unsafe fn row_panels(a: &[u8], b: &PackedWeights, p0: usize, p1: usize, out: *mut i32, n: usize) {
    let panels = b.panels();
    let mut p = p0;
    while p < p1 {
        let width = NP.min(panels - p / NP * NP);
        let whole = p.is_multiple_of(NP) && p + width <= p1;
        let (first, _) = b.line_place(p);
        let step = if whole { width } else { 1 };
        let row = Row {
            a: a.as_ptr(),
            // SAFETY: `first` is the index of a line of `b` (p < panels, groups > 0).
            lines: unsafe { b.lines().as_ptr().add(first) }.cast(),
            stride: width,
            groups: b.groups(),
            out,
            n,
        };
        // SAFETY: panels p..p + step lie in one block, below p1 ≤ panels; the caller's contract
        // covers the rest.
        unsafe {
            match step {
                4 => row_micro::<4>(&row, p),
                3 => row_micro::<3>(&row, p),
                2 => row_micro::<2>(&row, p),
                _ => row_micro::<1>(&row, p),
            }
        }
        p += step;
    }
}

/// [`row_panels`]' operands: `lines` points at the first panel's group-0 line; group g's lines are
/// `stride` lines on, the block's next panels right after.
struct Row {
    a: *const u8,
    lines: *const __m256i,
    stride: usize,
    groups: usize,
    out: *mut i32,
    n: usize,
}

/// The row against `W` panels of one block from panel `p`, over every group: 2·W accumulators.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn row_micro<const W: usize>(row: &Row, p: usize) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; W];
    // SAFETY: g < groups and each of the W panels lies in the block (see `row_panels`): every line
    // read is inside `b`, and every A read (4 bytes at 4g ≤ kmain − 4) inside the row.
    unsafe {
        // B streams from memory: ask for the first lines at once, then keep requests a fixed
        // distance ahead of the loads; non-temporal, as the AVX-512 kernel's (each line is used
        // once a token, and what the rest of the token comes back to stays in L2 and L3).
        let ahead = |g: usize| {
            for j in 0..W {
                _mm_prefetch::<_MM_HINT_NTA>(row.lines.add(2 * (g * row.stride + j)).cast());
            }
        };
        for g in 0..PREFETCH_GROUPS.min(row.groups) {
            ahead(g);
        }
        for g in 0..row.groups {
            if g + PREFETCH_GROUPS < row.groups {
                ahead(g + PREFETCH_GROUPS);
            }
            let quad = row.a.add(4 * g).cast::<i32>().read_unaligned();
            let av = _mm256_set1_epi32(quad);
            let mag = _mm256_abs_epi8(av);
            let line = row.lines.add(2 * g * row.stride);
            for (j, acc) in acc.iter_mut().enumerate() {
                for (h, c) in acc.iter_mut().enumerate() {
                    let bv = _mm256_load_si256(line.add(2 * j + h));
                    let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(bv, av));
                    *c = _mm256_add_epi32(*c, _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            for (h, v) in acc.iter().enumerate() {
                let col0 = (p + j) * PANEL + 8 * h;
                if col0 >= row.n {
                    break;
                }
                store_lanes(row.out.add(col0), *v, 8.min(row.n - col0), false);
            }
        }
    }
}

/// One panel's operands: `lines` points at its group-0 line, group g's line is `stride` lines on.
struct Tile {
    a: *const u8,
    k: usize,
    lines: *const __m256i,
    stride: usize,
    out: *mut i32,
    n: usize,
}

/// Rows `[r, r + M)` × panel `p` (the tile's) over K groups `[g0, g1)`; the first block stores, later
/// blocks add.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn micro<const M: usize>(tile: &Tile, r: usize, p: usize, g0: usize, g1: usize) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; M];
    // SAFETY: rows r..r+M < t, panel p < panels, groups g0..g1 ≤ groups (see `gemm_panels`): every A
    // read (4 bytes at row·k + 4g ≤ kmain − 4) and both halves of each 64-byte-aligned line are in bounds.
    unsafe {
        for g in g0..g1 {
            let line = tile.lines.add(2 * g * tile.stride);
            let bv = [_mm256_load_si256(line), _mm256_load_si256(line.add(1))];
            for (i, row) in acc.iter_mut().enumerate() {
                let quad = tile
                    .a
                    .add((r + i) * tile.k + 4 * g)
                    .cast::<i32>()
                    .read_unaligned();
                let av = _mm256_set1_epi32(quad);
                let mag = _mm256_abs_epi8(av);
                for (c, v) in row.iter_mut().zip(&bv) {
                    let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(*v, av));
                    *c = _mm256_add_epi32(*c, _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        let first = g0 == 0;
        for h in 0..2 {
            let col0 = p * PANEL + 8 * h;
            if col0 >= tile.n {
                break;
            }
            let valid = 8.min(tile.n - col0);
            for (i, row) in acc.iter().enumerate() {
                let dst = tile.out.add((r + i) * tile.n + col0);
                store_lanes(dst, row[h], valid, !first);
            }
        }
    }
}

/// The first `valid` i32 lanes of `v` to `dst`, written (`add`: added to what is there, wrapping).
///
/// # Safety
/// `dst` must point to `valid ≤ 8` writable i32 that no other thread touches.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_lanes(dst: *mut i32, v: __m256i, valid: usize, add: bool) {
    if valid == 8 {
        // A whole ymm: one store (the lane by lane loop below compiles to eight extractions, a
        // quarter of a K = 64 product's instructions). The add wraps, as `wrapping_add`.
        // SAFETY: the caller's contract: `dst` points to 8 writable i32.
        unsafe {
            let dst = dst.cast::<__m256i>();
            let v = if add {
                _mm256_add_epi32(_mm256_loadu_si256(dst), v)
            } else {
                v
            };
            _mm256_storeu_si256(dst, v);
        }
        return;
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` is 8 i32; the caller's contract covers `dst`.
    unsafe {
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v);
        for (c, v) in lanes.iter().take(valid).enumerate() {
            let d = dst.add(c);
            *d = if add { (*d).wrapping_add(*v) } else { *v };
        }
    }
}
