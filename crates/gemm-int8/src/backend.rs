//! The backend trait (the integer part of the GEMM) and the CPU backend: kernel choice at run time,
//! the pool's threads over rows and output-channel panels, and the shared scalar leftover loop.

use std::mem::MaybeUninit;

use crate::kernels;
use crate::packed::{PANEL, PackedWeights};
use crate::pool;
use crate::quant::Quantized;
use crate::verify::LiveAudit;
use crate::{Error, Operand};

/// The B operand of a GEMM: weights packed once, or an activation quantized for this call
/// (attention's K rows and Vᵀ rows).
#[derive(Debug, Clone, Copy)]
pub enum Rhs<'a> {
    /// Weights quantized once at load.
    Weights(&'a PackedWeights),
    /// Rows quantized for this call only.
    Activation(&'a Quantized),
}

impl Rhs<'_> {
    /// Output channels (rows of B).
    pub fn n(&self) -> usize {
        match self {
            Rhs::Weights(w) => w.n(),
            Rhs::Activation(q) => q.rows(),
        }
    }

    /// Row length.
    pub fn k(&self) -> usize {
        match self {
            Rhs::Weights(w) => w.k(),
            Rhs::Activation(q) => q.k(),
        }
    }

    /// One scale per output channel.
    pub fn scales(&self) -> &[f32] {
        match self {
            Rhs::Weights(w) => w.scales(),
            Rhs::Activation(q) => q.scales(),
        }
    }

    /// Write row `col` of B as plain i8 values into `out` (length K).
    pub fn write_row(&self, col: usize, out: &mut [i8]) {
        match self {
            Rhs::Weights(w) => w.write_row(col, out),
            Rhs::Activation(q) => out.copy_from_slice(q.row(col)),
        }
    }
}

/// One product of a batch handed to [`Backend::gemm_i32_batch`]: its operands and where its
/// `a.rows() × b.n()` accumulators go.
#[derive(Debug)]
pub struct BatchItem<'a> {
    /// The quantized rows of A.
    pub a: &'a Quantized,
    /// The B operand.
    pub b: Rhs<'a>,
    /// The accumulators, row-major.
    pub out: &'a mut [i32],
}

/// Something that computes the exact i32 accumulators `acc[t][n] = Σ_k qa[t][k] · qb[n][k]`.
///
/// Dequantization, gates, audit and probe stay in this crate and are shared by every backend, so a
/// backend only ever answers for the integers. A backend may keep a device copy of weights keyed by
/// [`PackedWeights::id`].
pub trait Backend: Send + Sync {
    /// A short name for logs and errors (`cpu-avx512vnni`, `wgpu:<adapter>`).
    fn name(&self) -> String;

    /// Write the `a.rows() × b.n()` accumulators into `out`, row-major.
    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error>;

    /// [`Backend::gemm_i32`], checking the cells of `audit` it can as it goes (while their operands
    /// are still in cache: [`LiveAudit::check_block`] on a block just written); the
    /// caller checks every cell left after. By default none is checked here.
    fn gemm_i32_audited(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        out: &mut [i32],
        audit: &LiveAudit,
    ) -> Result<(), Error> {
        let _ = audit;
        self.gemm_i32(a, b, out)
    }

    /// The product audited and dequantized into `c` (`a.rows() × b.n()`): the accumulators of
    /// [`Backend::gemm_i32_audited`], every cell of `audit` checked, each accumulator then
    /// replaced by `(acc as f32 · sa) · sb`. By default one after the other over the whole
    /// product; a backend may check and dequantize each part as soon as it is written, while it is
    /// in cache (the CPU backend's weight products), with the same bits and the same report.
    fn gemm_dequantized(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        c: &mut [f32],
        audit: &LiveAudit,
    ) -> Result<(), Error> {
        crate::verify::gemm_then_dequantize(self, a, b, c, audit)
    }

    /// Several independent products. A device backend may send them in one submission (one round
    /// trip instead of one each); the integers are those of [`Backend::gemm_i32`] on each item.
    fn gemm_i32_batch(&self, items: &mut [BatchItem<'_>]) -> Result<(), Error> {
        for item in items.iter_mut() {
            self.gemm_i32(item.a, item.b, item.out)?;
        }
        Ok(())
    }

    /// Whether independent products issued from several threads at once ([`crate::for_each_unit`])
    /// finish sooner than one after another: the CPU backend's do (each then runs on its caller's
    /// thread, with no pool job to share out and wait for); a device's queue gains nothing. False
    /// by default.
    fn concurrent(&self) -> bool {
        false
    }

    /// These weights take part in every pass from now on: a device backend copies them to the
    /// device now (at load) instead of at their first product. The CPU keeps them where they are.
    fn keep_resident(&self, _w: &crate::PackedWeights) -> Result<(), Error> {
        Ok(())
    }

    /// One line on where this backend's time went so far (a device's dispatches, waits and
    /// copies), for reports; `None` where there is nothing beyond the computing itself.
    fn profile(&self) -> Option<String> {
        None
    }

    /// The backend as its own type, where a caller may do more with it than products (a GPU
    /// backend runs whole layers); `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Check that A, B and the output agree in shape.
pub fn check_shapes(a: &Quantized, b: Rhs<'_>, out: &[i32]) -> Result<(), Error> {
    if a.k() != b.k() {
        return Err(Error::Shape {
            what: "k of operand b",
            got: b.k(),
            expected: a.k(),
        });
    }
    let expected = a.rows() * b.n();
    if out.len() != expected {
        return Err(Error::Shape {
            what: "accumulator buffer",
            got: out.len(),
            expected,
        });
    }
    Ok(())
}

/// A CPU instruction set the kernels can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The portable scalar loop.
    Scalar,
    /// AVX2 `vpmaddubsw` with the sign trick (every pair sum stays inside i16).
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` with A offset by +128 and a per-channel correction.
    Avx512Vnni,
    /// AMX-INT8 `tdpbssd` tiles (i8 × i8) from [`AMX_MIN_T`] rows of A; AVX-512 VNNI below.
    Amx,
}

/// Rows of A from which [`Isa::Amx`] multiplies in tiles (one A tile is 16 rows).
pub const AMX_MIN_T: usize = 16;

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Amx];

    /// Whether this CPU runs it.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512Vnni.is_supported() && kernels::amx_available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The instruction sets this CPU runs, slowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_supported())
            .collect()
    }

    /// Its name in backend names.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The CPU backend: one instruction set, chosen at run time, multithreaded over output channels.
#[derive(Debug, Clone, Copy)]
pub struct CpuBackend {
    isa: Isa,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// Below this many multiply-adds a compute-bound GEMM runs on the calling thread (about 2 µs of one
/// core: less than sharing it out saves).
const PARALLEL_MIN_MACS: usize = 1 << 19;

/// Below this many bytes of B a memory-bound GEMM (decode) runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 16;

impl CpuBackend {
    /// The fastest instruction set this CPU supports.
    pub fn new() -> Self {
        let isa = Isa::supported().pop().unwrap_or(Isa::Scalar);
        Self { isa }
    }

    /// A backend pinned to `isa`, refused when this CPU does not run it.
    pub fn with_isa(isa: Isa) -> Result<Self, Error> {
        if !isa.is_supported() {
            return Err(Error::Unsupported { isa: isa.name() });
        }
        Ok(Self { isa })
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The product on the pool; `audit`'s cells in a run of columns are checked by the thread that
    /// computed it, right after (where the GEMM is cut by columns: decode). With `dequantize`
    /// (A's and B's scales), every part is also checked and then dequantized in place by the
    /// thread that computed it, as soon as it is written (`out` then holds f32 bits).
    fn run(
        &self,
        a: &Quantized,
        b: &PackedWeights,
        out: &mut [i32],
        audit: Option<&LiveAudit>,
        dequantize: Option<(&[f32], &[f32])>,
    ) {
        let (t, n, k) = (a.rows(), b.n(), b.k());
        if t == 0 || n == 0 {
            return;
        }
        // The A operand in the form the kernel wants: +128 (as u8) for vpdpbusd, zero-padded tiles
        // for AMX, i8 otherwise. (Flipping the top bit inside the AVX-512 kernel instead costs up to
        // 40% on Intel cores, where the extra vector op competes with vpdpbusd for its ports.)
        let tiles = self.isa == Isa::Amx && t >= AMX_MIN_T;
        // From a few register tiles of rows, AVX2 multiplies by Winograd's pairs
        // (`kernels/paired.rs`), its A widened here once for every thread.
        #[cfg(target_arch = "x86_64")]
        let paired = (self.isa == Isa::Avx2 && t >= kernels::PAIRED_MIN_T)
            // SAFETY: the backend's instruction set runs on this CPU (checked when it was made);
            // `a.q()` is `t × k`.
            .then(|| unsafe { kernels::PairedRows::new(a.q(), t, k) });
        #[cfg(not(target_arch = "x86_64"))]
        let paired: Option<()> = None;
        let mut owned: Vec<u8> = Vec::new();
        let (a_bytes, stride, mr): (&[u8], usize, usize) = match self.isa {
            Isa::Amx if tiles => {
                let kp = b.kmain().div_ceil(64) * 64;
                owned = padded_rows(a.q(), t, k, kp);
                (&owned, kp, kernels::AMX_ROWS)
            }
            Isa::Avx512Vnni | Isa::Amx => {
                owned = offset_rows(a.q(), t, k);
                (&owned, k, kernels::MR)
            }
            Isa::Scalar | Isa::Avx2 => {
                // SAFETY: i8 and u8 have the same size and alignment; the kernels that take this
                // view reinterpret it back as i8.
                let q =
                    unsafe { std::slice::from_raw_parts(a.q().as_ptr().cast::<u8>(), a.q().len()) };
                let mr = if paired.is_some() {
                    kernels::PAIRED_ROWS
                } else {
                    kernels::MR
                };
                (q, k, mr)
            }
        };
        let out_ptr = SyncPtr(out.as_mut_ptr());
        // Rows [r0, r1) × panels [p0, p1).
        let tile = |r0: usize, r1: usize, p0: usize, p1: usize| {
            let out = out_ptr;
            // SAFETY: every caller below hands out disjoint rows × panels of `out` (t × n), each
            // written only by the thread that got it, and `out` outlives the pool job.
            unsafe {
                let out_rows = out.0.add(r0 * n);
                #[cfg(target_arch = "x86_64")]
                if let Some(pa) = &paired {
                    kernels::paired_panels(pa, r0, r1, b, p0, p1, out_rows, n);
                    leftover(a, b, r0, r1, p0, p1, out.0);
                    return;
                }
                if tiles {
                    kernels::amx_panels(
                        &a_bytes[r0 * stride..],
                        stride,
                        r1 - r0,
                        b,
                        p0,
                        p1,
                        out_rows,
                        n,
                    );
                } else {
                    kernels::gemm_panels(
                        self.isa,
                        &a_bytes[r0 * k..r1 * k],
                        r1 - r0,
                        k,
                        b,
                        p0,
                        p1,
                        out_rows,
                        n,
                    );
                }
                leftover(a, b, r0, r1, p0, p1, out.0);
            }
        };
        // Rows [r0, r1) × panels [p0, p1) written by this thread: their audited cells checked,
        // then, when asked, dequantized while they are in cache.
        let settle = |(r0, r1): (usize, usize), (p0, p1): (usize, usize)| {
            let out = out_ptr;
            let cols = (p0 * PANEL, (p1 * PANEL).min(n));
            if let Some(audit) = audit {
                audit.check_block(a, Rhs::Weights(b), (r0, r1), cols, |row, col| {
                    // SAFETY: row < t and col < n in this block, which this thread has just
                    // written and no other thread touches.
                    unsafe { *out.0.add(row * n + col) }
                });
            }
            if let Some((sa, sb)) = dequantize {
                for (r, &s) in sa.iter().enumerate().take(r1).skip(r0) {
                    // SAFETY: as above; the f32 view of the block's run of row r is this
                    // thread's alone, and no i32 view of it is used after.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(
                            out.0.add(r * n + cols.0).cast::<f32>(),
                            cols.1 - cols.0,
                        )
                    };
                    crate::dequantize_row(row, s, &sb[cols.0..cols.1]);
                }
            }
        };
        let panels = b.panels();
        match Split::new(t, panels, k, pool::pool().threads(), mr) {
            Split::Columns(split) => pool::for_each_chunk(split.units(), |u| {
                let (p0, p1) = split.unit(u);
                tile(0, t, p0, p1);
                settle((0, t), (p0, p1));
            }),
            Split::Tiles { strips } => {
                let blocks = panels.div_ceil(kernels::NP);
                // Items are (row strip, panel block) pairs. Where B fits in L2 they go strip by
                // strip, so that the first rows (which the caller quantized) fall to the caller and
                // the last to a worker; otherwise block by block, so that B streams once.
                let by_strips = panels * PANEL * k <= STRIP_ORDER_MAX_BYTES;
                let (outer, inner) = if by_strips {
                    (strips, blocks)
                } else {
                    (blocks, strips)
                };
                pool::for_each_guided(outer * inner, |i0, i1| {
                    let mut i = i0;
                    while i < i1 {
                        let (o, j0) = (i / inner, i % inner);
                        let j1 = (j0 + i1 - i).min(inner);
                        let ((s0, s1), (b0, b1)) = if by_strips {
                            ((o, o + 1), (j0, j1))
                        } else {
                            ((j0, j1), (o, o + 1))
                        };
                        let rows = (s0 * mr, (s1 * mr).min(t));
                        let cols = (b0 * kernels::NP, (b1 * kernels::NP).min(panels));
                        tile(rows.0, rows.1, cols.0, cols.1);
                        if dequantize.is_some() {
                            settle(rows, cols);
                        }
                        i += j1 - j0;
                    }
                });
            }
        }
        // A decode-sized operand's buffer serves this thread's next product.
        if owned.capacity() <= KEPT_OFFSET_BYTES {
            OFFSET_SPARE.set(owned);
        }
    }
}

/// Rows of A up to which a product with an activation B (attention at decode) takes each cell as one
/// dot product of two quantized rows instead of packing B first.
const ROWS_MAX_T: usize = 8;

impl CpuBackend {
    /// A product against row-major B (`q`), cell by cell ([`kernels::rows_dot`]); runs of B's rows
    /// shared out over the pool when the product is large (long contexts).
    #[cfg(target_arch = "x86_64")]
    fn rows(&self, a: &Quantized, q: &Quantized, out: &mut [i32]) {
        let (t, n, k) = (a.rows(), q.rows(), q.k());
        if t == 0 || n == 0 {
            return;
        }
        let out_ptr = SyncPtr(out.as_mut_ptr());
        let cells = |c0: usize, c1: usize| {
            let out = out_ptr;
            // SAFETY: the caller checked `rows_available` for `isa`, which this CPU supports
            // (checked when the backend was made); the shapes were checked
            // by the caller; every run of columns is handed to one thread only.
            unsafe { kernels::rows_dot(self.isa, a.q(), t, q.q(), k, (c0, c1), out.0, n) };
        };
        if t * n * k < PARALLEL_MIN_MACS {
            cells(0, n);
        } else {
            pool::for_each_guided(n, cells);
        }
    }
}

/// Bytes of packed B up to which compute-bound work is ordered by row strips (B then stays in L2
/// while every strip passes over it).
const STRIP_ORDER_MAX_BYTES: usize = 512 << 10;

/// Bytes of an A operand's +128 form that a thread keeps for its next product: a decode row (a few
/// KB, offset seven times a layer) reuses one buffer instead of an allocation each time; a
/// prefill's larger ones are not kept, so no thread holds their memory between turns.
const KEPT_OFFSET_BYTES: usize = 64 << 10;

thread_local! {
    /// The calling thread's buffer for [`offset_rows`] between two products.
    static OFFSET_SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `q + 128` as u8 (`t × k`), rows shared out over the pool in the same chunks as quantization,
/// so that each thread offsets the rows it quantized; in the calling thread's spare buffer when it
/// has one.
fn offset_rows(q: &[i8], t: usize, k: usize) -> Vec<u8> {
    let flip = |(dst, src): (&mut [MaybeUninit<u8>], &[i8])| {
        for (d, &s) in dst.iter_mut().zip(src) {
            d.write((s as u8) ^ 0x80);
        }
    };
    let mut out: Vec<u8> = OFFSET_SPARE.take();
    out.clear();
    out.reserve(q.len());
    let rows = &mut out.spare_capacity_mut()[..q.len()];
    let per = pool::rows_per_chunk(t, k, crate::PARALLEL_MIN_ELEMENTS);
    if per >= t || k == 0 {
        flip((rows, q));
    } else {
        pool::for_each_item(
            rows.chunks_mut(per * k).zip(q.chunks(per * k)).collect(),
            flip,
        );
    }
    // SAFETY: every element of the first `q.len()` was written above.
    unsafe { out.set_len(q.len()) };
    out
}

/// The rows of `q` (`t × k`) as AMX tiles want them: row stride `kp` (a multiple of 64, at least
/// K − K mod 4), rows up to a multiple of 16, zero past each row's grouped part and past row `t`.
/// Shared out over the pool like [`offset_rows`].
fn padded_rows(q: &[i8], t: usize, k: usize, kp: usize) -> Vec<u8> {
    let kmain = k - k % 4;
    let rows = t.div_ceil(kernels::AMX_TILE) * kernels::AMX_TILE;
    let per = pool::rows_per_chunk(t, k, crate::PARALLEL_MIN_ELEMENTS);
    let mut out: Vec<u8> = pool::zeroed_rows(rows, kp, per);
    if kp == 0 {
        return out;
    }
    let copy = |(dst, src): (&mut [u8], &[i8])| {
        for (d, s) in dst.chunks_exact_mut(kp).zip(src.chunks_exact(k)) {
            for (x, &y) in d[..kmain].iter_mut().zip(&s[..kmain]) {
                *x = y as u8;
            }
        }
    };
    if per >= t {
        copy((&mut out[..t * kp], q));
    } else {
        pool::for_each_item(
            out[..t * kp]
                .chunks_mut(per * kp)
                .zip(q.chunks(per * k))
                .collect(),
            copy,
        );
    }
    out
}

/// How one GEMM is cut into work shared out over the pool's threads.
enum Split {
    /// Memory-bound calls (decode, and few rows over many panels): runs of whole panel blocks, so
    /// that every unit streams its own run of B once.
    Columns(Columns),
    /// Compute-bound calls: (panel block, row strip) tiles of the widest register tile, handed
    /// out in runs that shrink as the work runs out (guided), so that the threads end together.
    Tiles { strips: usize },
}

/// Rows from which a GEMM is compute-bound (each B byte then feeds enough multiply-adds that B may
/// be read once per row strip).
const COMPUTE_MIN_T: usize = 32;

impl Split {
    /// `mr`: rows of A in the kernel's register tile (row strips are cut in multiples of it).
    fn new(t: usize, panels: usize, k: usize, threads: usize, mr: usize) -> Self {
        let blocks = panels.div_ceil(kernels::NP);
        let small = if t <= kernels::STREAM_MAX_T {
            panels * PANEL * k < PARALLEL_MIN_BYTES
        } else {
            t * panels * PANEL * k < PARALLEL_MIN_MACS
        };
        if threads < 2 || small || blocks == 0 {
            return Split::Columns(Columns {
                panels_per: panels.max(1),
                whole: 1,
                pieces: 0,
                panels,
            });
        }
        let memory_bound = t < COMPUTE_MIN_T && blocks >= 2 * threads;
        if t > kernels::STREAM_MAX_T && !memory_bound {
            return Split::Tiles {
                strips: t.div_ceil(mr),
            };
        }
        // Runs of `per` blocks. With one block per unit and a count of blocks that the threads do
        // not divide (SmolLM2's q, o and down have 9), the last block is cut into a piece per
        // thread, so that the threads end together.
        let per = blocks.div_ceil(16 * threads);
        let units = blocks.div_ceil(per);
        let last = panels - (units - 1) * per * kernels::NP;
        let (whole, pieces) = if per == 1 && !units.is_multiple_of(threads) && last > 1 {
            (units - 1, threads.min(last))
        } else {
            (units, 0)
        };
        Split::Columns(Columns {
            panels_per: per * kernels::NP,
            whole,
            pieces,
            panels,
        })
    }
}

/// Column units: `whole` runs of `panels_per` panels, then the panels after them in `pieces`
/// more units.
struct Columns {
    panels_per: usize,
    whole: usize,
    pieces: usize,
    panels: usize,
}

impl Columns {
    fn units(&self) -> usize {
        self.whole + self.pieces
    }

    /// Unit `c` as panels `[p0, p1)`.
    fn unit(&self, c: usize) -> (usize, usize) {
        if c < self.whole {
            let p0 = c * self.panels_per;
            (p0, (p0 + self.panels_per).min(self.panels))
        } else {
            let base = self.whole * self.panels_per;
            let (i, rest) = (c - self.whole, self.panels - base);
            (
                base + i * rest / self.pieces,
                base + (i + 1) * rest / self.pieces,
            )
        }
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut i32);
// SAFETY: the pointer is only used for disjoint writes (see `CpuBackend::run`).
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}

/// The scalar leftover loop: adds the last `K mod 4` products of rows `[r0, r1)` to columns
/// `[16·p0, 16·p1) ∩ [0, n)`.
///
/// # Safety
/// `out` must point to `a.rows() × b.n()` writable i32 that no other thread touches in these cells.
unsafe fn leftover(
    a: &Quantized,
    b: &PackedWeights,
    r0: usize,
    r1: usize,
    p0: usize,
    p1: usize,
    out: *mut i32,
) {
    let (n, k) = (b.n(), b.k());
    let kmain = b.kmain();
    let rest = k - kmain;
    if rest == 0 {
        return;
    }
    let tail = b.tail();
    let (c0, c1) = (p0 * PANEL, (p1 * PANEL).min(n));
    for r in r0..r1 {
        let qa = &a.row(r)[kmain..];
        for col in c0..c1 {
            let qb = &tail[col * rest..(col + 1) * rest];
            let s: i32 = qa
                .iter()
                .zip(qb)
                .map(|(&x, &y)| i32::from(x) * i32::from(y))
                .sum();
            // SAFETY: r < t and col < n, inside the caller's cells.
            unsafe {
                let o = out.add(r * n + col);
                *o = (*o).wrapping_add(s);
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu-{}", self.isa.name())
    }

    fn concurrent(&self) -> bool {
        true
    }

    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
        check_shapes(a, b, out)?;
        match b {
            Rhs::Weights(w) => self.run(a, w, out, None, None),
            #[cfg(target_arch = "x86_64")]
            Rhs::Activation(q) if a.rows() <= ROWS_MAX_T && kernels::rows_available(self.isa) => {
                self.rows(a, q, out)
            }
            Rhs::Activation(q) => self.run(a, &PackedWeights::from_quantized(q), out, None, None),
        }
        Ok(())
    }

    fn gemm_i32_audited(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        out: &mut [i32],
        audit: &LiveAudit,
    ) -> Result<(), Error> {
        match b {
            Rhs::Weights(w) => {
                check_shapes(a, b, out)?;
                self.run(a, w, out, Some(audit), None);
                Ok(())
            }
            Rhs::Activation(_) => self.gemm_i32(a, b, out),
        }
    }

    fn gemm_dequantized(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        c: &mut [f32],
        audit: &LiveAudit,
    ) -> Result<(), Error> {
        let Rhs::Weights(w) = b else {
            return crate::verify::gemm_then_dequantize(self, a, b, c, audit);
        };
        let acc = crate::as_accumulators(c);
        check_shapes(a, b, acc)?;
        // Every block is checked before it is dequantized, so no cell is left for `finish` to
        // read (it would read f32 bits); it reports the first disagreement the blocks found.
        self.run(a, w, acc, Some(audit), Some((a.scales(), w.scales())));
        audit.finish(&|| self.name(), a, b, acc)
    }
}

impl Operand {
    pub(crate) fn matrix_name(self) -> &'static str {
        match self {
            Operand::A => "operand a (rows × k)",
            Operand::B => "operand b (n × k)",
        }
    }
}
