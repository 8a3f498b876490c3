//! AMX-INT8 kernel: `tdpbssd` multiplies a tile of 16 rows × 64 K values of A (i8) by a tile of B
//! holding 16 groups of 4 K values for 16 channels — exactly 16 consecutive lines of one panel of the
//! packed layout, read in place with the block's line stride — and adds the products to a tile of
//! 16 × 16 i32 accumulators. Signed × signed: no offset, no correction, and the sum is exact for
//! K ≤ 131071 as with every kernel (each i32 step adds four products, with no narrower stage).
//!
//! Tiles: `tmm0`–`tmm3` accumulate 2 row tiles × 2 panels, `tmm4`–`tmm5` hold A, `tmm6`–`tmm7` B.
//! A comes from a padded copy (rows up to a multiple of 16, K up to a multiple of 64, zeros beyond,
//! made by the caller), so no load of A reads outside it. A last partial K tile of B (fewer than 16
//! groups) is copied into a zero-padded tile first, so no load of B reads outside its panel either.
//! The instructions are written as inline assembly: Rust has no stable AMX intrinsics.

use std::arch::asm;

use crate::packed::{Line, PANEL, PackedWeights};

use super::AMX_TILE as TILE;

/// The tile configuration (`ldtilecfg`'s 64-byte operand, palette 1): all eight tiles 16 rows of 64
/// bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Write `out[r][col] = Σ_{k < kmain} qa[r][k] · qb[col][k]` for every row `r < t` and every column
/// of panels `[p0, p1)` that is below `n`.
///
/// `a` holds the rows as i8 bytes with row stride `kp` (a multiple of 64, at least `4 · groups`),
/// zero past `4 · groups`, and at least `t` rounded up to a multiple of 16 rows (zero past `t`).
///
/// # Safety
/// The CPU must run AMX-INT8 and this process must hold the permission to use its tile state
/// ([`crate::Isa::Amx`] checks both); `a` as above; `p1 ≤ b.panels()`; `out` must point to `t × n`
/// writable i32 (`n == b.n()`) that no other thread touches in these columns.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_panels(
    a: &[u8],
    kp: usize,
    t: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    let groups = b.groups();
    debug_assert!(groups > 0, "the dispatcher handles K < 4");
    debug_assert!(kp.is_multiple_of(64) && kp >= 4 * groups);
    debug_assert!(a.len() >= t.div_ceil(TILE) * TILE * kp);
    // SAFETY: the caller guarantees AMX and its permission; the configuration is valid for palette 1.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) &CONFIG, options(nostack, readonly)) };
    let block = Block {
        a,
        kp,
        t,
        b,
        out,
        n,
    };
    let mut r = 0;
    while r < t {
        let m = if t - r > TILE { 2 } else { 1 };
        let mut p = p0;
        while p < p1 {
            let np = if p1 - p >= 2 { 2 } else { 1 };
            // SAFETY: rows r.. (within the padded rows), panels p..p + np < p1; the caller's
            // contract covers `a`, `b` and `out`.
            unsafe { block.run(r, m, p, np) };
            p += np;
        }
        r += m * TILE;
    }
    // SAFETY: AMX is in use (configured above); releasing returns the tiles to their init state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

struct Block<'a> {
    a: &'a [u8],
    kp: usize,
    t: usize,
    b: &'a PackedWeights,
    out: *mut i32,
    n: usize,
}

impl Block<'_> {
    /// Rows `[r, r + 16·m)` × panels `[p, p + np)` over all of the grouped K.
    ///
    /// # Safety
    /// As [`gemm_panels`], with `r < t`, `m, np ∈ {1, 2}`, `p + np ≤ panels`, and tiles configured.
    unsafe fn run(&self, r: usize, m: usize, p: usize, np: usize) {
        let b = self.b;
        let groups = b.groups();
        let full = groups / TILE;
        let lines = b.lines().as_ptr();
        // Each panel's group-0 line and the distance between its groups, in bytes.
        let place = |j: usize| {
            let (first, stride) = b.line_place(p + j.min(np - 1));
            // SAFETY: `first` indexes a line of `b` (p + j < panels, groups > 0).
            (unsafe { lines.add(first) }.cast::<u8>(), stride * 64)
        };
        let (b0, sb0) = place(0);
        let (b1, sb1) = place(1);
        let sa = self.kp;
        let a0 = self.a[r * sa..].as_ptr();
        // The second A tile: the next 16 rows when m = 2 (padded rows exist up to a multiple of 16).
        let a1 = if m == 2 {
            self.a[(r + TILE) * sa..].as_ptr()
        } else {
            a0
        };
        // SAFETY (every asm block below): tiles are configured; each load reads 16 rows of 64 bytes
        // at the given stride — A inside the padded copy (g·64 + 64 ≤ kp on rows below its end), B
        // lines of groups below `groups` of panels below `panels` (full tiles only; the partial one
        // comes from `tail`, 16 lines on the stack).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for g in 0..full {
                let (pa0, pa1) = (a0.add(g * 64), a1.add(g * 64));
                let (pb0, pb1) = (b0.add(g * TILE * sb0), b1.add(g * TILE * sb1));
                self.step(m, np, [pa0, pa1], sa, [pb0, pb1], [sb0, sb1]);
            }
            let rest = groups - full * TILE;
            if rest > 0 {
                let mut tail = [[Line([0; 64]); TILE]; 2];
                for (j, tile) in tail.iter_mut().enumerate().take(np) {
                    let (first, stride) = b.line_place(p + j);
                    for (i, line) in tile.iter_mut().enumerate().take(rest) {
                        *line = b.lines()[first + (full * TILE + i) * stride];
                    }
                }
                let g = full;
                let (pa0, pa1) = (a0.add(g * 64), a1.add(g * 64));
                let pb = [tail[0].as_ptr().cast::<u8>(), tail[1].as_ptr().cast::<u8>()];
                self.step(m, np, [pa0, pa1], sa, pb, [64, 64]);
            }
            self.store(r, p, m, np);
        }
    }

    /// One K tile: load A and B tiles, multiply-add into the accumulators in use.
    ///
    /// # Safety
    /// As [`Block::run`], with every pointer valid for a 16-row tile load at its stride.
    #[inline(always)]
    unsafe fn step(
        &self,
        m: usize,
        np: usize,
        a: [*const u8; 2],
        sa: usize,
        b: [*const u8; 2],
        sb: [usize; 2],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match (m, np) {
                (2, 2) => asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb0}*1]",
                    "tileloadd tmm7, [{b1} + {sb1}*1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    a0 = in(reg) a[0], a1 = in(reg) a[1], sa = in(reg) sa,
                    b0 = in(reg) b[0], b1 = in(reg) b[1], sb0 = in(reg) sb[0], sb1 = in(reg) sb[1],
                    options(nostack, readonly)
                ),
                (2, _) => asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb0}*1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbssd tmm2, tmm5, tmm6",
                    a0 = in(reg) a[0], a1 = in(reg) a[1], sa = in(reg) sa,
                    b0 = in(reg) b[0], sb0 = in(reg) sb[0],
                    options(nostack, readonly)
                ),
                (_, 2) => asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb0}*1]",
                    "tileloadd tmm7, [{b1} + {sb1}*1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    a0 = in(reg) a[0], sa = in(reg) sa,
                    b0 = in(reg) b[0], b1 = in(reg) b[1], sb0 = in(reg) sb[0], sb1 = in(reg) sb[1],
                    options(nostack, readonly)
                ),
                _ => asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb0}*1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    a0 = in(reg) a[0], sa = in(reg) sa,
                    b0 = in(reg) b[0], sb0 = in(reg) sb[0],
                    options(nostack, readonly)
                ),
            }
        }
    }

    /// Store the accumulators in use: straight into `out` where the tile's 16 rows are below `t`
    /// and its 16 columns below `n`, through a tile on the stack otherwise.
    ///
    /// # Safety
    /// As [`Block::run`].
    unsafe fn store(&self, r: usize, p: usize, m: usize, np: usize) {
        let mut spill = Spill([0; TILE * PANEL]);
        for i in 0..m {
            for j in 0..np {
                let (row0, col0) = (r + i * TILE, (p + j) * PANEL);
                let rows = TILE.min(self.t.saturating_sub(row0));
                let cols = PANEL.min(self.n - col0);
                let whole = rows == TILE && cols == PANEL;
                let (dst, stride) = if whole {
                    // SAFETY: row0 + 16 ≤ t and col0 + 16 ≤ n: inside the caller's cells.
                    (unsafe { self.out.add(row0 * self.n + col0) }, self.n * 4)
                } else {
                    (spill.0.as_mut_ptr(), PANEL * 4)
                };
                // SAFETY: `dst` holds 16 rows of 16 i32 at `stride` bytes (see above); the tile
                // number is i·2 + j, one of the accumulators this block used.
                unsafe {
                    match i * 2 + j {
                        0 => {
                            asm!("tilestored [{d} + {s}*1], tmm0", d = in(reg) dst, s = in(reg) stride, options(nostack))
                        }
                        1 => {
                            asm!("tilestored [{d} + {s}*1], tmm1", d = in(reg) dst, s = in(reg) stride, options(nostack))
                        }
                        2 => {
                            asm!("tilestored [{d} + {s}*1], tmm2", d = in(reg) dst, s = in(reg) stride, options(nostack))
                        }
                        _ => {
                            asm!("tilestored [{d} + {s}*1], tmm3", d = in(reg) dst, s = in(reg) stride, options(nostack))
                        }
                    }
                }
                if !whole {
                    for rr in 0..rows {
                        for c in 0..cols {
                            // SAFETY: row0 + rr < t, col0 + c < n: inside the caller's cells.
                            unsafe {
                                *self.out.add((row0 + rr) * self.n + col0 + c) =
                                    spill.0[rr * PANEL + c]
                            };
                        }
                    }
                }
            }
        }
    }
}

/// One accumulator tile on the stack, aligned like a cache line.
#[repr(C, align(64))]
struct Spill([i32; TILE * PANEL]);

/// Whether this CPU runs AMX-INT8 and the OS lets this process use the tile state (Linux asks for
/// the permission once per process, `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let (max, leaf7) = (
            std::arch::x86_64::__cpuid(0).eax,
            std::arch::x86_64::__cpuid_count(7, 0),
        );
        // EDX bit 24: AMX-TILE, bit 25: AMX-INT8.
        let cpu = max >= 7 && leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0;
        cpu && permit()
    })
}

#[cfg(target_os = "linux")]
fn permit() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number and touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn permit() -> bool {
    false
}
