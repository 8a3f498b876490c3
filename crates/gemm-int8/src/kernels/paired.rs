//! AVX2 products of many rows by Winograd's pairing of inner products (1968). For every two K
//! positions,
//!
//! `a₀b₀ + a₁b₁ = (a₀ + b₁)(a₁ + b₀) − a₀a₁ − b₀b₁`,
//!
//! so a cell costs one multiplication per two positions, plus a term of its row alone and a term of
//! its column alone, each computed once. With i8 operands the sums fit i16 ([−256, 254]) and
//! `vpmaddwd` multiplies 16 of them and adds them in pairs: 32 of the cell's multiply-adds for one
//! multiplying instruction and three additions, where the sign-trick kernel ([`super::avx2`])
//! issues two multiplying instructions (`vpmaddubsw`, `vpmaddwd`) and a sign fix. On a core whose
//! two multiplying pipes bound that kernel (Zen 3), this one is bound by its additions, which every
//! vector pipe takes. Every integer is exact: each product is at most 2¹⁶, and the accumulators and
//! terms wrap modulo 2³² as the other kernels' sums do, so the cell, which fits i32, comes out as
//! it is.
//!
//! A is widened once a product ([`PairedRows`]): per row and group of 4 K values, `(a₀, a₂)` and
//! `(a₁, a₃)` as two i16 in one i32, the four rows of a register tile side by side, and each row's
//! term. B is widened per panel and block of K into
//! the thread's scratch, its terms summed on the way, and every row of the call passes over it:
//! worth it from [`super::PAIRED_MIN_T`] rows, in strips of [`super::PAIRED_ROWS`].

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx2::store_lanes;
use crate::packed::{PANEL, PackedWeights};
use crate::pool;

/// Rows of A in the register tile (4 rows × 16 channels = 8 accumulators).
const MR: usize = 4;

/// K groups per block of B widened at once, at most (256 KB of scratch, in L2): K = 4,864
/// (Qwen2.5-0.5B's down projection) in one block instead of the sign-trick kernel's four went 7-10 %
/// faster on Zen 3, its outputs written once instead of read back and added to three times; smaller
/// blocks than 384 groups were slower at every shape measured.
const KC_GROUPS: usize = 2048;

/// The widened A that a thread keeps between products, up to this many bytes (a 512-row prefill of
/// SmolLM2's MLP down projection is 1.5 MB).
const KEEP_BYTES: usize = 2 << 20;

thread_local! {
    /// The memory of the last [`PairedRows`] dropped on this thread.
    static ROWS: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    /// B's widened lines for one panel and block of K.
    static PANEL_SCRATCH: RefCell<Vec<__m256i>> = const { RefCell::new(Vec::new()) };
}

/// Rows of A as the paired kernel reads them, in tiles of [`MR`] rows: row `r = MR·i + j`'s group g
/// at `[i·2·MR·G + 2·MR·g + 2j]` holds `(a₀, a₂)` and the slot after it `(a₁, a₃)` (i16 pairs, low
/// half first), so that a register tile reads its rows' eight values of a group from one 32-byte
/// line, one stream front to back (a last tile of fewer rows leaves its other slots unwritten and
/// unread); after the tiles, row r's term `Σ_g a₀a₁ + a₂a₃` at `[tiles·2·MR·G + r]` (wrapping).
pub(crate) struct PairedRows {
    buf: Vec<i32>,
    /// Where the rows' terms start (`tiles · 2·MR·G`).
    terms: usize,
    groups: usize,
}

impl PairedRows {
    /// Widen `q` (`t × k`, row-major i8) into memory kept on this thread.
    ///
    /// # Safety
    /// The CPU must support avx2; `q.len() == t · k`.
    pub(crate) unsafe fn new(q: &[i8], t: usize, k: usize) -> Self {
        debug_assert_eq!(q.len(), t * k);
        let groups = k / 4;
        let terms = t.div_ceil(MR) * 2 * MR * groups;
        let len = terms + t;
        let mut buf = ROWS
            .try_with(|r| r.try_borrow_mut().map(|mut r| std::mem::take(&mut *r)))
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        buf.clear();
        buf.reserve_exact(len);
        let out = Slots(buf.as_mut_ptr());
        // Rows shared out over the pool as quantization shares them.
        let per = pool::rows_per_chunk(t, k, crate::PARALLEL_MIN_ELEMENTS);
        let rows = |r0: usize, r1: usize| {
            let out = &out;
            // SAFETY: `buf` has room for `len` i32; each run of rows writes only its own rows'
            // slots and terms (the caller's contract covers the CPU and `q`).
            unsafe { widen(q, k, (r0, r1), out.0, terms) }
        };
        if per >= t {
            rows(0, t);
        } else {
            pool::for_each_chunk(t.div_ceil(per), |c| rows(c * per, ((c + 1) * per).min(t)));
        }
        // SAFETY: every row's 2G slots and its term were written above; the slots of a last
        // tile's missing rows are never read.
        unsafe { buf.set_len(len) };
        Self { buf, terms, groups }
    }
}

impl Drop for PairedRows {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() * 4 > KEEP_BYTES {
            return;
        }
        // A thread being torn down simply frees it.
        let _ = ROWS.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut()
                && r.capacity() < buf.capacity()
            {
                *r = buf;
            }
        });
    }
}

/// Where [`PairedRows::new`]'s threads write, each its own rows.
struct Slots(*mut i32);
// SAFETY: the threads that share it write disjoint rows (see `PairedRows::new`).
unsafe impl Sync for Slots {}

/// Write [`PairedRows`]' layout of rows `[r0, r1)` of `q` into `out`, the rows' terms from
/// `out[terms]`.
///
/// # Safety
/// avx2; `q` holds rows `< r1` of `k` bytes; `out` valid for `terms + r1` writes (`terms` as
/// [`PairedRows::new`] computes it), none of these rows' touched by another thread.
#[target_feature(enable = "avx2")]
unsafe fn widen(q: &[i8], k: usize, (r0, r1): (usize, usize), out: *mut i32, terms: usize) {
    let groups = k / 4;
    // i32 from one group's slot to the next, and from a tile to the next.
    let (step, tile) = (2 * MR, 2 * MR * groups);
    for r in r0..r1 {
        // SAFETY: row r's bytes are q[r·k .. r·k + 4G]; its slots are `out[base + step·g]` and
        // the one after, g < G, inside its tile; the vector loop reads 8 groups while 8 remain.
        unsafe {
            let row = q.as_ptr().add(r * k);
            let base = out.add((r / MR) * tile + 2 * (r % MR)).cast::<i64>();
            let mut term = _mm256_setzero_si256();
            let mut g = 0;
            while g + 8 <= groups {
                let (e, o) = split_pairs(_mm256_loadu_si256(row.add(4 * g).cast()));
                term = _mm256_add_epi32(term, _mm256_madd_epi16(e, o));
                // (e, o) of groups 0, 1 | 4, 5 and 2, 3 | 6, 7, each group's as one i64.
                let lo = _mm256_unpacklo_epi32(e, o);
                let hi = _mm256_unpackhi_epi32(e, o);
                let at = |n: usize| base.add((g + n) * MR);
                at(0).write_unaligned(_mm256_extract_epi64::<0>(lo));
                at(1).write_unaligned(_mm256_extract_epi64::<1>(lo));
                at(2).write_unaligned(_mm256_extract_epi64::<0>(hi));
                at(3).write_unaligned(_mm256_extract_epi64::<1>(hi));
                at(4).write_unaligned(_mm256_extract_epi64::<2>(lo));
                at(5).write_unaligned(_mm256_extract_epi64::<3>(lo));
                at(6).write_unaligned(_mm256_extract_epi64::<2>(hi));
                at(7).write_unaligned(_mm256_extract_epi64::<3>(hi));
                g += 8;
            }
            let mut sum = sum_lanes(term);
            let slots = base.cast::<i32>();
            while g < groups {
                let [a0, a1, a2, a3] = [0, 1, 2, 3].map(|j| i32::from(*row.add(4 * g + j)));
                *slots.add(step * g) = pair(a0, a2);
                *slots.add(step * g + 1) = pair(a1, a3);
                sum = sum.wrapping_add(a0 * a1 + a2 * a3);
                g += 1;
            }
            *out.add(terms + r) = sum;
        }
    }
}

/// Eight groups of 4 i8 `[v₀ v₁ v₂ v₃]` (one per i32 lane) as i16 pairs: `(v₀, v₂)` and `(v₁, v₃)`
/// in each lane of the first and the second result (A's widening and B's share it).
#[inline]
#[target_feature(enable = "avx2")]
fn split_pairs(x: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(x)),
        _mm256_srai_epi16::<8>(x),
    )
}

/// Two i16 in one i32, `lo` in the low half (as a ymm's i16 lanes 2j and 2j + 1).
fn pair(lo: i32, hi: i32) -> i32 {
    (u32::from(lo as i16 as u16) | (u32::from(hi as i16 as u16) << 16)) as i32
}

/// The wrapping sum of a ymm's eight i32.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_lanes(v: __m256i) -> i32 {
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` is 8 i32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().fold(0i32, |s, &x| s.wrapping_add(x))
}

/// `out[r][col] = Σ_{k < kmain} qa[r0 + r][k] · qb[col][k]` for rows `[r0, r1)` of `a` and every
/// column of panels `[p0, p1)` below `n`; `out` points at row `r0`'s first cell.
///
/// # Safety
/// avx2; `a` widened from the A of this product (its K is `b.k()`), `r0 ≤ r1 ≤` its rows, `r0` a
/// multiple of [`MR`],
/// `p1 ≤ b.panels()`, `b.groups() > 0`; `out` must point to `(r1 − r0) × n` writable i32
/// (`n == b.n()`) that no other thread touches in these columns.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn paired_panels(
    a: &PairedRows,
    r0: usize,
    r1: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    let groups = b.groups();
    debug_assert!(groups > 0 && groups == a.groups && r0.is_multiple_of(MR));
    // K in equal blocks of at most KC_GROUPS groups.
    let kc = groups.div_ceil(groups.div_ceil(KC_GROUPS));
    let mut own = Vec::new();
    let mut kept =
        PANEL_SCRATCH.try_with(|s| s.try_borrow_mut().ok().map(|mut s| std::mem::take(&mut *s)));
    let scratch = match &mut kept {
        Ok(Some(s)) => s,
        _ => &mut own,
    };
    if scratch.len() < 4 * kc {
        // SAFETY: an all-zero __m256i is a valid value.
        scratch.resize(4 * kc, unsafe { std::mem::zeroed() });
    }
    let terms = &a.buf[a.terms..];
    for p in p0..p1 {
        let (first, lines_stride) = b.line_place(p);
        // SAFETY: `first` is the index of a line of `b` (p < panels, groups > 0).
        let lines = unsafe { b.lines().as_ptr().add(first) }.cast::<__m256i>();
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + kc).min(groups);
            // SAFETY: groups g0..g1 of panel p lie in `b`; `scratch` holds 4·kc ≥ 4·(g1 − g0).
            let col_terms =
                unsafe { widen_panel(lines, lines_stride, g0, g1, scratch.as_mut_ptr()) };
            let tile = Tile {
                rows: a.buf.as_ptr(),
                groups,
                widened: scratch.as_ptr(),
                out,
                n,
            };
            let mut r = r0;
            while r < r1 {
                let mr = MR.min(r1 - r);
                let first_block = g0 == 0;
                // SAFETY: rows r..r + mr < a.t, panel p and groups g0..g1 as above; the caller's
                // contract covers `out` (row r is r − r0 rows past it).
                unsafe {
                    let at = Place { r, r0, p, g0, g1 };
                    match mr {
                        1 => micro::<1>(&tile, &at, col_terms, terms, first_block),
                        2 => micro::<2>(&tile, &at, col_terms, terms, first_block),
                        3 => micro::<3>(&tile, &at, col_terms, terms, first_block),
                        _ => micro::<4>(&tile, &at, col_terms, terms, first_block),
                    }
                }
                r += mr;
            }
            g0 = g1;
        }
    }
    if let Ok(Some(s)) = kept {
        let _ = PANEL_SCRATCH.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                *c = s;
            }
        });
    }
}

/// Panel lines of groups `[g0, g1)` widened into `dst`, four ymm a group: for channels 0–7 then
/// 8–15, `(b₁, b₃)` (what A's `(a₀, a₂)` meet) then `(b₀, b₂)`; returns each half's column terms
/// `Σ_g b₀b₁ + b₂b₃` over those groups.
///
/// # Safety
/// avx2; `lines` the panel's group-0 line with group g's `stride` lines on, groups `< g1` inside
/// `b`; `dst` valid for `4 · (g1 − g0)` aligned writes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen_panel(
    lines: *const __m256i,
    stride: usize,
    g0: usize,
    g1: usize,
    dst: *mut __m256i,
) -> [__m256i; 2] {
    let mut terms = [_mm256_setzero_si256(); 2];
    for g in g0..g1 {
        for (h, term) in terms.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            unsafe {
                let (e, o) = split_pairs(_mm256_load_si256(lines.add(2 * g * stride + h)));
                let d = dst.add(4 * (g - g0) + 2 * h);
                _mm256_store_si256(d, o);
                _mm256_store_si256(d.add(1), e);
                *term = _mm256_add_epi32(*term, _mm256_madd_epi16(e, o));
            }
        }
    }
    terms
}

/// The operands a register tile reads: A's widened rows, one panel's widened block, the output.
struct Tile {
    rows: *const i32,
    groups: usize,
    widened: *const __m256i,
    out: *mut i32,
    n: usize,
}

/// Where a register tile sits: rows from `r` (the call's first row `r0`), panel `p`, groups
/// `[g0, g1)` (the widened block's).
struct Place {
    r: usize,
    r0: usize,
    p: usize,
    g0: usize,
    g1: usize,
}

/// Rows `[r, r + M)` × panel `p` over the widened block: the first block stores its sums less the
/// rows' and the block's column terms, later blocks add theirs less the block's column terms.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn micro<const M: usize>(
    tile: &Tile,
    at: &Place,
    col_terms: [__m256i; 2],
    row_terms: &[i32],
    first: bool,
) {
    let zero = _mm256_setzero_si256();
    let less = [
        _mm256_sub_epi32(zero, col_terms[0]),
        _mm256_sub_epi32(zero, col_terms[1]),
    ];
    let mut acc = [less; M];
    if first {
        for (i, row) in acc.iter_mut().enumerate() {
            let term = _mm256_set1_epi32(row_terms[at.r + i]);
            for c in row.iter_mut() {
                *c = _mm256_sub_epi32(*c, term);
            }
        }
    }
    // SAFETY: r is a multiple of MR (the callers cut rows so), and rows r..r + M hold their
    // slots in its tile of `tile.rows`; the widened block holds 4 · (g1 − g0) ymm; the caller's
    // contract covers the stores.
    unsafe {
        let slots = tile.rows.add(at.r * 2 * tile.groups);
        for g in at.g0..at.g1 {
            let w = tile.widened.add(4 * (g - at.g0));
            let a = slots.add(2 * MR * g);
            for (i, row) in acc.iter_mut().enumerate() {
                let even = _mm256_set1_epi32(*a.add(2 * i));
                let odd = _mm256_set1_epi32(*a.add(2 * i + 1));
                for (h, c) in row.iter_mut().enumerate() {
                    let x = _mm256_add_epi16(even, _mm256_load_si256(w.add(2 * h)));
                    let y = _mm256_add_epi16(odd, _mm256_load_si256(w.add(2 * h + 1)));
                    *c = _mm256_add_epi32(*c, _mm256_madd_epi16(x, y));
                }
            }
        }
        for h in 0..2 {
            let col0 = at.p * PANEL + 8 * h;
            if col0 >= tile.n {
                break;
            }
            let valid = 8.min(tile.n - col0);
            for (i, row) in acc.iter().enumerate() {
                let dst = tile.out.add((at.r - at.r0 + i) * tile.n + col0);
                store_lanes(dst, row[h], valid, !first);
            }
        }
    }
}
