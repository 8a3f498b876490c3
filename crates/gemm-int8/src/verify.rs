//! The scalar reference (the definition of the accumulators), the init gates of DESIGN.md §3.7, the
//! live random-cell audit, the cross-device probe and the measured rate for the planner.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::backend::{Backend, Rhs, check_shapes};
use crate::packed::{PANEL, PackedWeights};
use crate::quant::{Quantized, quantize_rows};
use crate::{Error, Operand, gemm, quant};

/// Cells recomputed by [`audit`] after each live GEMM.
pub const AUDIT_CELLS: usize = 16;

/// Audited columns come from two seeded blocks of this many columns.
const AUDIT_BLOCK: usize = 16;

/// The probe's `(t, k, n)`: K not a multiple of 4, N not a multiple of 16.
pub const PROBE_SHAPE: (usize, usize, usize) = (5, 1027, 37);

simd_versions! {
    /// `Σ_k qa[k] · qb[k]` in i32, the definition every kernel must equal.
    ///
    /// A plain loop (integer sums are exact whatever the order, so its vectorized copies give the
    /// same value), so the audit that runs after every live GEMM stays cheap.
    pub fn reference_cell(qa: &[i8], qb: &[i8]) -> i32 {
        qa.iter()
            .zip(qb)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum()
    }
}

/// The scalar reference for a whole GEMM: `out[t][n] = Σ_k qa[t][k] · qb[n][k]`, plain loops over
/// row-major values.
pub fn reference_i32(a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
    check_shapes(a, b, out)?;
    let (n, k) = (b.n(), b.k());
    let mut qb = vec![0i8; k];
    for col in 0..n {
        b.write_row(col, &mut qb);
        for r in 0..a.rows() {
            out[r * n + col] = reference_cell(a.row(r), &qb);
        }
    }
    Ok(())
}

/// SplitMix64: the seeded stream behind the audit's cells, the gates' and the probe's inputs (and
/// the GPU backend's gates and tests): the same numbers on every machine.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded `rows × cols` matrix: uniform values in [-1, 1) times a per-row magnitude from 10⁻³ to
/// 10³, so row scales differ. The same seed gives the same bits on every machine.
pub fn seeded_matrix(seed: u64, rows: usize, cols: usize) -> Vec<f32> {
    const MAGNITUDES: [f32; 7] = [1.0, 1e-3, 0.5, 1e3, 0.01, 7.0, 100.0];
    let mut state = seed;
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let mag = MAGNITUDES[r % MAGNITUDES.len()];
        for _ in 0..cols {
            let u = (splitmix(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
            out.push((2.0 * u - 1.0) * mag);
        }
    }
    out
}

/// Recompute `cells` seeded random cells of `acc` (`a.rows() × b.n()`) with the scalar reference;
/// the first disagreement is an [`Error::AuditMismatch`] naming `backend`. Rows are uniform; columns
/// are uniform within two seeded blocks of 16 columns.
pub fn audit(
    backend: &str,
    a: &Quantized,
    b: Rhs<'_>,
    acc: &[i32],
    seed: u64,
    cells: usize,
) -> Result<(), Error> {
    check_shapes(a, b, acc)?;
    LiveAudit::new(a.rows(), b.n(), seed, cells).finish(&|| backend.to_string(), a, b, acc)
}

/// The cells one live GEMM's audit recomputes, picked (seeded) before the product, so that a
/// backend may check them as it goes, while their operands are still in cache — the CPU backend
/// checks a run of columns right after computing it — and [`LiveAudit::finish`] checks whatever
/// cells are left. Either way every cell is recomputed by the scalar reference from the operands
/// and compared with the accumulator the backend wrote, and the first disagreement in the seeded
/// order is the one reported.
#[derive(Debug)]
pub struct LiveAudit {
    /// The cells, by panel of 16 columns, then row, then column (the cells of one panel and row
    /// are recomputed together); a live audit's held inline, as decode makes some 200 a token.
    cells: SmallVec<[Cell; AUDIT_CELLS]>,
    /// The first disagreement found so far: (seeded index, got, expected).
    first: Mutex<Option<(usize, i32, i32)>>,
}

#[derive(Debug)]
struct Cell {
    /// Its place in the seeded order.
    index: usize,
    row: usize,
    col: usize,
    checked: AtomicBool,
}

impl LiveAudit {
    /// `cells` seeded cells of a `t × n` product.
    fn new(t: usize, n: usize, seed: u64, cells: usize) -> Self {
        let mut picks: SmallVec<[Cell; AUDIT_CELLS]> = SmallVec::new();
        if t > 0 && n > 0 {
            let mut state = seed;
            // Columns come from two seeded blocks of 16 (one weight panel each), so auditing packed
            // weights re-reads two panels rather than up to `cells` of them: at T = 1 a full
            // re-read would double the memory traffic of a GEMM that is memory-bound.
            let blocks = n.div_ceil(AUDIT_BLOCK);
            let picked = [0, 1].map(|_| (splitmix(&mut state) % blocks as u64) as usize);
            picks = (0..cells)
                .map(|index| {
                    let block = picked[index % 2];
                    let width = AUDIT_BLOCK.min(n - block * AUDIT_BLOCK);
                    let col = block * AUDIT_BLOCK + (splitmix(&mut state) % width as u64) as usize;
                    let row = (splitmix(&mut state) % t as u64) as usize;
                    Cell {
                        index,
                        row,
                        col,
                        checked: AtomicBool::new(false),
                    }
                })
                .collect();
            picks.sort_unstable_by_key(|c| (c.col / PANEL, c.row, c.col));
        }
        Self {
            cells: picks,
            first: Mutex::new(None),
        }
    }

    /// The audit every live GEMM gets: [`AUDIT_CELLS`] cells, a fresh seed per call.
    pub(crate) fn live(a: &Quantized, b: Rhs<'_>) -> Self {
        let mut seed = AUDIT_SEED.fetch_add(1, Ordering::Relaxed);
        Self::new(a.rows(), b.n(), splitmix(&mut seed), AUDIT_CELLS)
    }

    /// Check the cells in rows `[r0, r1)` of columns `[c0, c1)` now, reading each one's
    /// accumulator through `acc` (row, column). For a backend, right after it wrote that block (a
    /// run of columns over every row at decode, a tile of rows × panels at prefill), on the thread
    /// that did, while it is in cache.
    pub fn check_block(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        (r0, r1): (usize, usize),
        (c0, c1): (usize, usize),
        acc: impl Fn(usize, usize) -> i32,
    ) {
        let from = self.cells.partition_point(|c| c.col / PANEL < c0 / PANEL);
        let to = self
            .cells
            .partition_point(|c| c.col / PANEL < c1.div_ceil(PANEL));
        let mut inside = self.cells[from..to]
            .iter()
            .filter(|c| (c0..c1).contains(&c.col) && (r0..r1).contains(&c.row))
            .peekable();
        if inside.peek().is_some() {
            self.check(a, b, inside, acc);
        }
    }

    /// Recompute `cells` (in their order) and keep the first disagreement. Packed weights: the
    /// reference sums of a whole panel per row at once (a cell's panel is read once, not once per
    /// cell); an activation: the reference dot product of the two rows.
    fn check<'c>(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        cells: impl Iterator<Item = &'c Cell>,
        acc: impl Fn(usize, usize) -> i32,
    ) {
        let mut first: Option<(usize, i32, i32)> = None;
        // Packed weights: (panel, row) of the sums held.
        let mut panel: Option<((usize, usize), [i32; PANEL])> = None;
        for cell in cells {
            let expected = match b {
                Rhs::Weights(w) => {
                    let at = (cell.col / PANEL, cell.row);
                    let sums = match panel {
                        Some((held, sums)) if held == at => sums,
                        _ => {
                            let sums = w.panel_sums(at.0, a.row(cell.row));
                            panel = Some((at, sums));
                            sums
                        }
                    };
                    sums[cell.col % PANEL]
                }
                Rhs::Activation(q) => reference_cell(a.row(cell.row), q.row(cell.col)),
            };
            let got = acc(cell.row, cell.col);
            if got != expected && first.is_none_or(|(j, ..)| cell.index < j) {
                first = Some((cell.index, got, expected));
            }
            cell.checked.store(true, Ordering::Relaxed);
        }
        if let Some(found) = first {
            let mut kept = self.first.lock().unwrap_or_else(|e| e.into_inner());
            if kept.is_none_or(|(j, ..)| found.0 < j) {
                *kept = Some(found);
            }
        }
    }

    /// Check the cells the backend left, against `acc` (`a.rows() × b.n()`, shapes checked by the
    /// caller), and report the first disagreement in the seeded order as an
    /// [`Error::AuditMismatch`] naming `backend`.
    pub(crate) fn finish(
        &self,
        backend: &dyn Fn() -> String,
        a: &Quantized,
        b: Rhs<'_>,
        acc: &[i32],
    ) -> Result<(), Error> {
        let n = b.n();
        let left: SmallVec<[&Cell; AUDIT_CELLS]> = self
            .cells
            .iter()
            .filter(|c| !c.checked.load(Ordering::Relaxed))
            .collect();
        let read = |row: usize, col: usize| acc[row * n + col];
        // Long rows: the first panel's cells and the rest's on two threads (after a decode GEMM
        // the audited panels are out in the last-level cache, and reading them is most of the
        // audit's time).
        let split = left.partition_point(|c| c.col / PANEL == left[0].col / PANEL);
        if b.k() >= AUDIT_PARALLEL_MIN_K && split < left.len() {
            let halves = [&left[..split], &left[split..]];
            crate::pool::for_each_chunk(2, |h| self.check(a, b, halves[h].iter().copied(), read));
        } else {
            self.check(a, b, left.into_iter(), read);
        }
        let first = *self.first.lock().unwrap_or_else(|e| e.into_inner());
        match first {
            None => Ok(()),
            Some((i, got, expected)) => {
                let cell = self.cells.iter().find(|c| c.index == i);
                let (row, col) = cell.map_or((0, 0), |c| (c.row, c.col));
                Err(Error::AuditMismatch {
                    backend: backend(),
                    row,
                    col,
                    got,
                    expected,
                })
            }
        }
    }
}

/// Row length from which [`LiveAudit::finish`] checks the cells left on two threads.
const AUDIT_PARALLEL_MIN_K: usize = 512;

static AUDIT_SEED: AtomicU64 = AtomicU64::new(0x5EED_A0D1_7000_0000);

/// The audit every live GEMM gets: [`AUDIT_CELLS`] cells, a fresh seed per call, of accumulators
/// already computed.
pub(crate) fn audit_live(
    backend: &dyn Backend,
    a: &Quantized,
    b: Rhs<'_>,
    acc: &[i32],
) -> Result<(), Error> {
    LiveAudit::live(a, b).finish(&|| backend.name(), a, b, acc)
}

/// A live GEMM, its audit and its dequantization, one after the other ([`Backend::gemm_dequantized`]
/// where a backend does not interleave them): [`Backend::gemm_i32_audited`] checks what cells it
/// can as it goes, the rest are checked after, then every accumulator in `c` (its i32 bits) is
/// dequantized in place.
pub(crate) fn gemm_then_dequantize<B: Backend + ?Sized>(
    backend: &B,
    a: &Quantized,
    b: Rhs<'_>,
    c: &mut [f32],
    audit: &LiveAudit,
) -> Result<(), Error> {
    {
        let acc = crate::as_accumulators(c);
        backend.gemm_i32_audited(a, b, acc, audit)?;
        audit.finish(&|| backend.name(), a, b, acc)?;
    }
    crate::dequantize_in_place(c, a.scales(), b.scales());
    Ok(())
}

/// How a gate fills a matrix.
#[derive(Clone, Copy)]
enum Fill {
    /// [`seeded_matrix`] with one all-zero row and one subnormal row (when there are 3 rows or more).
    Seeded(u64),
    /// Every element ±1 (quantizes to ±127): row r is `+`, `−`, `+−+−…`, `−+−+…` for r mod 4.
    Extremes,
}

struct Gate {
    name: &'static str,
    t: usize,
    k: usize,
    n: usize,
    a: Fill,
    b: Fill,
}

/// The shapes of DESIGN.md §3.7: K not a multiple of the SIMD width, T = 1, zero and subnormal rows,
/// row and panel remainders, several K blocks, and ±127 everywhere at K = 131071.
const GATES: [Gate; 8] = [
    Gate {
        name: "t1-k1-n1",
        t: 1,
        k: 1,
        n: 1,
        a: Fill::Seeded(1),
        b: Fill::Seeded(2),
    },
    Gate {
        name: "t1-k3-n5",
        t: 1,
        k: 3,
        n: 5,
        a: Fill::Seeded(3),
        b: Fill::Seeded(4),
    },
    Gate {
        name: "t1-k577-n19",
        t: 1,
        k: 577,
        n: 19,
        a: Fill::Seeded(5),
        b: Fill::Seeded(6),
    },
    Gate {
        name: "t2-k64-n16",
        t: 2,
        k: 64,
        n: 16,
        a: Fill::Seeded(7),
        b: Fill::Seeded(8),
    },
    Gate {
        name: "t7-k1541-n67-zero-subnormal",
        t: 7,
        k: 1541,
        n: 67,
        a: Fill::Seeded(9),
        b: Fill::Seeded(10),
    },
    Gate {
        name: "t13-k67-n33",
        t: 13,
        k: 67,
        n: 33,
        a: Fill::Seeded(11),
        b: Fill::Seeded(12),
    },
    Gate {
        name: "t67-k579-n129",
        t: 67,
        k: 579,
        n: 129,
        a: Fill::Seeded(13),
        b: Fill::Seeded(14),
    },
    Gate {
        name: "extremes-k131071",
        t: 4,
        k: crate::MAX_K,
        n: 5,
        a: Fill::Extremes,
        b: Fill::Extremes,
    },
];

fn fill(f: Fill, rows: usize, cols: usize) -> Vec<f32> {
    match f {
        Fill::Seeded(seed) => {
            let mut m = seeded_matrix(seed, rows, cols);
            if rows >= 3 {
                m[cols..2 * cols].fill(0.0);
                for (i, v) in m[2 * cols..3 * cols].iter_mut().enumerate() {
                    *v = f32::from_bits(1 + (i as u32 % 0x007F_FFFF))
                        * if i % 2 == 0 { 1.0 } else { -1.0 };
                }
            }
            m
        }
        Fill::Extremes => (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                let alt = if c % 2 == 0 { 1.0 } else { -1.0 };
                match r % 4 {
                    0 => 1.0,
                    1 => -1.0,
                    2 => alt,
                    _ => -alt,
                }
            })
            .collect(),
    }
}

/// Run every gate shape on `backend`, with B both as packed weights and as a per-call activation, and
/// require the accumulators to equal the scalar reference bit for bit.
pub fn exact_gates(backend: &dyn Backend) -> Result<(), Error> {
    for gate in &GATES {
        let qa = quantize_rows(&fill(gate.a, gate.t, gate.k), gate.t, gate.k)?;
        let qb = quant::quantize(Operand::B, &fill(gate.b, gate.n, gate.k), gate.n, gate.k)?;
        let packed = PackedWeights::from_quantized(&qb);
        let mut expected = vec![0i32; gate.t * gate.n];
        reference_i32(&qa, Rhs::Activation(&qb), &mut expected)?;
        for rhs in [Rhs::Weights(&packed), Rhs::Activation(&qb)] {
            let mut got = vec![0i32; gate.t * gate.n];
            backend.gemm_i32(&qa, rhs, &mut got)?;
            if let Some(cell) = got.iter().zip(&expected).position(|(g, e)| g != e) {
                return Err(Error::GateMismatch {
                    backend: backend.name(),
                    gate: gate.name,
                    row: cell / gate.n,
                    col: cell % gate.n,
                    got: got[cell],
                    expected: expected[cell],
                });
            }
        }
    }
    Ok(())
}

/// SHA-256 over the little-endian bytes of a seeded GEMM's output at [`PROBE_SHAPE`], through the
/// full contract (quantize, integer GEMM, audit, dequantize). Equal on every correct device.
pub fn probe(backend: &dyn Backend, seed: u64) -> Result<[u8; 32], Error> {
    let (t, k, n) = PROBE_SHAPE;
    let a = seeded_matrix(seed, t, k);
    let b = PackedWeights::new(&seeded_matrix(seed ^ 0xB0B0_B0B0_B0B0_B0B0, n, k), n, k)?;
    let c = gemm(backend, &a, t, &b)?;
    let mut hasher = Sha256::new();
    for v in &c {
        hasher.update(v.to_le_bytes());
    }
    Ok(hasher.finalize().into())
}

/// The rate of `backend` in GOP/s (2 operations per multiply-add) on a prefill-sized GEMM
/// (t = 64, k = n = 576) through the full contract, timed for about 100 ms.
pub fn measure_rate(backend: &dyn Backend) -> Result<f64, Error> {
    let (t, k, n) = (64, 576, 576);
    let a = seeded_matrix(0xA, t, k);
    let b = PackedWeights::new(&seeded_matrix(0xB, n, k), n, k)?;
    gemm(backend, &a, t, &b)?; // warm up
    let start = Instant::now();
    let mut runs = 0u32;
    while runs < 3 || start.elapsed() < Duration::from_millis(100) {
        std::hint::black_box(gemm(backend, std::hint::black_box(&a), t, &b)?);
        runs += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(2.0 * (t * n * k) as f64 * f64::from(runs) / secs / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    fn operands(t: usize, n: usize, k: usize) -> (Quantized, PackedWeights) {
        let a = quantize_rows(&seeded_matrix(21, t, k), t, k).unwrap();
        let w = PackedWeights::new(&seeded_matrix(22, n, k), n, k).unwrap();
        (a, w)
    }

    #[test]
    fn a_decode_product_on_the_cpu_checks_its_audit_cells_as_it_goes() {
        // SmolLM2's up projection at T = 1: cut by columns over the pool.
        let (t, n, k) = (1, 1536, 576);
        let (a, w) = operands(t, n, k);
        for seed in 0..8 {
            let audit = LiveAudit::new(t, n, seed, AUDIT_CELLS);
            let mut acc = vec![0i32; t * n];
            CpuBackend::new()
                .gemm_i32_audited(&a, Rhs::Weights(&w), &mut acc, &audit)
                .unwrap();
            assert_eq!(audit.cells.len(), AUDIT_CELLS);
            assert!(
                all_checked(&audit),
                "seed {seed}: the backend left cells to the caller"
            );
            audit
                .finish(&|| "cpu".into(), &a, Rhs::Weights(&w), &acc)
                .unwrap();
        }
        // A prefill-sized product is cut in tiles: whatever the backend leaves, finish checks.
        let (a, w) = operands(67, 130, 579);
        let audit = LiveAudit::new(67, 130, 3, AUDIT_CELLS);
        let mut acc = vec![0i32; 67 * 130];
        CpuBackend::new()
            .gemm_i32_audited(&a, Rhs::Weights(&w), &mut acc, &audit)
            .unwrap();
        audit
            .finish(&|| "cpu".into(), &a, Rhs::Weights(&w), &acc)
            .unwrap();
        assert!(all_checked(&audit));
    }

    /// `finish` against the right accumulators `good` reports `first`, a cell found wrong before.
    fn reports_first(
        audit: &LiveAudit,
        (a, w): (&Quantized, &PackedWeights),
        good: &[i32],
        first: &Cell,
    ) {
        let err = audit
            .finish(&|| "cpu".into(), a, Rhs::Weights(w), good)
            .unwrap_err();
        assert!(
            matches!(err, Error::AuditMismatch { row, col, .. } if (row, col) == (first.row, first.col)),
            "{err}"
        );
    }

    /// Whether every cell of `audit` has been checked.
    fn all_checked(audit: &LiveAudit) -> bool {
        audit
            .cells
            .iter()
            .all(|c| c.checked.load(Ordering::Relaxed))
    }

    #[test]
    fn a_product_dequantized_as_it_is_written_checks_every_cell_in_its_blocks() {
        // Tiles of a prefill-sized product (paired rows on AVX2), and decode's runs of columns.
        for (t, n, k) in [(67, 130, 579), (1, 1536, 576)] {
            let (a, w) = operands(t, n, k);
            for seed in 0..4 {
                let audit = LiveAudit::new(t, n, seed, AUDIT_CELLS);
                let mut c = vec![0f32; t * n];
                CpuBackend::new()
                    .gemm_dequantized(&a, Rhs::Weights(&w), &mut c, &audit)
                    .unwrap();
                assert!(
                    all_checked(&audit),
                    "{t}×{n}: a cell was left for `finish`, which would read f32 bits"
                );
            }
        }
    }

    /// A `t × n` product's right accumulators, the same with every cell of `audit` off by one,
    /// and its operands.
    fn audited_cells_wrong(
        (t, n, k): (usize, usize, usize),
        audit: &LiveAudit,
    ) -> (Vec<i32>, Vec<i32>, Quantized, PackedWeights) {
        let (a, w) = operands(t, n, k);
        let mut good = vec![0i32; t * n];
        reference_i32(&a, Rhs::Weights(&w), &mut good).unwrap();
        let mut bad = good.clone();
        for c in &audit.cells {
            bad[c.row * n + c.col] = good[c.row * n + c.col].wrapping_add(1);
        }
        (good, bad, a, w)
    }

    #[test]
    fn a_block_checks_its_own_cells_and_reports_a_wrong_one() {
        let (t, n, k) = (40, 64, 130);
        let audit = LiveAudit::new(t, n, 9, AUDIT_CELLS);
        let inside = |c: &Cell| c.row < 20;
        assert!(audit.cells.iter().any(inside) && !audit.cells.iter().all(inside));
        // Every audited cell wrong, read through the block of rows [0, 20): only its cells are
        // checked, the rest are left for `finish`, which reads the right accumulators.
        let (good, bad, a, w) = audited_cells_wrong((t, n, k), &audit);
        audit.check_block(&a, Rhs::Weights(&w), (0, 20), (0, n), |row, col| {
            bad[row * n + col]
        });
        for c in &audit.cells {
            assert_eq!(c.checked.load(Ordering::Relaxed), inside(c));
        }
        let first = audit
            .cells
            .iter()
            .filter(|c| inside(c))
            .min_by_key(|c| c.index)
            .unwrap();
        reports_first(&audit, (&a, &w), &good, first);
    }

    #[test]
    fn a_wrong_cell_checked_as_the_backend_goes_is_reported_first_in_the_seeded_order() {
        let (t, n, k) = (2, 96, 577);
        let audit = LiveAudit::new(t, n, 5, AUDIT_CELLS);
        // Every audited cell wrong; checked in two runs of columns, the later columns first.
        let (good, bad, a, w) = audited_cells_wrong((t, n, k), &audit);
        let read = |row: usize, col: usize| bad[row * n + col];
        audit.check_block(&a, Rhs::Weights(&w), (0, t), (48, n), read);
        audit.check_block(&a, Rhs::Weights(&w), (0, t), (0, 48), read);
        let first = audit.cells.iter().find(|c| c.index == 0).unwrap();
        reports_first(&audit, (&a, &w), &good, first);
        // The same cells against the right accumulators pass.
        let audit = LiveAudit::new(t, n, 5, AUDIT_CELLS);
        audit.check_block(&a, Rhs::Weights(&w), (0, t), (0, n), |row, col| {
            good[row * n + col]
        });
        audit
            .finish(&|| "cpu".into(), &a, Rhs::Weights(&w), &good)
            .unwrap();
    }
}
