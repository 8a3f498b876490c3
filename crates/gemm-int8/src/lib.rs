//! The verified INT8 GEMM: one scale per activation row, one per weight column, exact i32 accumulation
//! (DESIGN.md §3). Every matrix multiply in the project goes through this crate.
//!
//! `C = A · Bᵀ` with A `t × k` (activations) and B `n × k` (row n = output channel n):
//! [`quantize_rows`] / [`PackedWeights::new`] quantize, a [`Backend`] computes the i32 accumulators,
//! and [`gemm`] / [`gemm_act`] dequantize them here, `((acc as f32) · sa) · sb`, after [`audit`]ing a
//! few seeded cells against the scalar reference. [`exact_gates`] admits a backend, [`probe`] hashes a
//! seeded GEMM so devices can be compared, and [`measure_rate`] feeds the planner.

/// A function whose plain body is compiled three times — for baseline x86-64, AVX2 and AVX-512 (F
/// and BW) — the widest the CPU runs chosen at run time. For bodies of integer operations and single
/// IEEE operations only, so every copy gives the same bits (Rust never fuses separate operations
/// into an FMA); the wider copies only let the compiler vectorize them.
macro_rules! simd_versions {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw")]
            fn wide($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512bw") {
                // SAFETY: AVX-512 F and BW were detected just above (BW implies F).
                return unsafe { wide($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was detected just above.
                return unsafe { avx2($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

mod backend;
mod kernels;
mod packed;
mod pool;
mod quant;
mod verify;

pub use backend::{AMX_MIN_T, Backend, BatchItem, CpuBackend, Isa, Rhs, check_shapes};
pub use packed::{HugeBytes, PackedBuilder, PackedParts, PackedWeights, SharedBytes, WeightArena};
pub use quant::{GrowingRows, Quantized, quantize_residual, quantize_rows};
pub use verify::{
    AUDIT_CELLS, LiveAudit, PROBE_SHAPE, audit, exact_gates, measure_rate, probe, reference_cell,
    reference_i32, seeded_matrix, splitmix,
};

/// Wake the GEMM's parked worker threads now (off the calling thread's CPU), so that they are up
/// when the next GEMM comes: for a caller that knows one is near but has other work before it — a
/// ring member whose next activation is arriving and being decrypted. They spin for the next call
/// as after any GEMM, and park again if none comes.
pub fn wake() {
    pool::wake();
}

/// Let the GEMM's idle worker threads park soon rather than spin for the next call (they spin a
/// few hundred microseconds by default, so that back-to-back GEMMs pay no wake-up; after `rest`,
/// 150 µs, yielding, to cover the hand-off of a lap to the next stage). For a caller whose next GEMM
/// is far off — a ring member whose lap has moved on to the next device — so that several members
/// on one machine do not take each other's cores. The next GEMM wakes them.
pub fn rest() {
    pool::rest();
}

/// Ask an idle GEMM worker to bring `w`'s packed values towards the caches while the caller does
/// other work (attention, between two products of a layer), so that its product reads them from
/// cache instead of memory. Nothing computed depends on it. Weights held in shared bytes (an arena,
/// a kept shard) are read with loads, the bytes kept alive until read; others get prefetch hints.
pub fn prefetch(w: &PackedWeights) {
    pool::prefetch(w);
}

/// Run `f(unit)` for every unit in `0..count` over the GEMM's threads, units taken one at a time
/// from both ends (the calling thread from the front, a worker from the back): independent pieces
/// of work between products, each of which may run its own products (a product called inside runs
/// on its caller's thread alone, the pool being busy). On the calling thread alone when
/// `count < 2`.
pub fn for_each_unit(count: usize, f: impl Fn(usize) + Sync) {
    pool::for_each_chunk(count, f);
}

/// Run `f(first_row, rows)` over `x` cut into runs of whole rows (`cols` values each), shared out
/// over the GEMM's threads when there is enough work, on the calling thread otherwise: the
/// element-wise passes between products (norms, RoPE, SiLU, softmax), so that they neither leave the
/// GEMM's workers idle nor start a second pool of threads beside them. Runs are taken from both
/// ends like a GEMM's rows, so a row tends to stay on the core that computed it.
pub fn for_each_rows<T: Send>(x: &mut [T], cols: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if cols == 0 || x.is_empty() {
        return;
    }
    let rows = x.len() / cols;
    let per = pool::rows_per_chunk(rows, cols, PARALLEL_MIN_ELEMENTS);
    if per >= rows {
        f(0, x);
        return;
    }
    let runs: Vec<(usize, &mut [T])> = x
        .chunks_mut(per * cols)
        .enumerate()
        .map(|(i, run)| (i * per, run))
        .collect();
    pool::for_each_item(runs, |(r0, run)| f(r0, run));
}

/// The largest K for which `127² · K < 2³¹`, so the i32 accumulator is exact.
pub const MAX_K: usize = 131_071;

/// Which operand of `A · Bᵀ` a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The activation rows (`t × k`).
    A,
    /// The weight rows or per-call B rows (`n × k`).
    B,
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operand::A => "a",
            Operand::B => "b",
        })
    }
}

/// Everything this crate refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An input element is NaN or ±inf.
    #[error(
        "operand {operand} holds {value} at row {row}, column {col}; every element must be finite"
    )]
    NonFinite {
        operand: Operand,
        row: usize,
        col: usize,
        value: f32,
    },
    /// K is beyond what an i32 accumulator holds exactly.
    #[error("k is {k}; at most {MAX_K} keeps the i32 accumulator exact")]
    KTooLarge { k: usize },
    /// A length disagrees with the shape.
    #[error("{what} has length {got}, expected {expected}")]
    Shape {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// An array borrowed from shared bytes starts where its values cannot be read in place.
    #[error("{what} starts at byte {offset}, not a multiple of {align}")]
    Misaligned {
        what: &'static str,
        offset: usize,
        align: usize,
    },
    /// A quantized value outside `-127..=127`.
    #[error("quantized value {value} at row {row}, column {col} is outside -127..=127")]
    OutOfRange { value: i32, row: usize, col: usize },
    /// A row scale that is negative or not finite.
    #[error("row {row} has scale {value}; expected finite and non-negative")]
    BadScale { value: f32, row: usize },
    /// The CPU lacks an instruction set that was asked for.
    #[error("this cpu does not support {isa}")]
    Unsupported { isa: &'static str },
    /// A backend disagreed with the scalar reference in an init gate.
    #[error(
        "backend {backend} failed gate {gate} at row {row}, column {col}: got {got}, expected {expected}"
    )]
    GateMismatch {
        backend: String,
        gate: &'static str,
        row: usize,
        col: usize,
        got: i32,
        expected: i32,
    },
    /// A live GEMM disagreed with the scalar reference in an audited cell.
    #[error(
        "audit of backend {backend} failed at row {row}, column {col}: got {got}, expected {expected}"
    )]
    AuditMismatch {
        backend: String,
        row: usize,
        col: usize,
        got: i32,
        expected: i32,
    },
    /// A backend could not run (a device error, a lost adapter).
    #[error("backend {backend} failed: {message}")]
    Backend { backend: String, message: String },
}

/// `C[t][n] = ((acc as f32) · sa[t]) · sb[n]`: two correctly rounded f32 multiplies, left to right,
/// no FMA — the one dequantization every backend's accumulators go through.
pub fn dequantize(acc: &[i32], sa: &[f32], sb: &[f32]) -> Result<Vec<f32>, Error> {
    let expected = sa.len() * sb.len();
    if acc.len() != expected {
        return Err(Error::Shape {
            what: "accumulators",
            got: acc.len(),
            expected,
        });
    }
    let mut out: Vec<f32> = acc.iter().map(|&v| f32::from_bits(v as u32)).collect();
    dequantize_in_place(&mut out, sa, sb);
    Ok(out)
}

/// One dequantized element.
#[inline]
fn dequantize_one(acc: i32, sa: f32, sb: f32) -> f32 {
    (acc as f32 * sa) * sb
}

/// Dequantize accumulators stored as raw i32 bits in `c` (`sa.len() × sb.len()`), rows shared out
/// over the pool when large.
pub(crate) fn dequantize_in_place(c: &mut [f32], sa: &[f32], sb: &[f32]) {
    let n = sb.len();
    if n == 0 {
        return;
    }
    // Rows stay with the thread that computed them (see `pool::Side`), so sharing out pays from
    // fewer elements than quantization does.
    let rows = pool::rows_per_chunk(sa.len(), n, PARALLEL_MIN_ELEMENTS / 4);
    let job = |(r, s): (&mut [f32], &[f32])| {
        for (r, &s) in r.chunks_mut(n).zip(s) {
            dequantize_row(r, s, sb);
        }
    };
    if rows >= sa.len() {
        job((c, sa));
    } else {
        pool::for_each_item(c.chunks_mut(rows * n).zip(sa.chunks(rows)).collect(), job);
    }
}

simd_versions! {
    /// One row of [`dequantize_in_place`] (or a run of its columns, `sb` theirs).
    pub(crate) fn dequantize_row(r: &mut [f32], s: f32, sb: &[f32]) {
        for (v, &t) in r.iter_mut().zip(sb) {
            *v = dequantize_one(v.to_bits() as i32, s, t);
        }
    }
}

/// Element-wise passes (quantize, dequantize) below this size stay on the calling thread.
pub(crate) const PARALLEL_MIN_ELEMENTS: usize = 1 << 14;

/// The full contract with weights packed once: quantize A (`t × k`), integer GEMM on `backend`, audit,
/// dequantize. Returns C, `t × n`.
pub fn gemm(
    backend: &dyn Backend,
    a: &[f32],
    t: usize,
    b: &PackedWeights,
) -> Result<Vec<f32>, Error> {
    // A's quantized rows go into memory given back on this thread (every weight product of a
    // token, four a layer, reuses the same buffers instead of allocating two).
    let qa = quantize_rows_reusing(a, t, b.k())?;
    let c = gemm_quantized(backend, &qa, Rhs::Weights(b));
    recycle(qa);
    c
}

thread_local! {
    /// The buffers of quantized operands given back on this thread ([`recycle`]), for the next
    /// [`quantize_rows_reusing`].
    static SPARES: std::cell::RefCell<Vec<(Vec<i8>, Vec<f32>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers a thread keeps: a decode layer's products and attention quantize up to ten operands
/// between two [`recycle`]s of the first.
const SPARES_MAX: usize = 16;

/// The largest quantized operand whose memory is kept (a 512-row prefill chunk of SmolLM2's MLP
/// is 0.8 MB); a larger one is freed.
const SPARE_MAX_BYTES: usize = 1 << 20;

/// [`quantize_rows`] into the memory of an operand given back on this thread with [`recycle`]
/// (allocating only when there is none): the same values and scales, without the allocator in a
/// token loop that quantizes the same shapes over and over.
pub fn quantize_rows_reusing(a: &[f32], rows: usize, k: usize) -> Result<Quantized, Error> {
    quant::quantize_reusing(Operand::A, a, rows, k, take_spare())
}

/// The top-left `rows × cols` corner of `q` (its first rows, each cut to its first values, each
/// keeping its whole row's scale) into memory given back on this thread with [`recycle`]: the
/// operand of a product whose other operand is zero past column `cols`, whose cells are then those
/// of the whole rows (attention's causal triangle). Refuses a corner larger than `q`.
pub fn leading_reusing(q: &Quantized, rows: usize, cols: usize) -> Result<Quantized, Error> {
    q.leading_into(rows, cols, take_spare())
}

/// The memory of an operand given back on this thread ([`recycle`]), or none.
fn take_spare() -> (Vec<i8>, Vec<f32>) {
    SPARES
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keep `q`'s memory for the next [`quantize_rows_reusing`] on this thread (up to [`SPARES_MAX`]
/// operands of at most [`SPARE_MAX_BYTES`] each; the rest is freed).
pub fn recycle(q: Quantized) {
    let buffers = q.into_buffers();
    if buffers.0.capacity() > SPARE_MAX_BYTES {
        return;
    }
    // A thread being torn down, or a spare list in use further up this thread's stack, simply
    // frees the memory.
    let _ = SPARES.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARES_MAX
        {
            if s.capacity() == 0 {
                s.reserve_exact(SPARES_MAX);
            }
            s.push(buffers);
        }
    });
}

/// The full contract with B an activation (`n × k`, quantized for this call): attention's K rows and
/// Vᵀ rows.
pub fn gemm_act(
    backend: &dyn Backend,
    a: &[f32],
    t: usize,
    b: &[f32],
    n: usize,
    k: usize,
) -> Result<Vec<f32>, Error> {
    let qa = quantize_rows(a, t, k)?;
    let qb = quant::quantize(Operand::B, b, n, k)?;
    gemm_quantized(backend, &qa, Rhs::Activation(&qb))
}

/// Integer GEMM on `backend` from quantized operands, audit, dequantize.
pub fn gemm_quantized(backend: &dyn Backend, a: &Quantized, b: Rhs<'_>) -> Result<Vec<f32>, Error> {
    let (t, n) = (a.rows(), b.n());
    let mut c = output_memory(t, n);
    gemm_quantized_into(backend, a, b, &mut c)?;
    Ok(c)
}

/// Memory for a product's `t × n` outputs: an output given back on this thread
/// ([`recycle_output`]), holding whatever it held, or fresh zeroed memory. Either way every backend
/// writes every cell of its accumulators (the trait's contract) before any is read.
fn output_memory(t: usize, n: usize) -> Vec<f32> {
    if let Some(c) = reused_output(t * n) {
        return c;
    }
    if t * n * 4 >= 4 << 20 {
        // Fresh pages, faulted in by the kernel's own threads (as huge pages where granted).
        let mut c = vec![0f32; t * n];
        advise_huge_pages(&mut c);
        c
    } else {
        // Zeroed row by row on the threads that will write those rows.
        pool::zeroed_rows(t, n, pool::rows_per_chunk(t, n, PARALLEL_MIN_ELEMENTS / 4))
    }
}

thread_local! {
    /// Outputs given back on this thread ([`recycle_output`]), for the next products' outputs.
    static OUTPUTS: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Outputs a thread keeps: a layer's products (q/k/v, o, gate/up, down), the activation between
/// them, and attention's scores of several heads.
const OUTPUTS_MAX: usize = 8;

/// The most bytes of outputs a thread keeps (a 512-row prefill of SmolLM2's gate/up is 6.3 MB;
/// of Qwen2.5-0.5B's, 20 MB, with its 10 MB activation beside it).
const OUTPUTS_MAX_BYTES: usize = 64 << 20;

/// A given-back output is lent for a smaller one only up to this many times that one's length…
const OUTPUT_SPARE_RATIO: usize = 4;

/// …unless it is at most this many f32 (64 KiB: a decode token's outputs, which then never
/// allocate).
const OUTPUT_SMALL: usize = 16 << 10;

/// A buffer of `len` f32 from the outputs given back on this thread (the smallest that holds
/// `len`, and not one over [`OUTPUT_SPARE_RATIO`] times larger unless it is small), its values
/// whatever it held (zeros past its old length); `None` when there is none.
fn reused_output(len: usize) -> Option<Vec<f32>> {
    if len == 0 {
        return None;
    }
    OUTPUTS
        .try_with(|o| {
            let mut o = o.try_borrow_mut().ok()?;
            // The smallest that holds it, but not a large one for a small output: lent, it would
            // come back cut to that output's length, and the next large output it serves would
            // have to be zeroed past that length (its memory there may never have been written)
            // — a 512-token prefill zeroed its gate/up output, 6 MB, in every layer so.
            let best = (0..o.len())
                .filter(|&i| {
                    let cap = o[i].capacity();
                    cap >= len && (cap <= OUTPUT_SPARE_RATIO * len || cap <= OUTPUT_SMALL)
                })
                .min_by_key(|&i| o[i].capacity())?;
            let mut v = o.swap_remove(best);
            if v.len() >= len {
                v.truncate(len);
            } else {
                v.resize(len, 0.0);
            }
            Some(v)
        })
        .ok()
        .flatten()
}

/// Free the outputs given back on this thread whose memory exceeds `bytes` (the end of a pass: a
/// long prefill's outputs are megabytes, which the next pass, a decode token, does not need).
pub fn release_outputs_over(bytes: usize) {
    let _ = OUTPUTS.try_with(|o| {
        if let Ok(mut o) = o.try_borrow_mut() {
            o.retain(|v| v.capacity() * 4 <= bytes);
        }
    });
}

/// A buffer of `len` f32 whose values are unspecified (those of an output given back with
/// [`recycle_output`], or zeros): for work that writes every element before reading any (an
/// activation between two products). Its memory is reused rather than allocated and zeroed.
pub fn output_buffer(len: usize) -> Vec<f32> {
    reused_output(len).unwrap_or_else(|| vec![0.0; len])
}

/// Keep `v`'s memory for the outputs of this thread's next products ([`gemm`],
/// [`gemm_quantized`], [`gemm_quantized_batch`], [`output_buffer`]): a product's output that its
/// caller is done with. Up to [`OUTPUTS_MAX`] buffers and [`OUTPUTS_MAX_BYTES`] are kept (the
/// smallest given way to a larger one); the rest is freed.
pub fn recycle_output(v: Vec<f32>) {
    let bytes = |v: &Vec<f32>| v.capacity() * 4;
    if v.capacity() == 0 || bytes(&v) > OUTPUTS_MAX_BYTES {
        return;
    }
    // A thread being torn down, or the list in use further up this thread's stack, frees it.
    let _ = OUTPUTS.try_with(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return;
        };
        if o.capacity() == 0 {
            o.reserve_exact(OUTPUTS_MAX);
        }
        o.push(v);
        // Over a limit: free the smallest first (the large ones are what zeroing costs most).
        while o.len() > OUTPUTS_MAX || o.iter().map(bytes).sum::<usize>() > OUTPUTS_MAX_BYTES {
            let smallest = (0..o.len()).min_by_key(|&i| o[i].capacity()).unwrap_or(0);
            drop(o.swap_remove(smallest));
        }
    });
}

/// Ask the kernel to back a large fresh buffer (the lm_head's output at long T is 100 MB) with
/// transparent huge pages: first touch then faults in 2 MiB at a time instead of 4 KiB, which in a
/// virtual machine is most of the cost of a new buffer. Advice only; nothing else changes.
fn advise_huge_pages(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = std::mem::size_of_val(buf);
        if bytes < 2 * HUGE {
            return;
        }
        let start = buf.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let last = (start + bytes) / HUGE * HUGE;
        if last > first {
            // SAFETY: [first, last) lies inside `buf`, which this thread owns; MADV_HUGEPAGE changes
            // no contents and no mapping, only how later faults are served. Its result is ignored:
            // without huge pages the buffer works the same, only slower to fault in.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// [`gemm_quantized`] for several independent products at once, through
/// [`Backend::gemm_i32_batch`] (one round trip on a device backend); each is audited and
/// dequantized as alone. Returns each C, `a.rows() × b.n()`, in order.
pub fn gemm_quantized_batch(
    backend: &dyn Backend,
    pairs: &[(&Quantized, Rhs<'_>)],
) -> Result<Vec<Vec<f32>>, Error> {
    // Given back outputs, or zeroed row by row on the threads that will write those rows
    // (attention's scores at a long prompt are megabytes per layer).
    let mut outs: Vec<Vec<f32>> = pairs
        .iter()
        .map(|(a, b)| output_memory(a.rows(), b.n()))
        .collect();
    {
        let mut items: smallvec::SmallVec<[BatchItem<'_>; 8]> =
            smallvec::SmallVec::with_capacity(pairs.len());
        for ((a, b), c) in pairs.iter().zip(&mut outs) {
            // Each view covers its own vector and is dropped before it is used as f32.
            let out = as_accumulators(c);
            check_shapes(a, *b, out)?;
            items.push(BatchItem { a, b: *b, out });
        }
        backend.gemm_i32_batch(&mut items)?;
        for item in &items {
            verify::audit_live(backend, item.a, item.b, item.out)?;
        }
    }
    for ((a, b), c) in pairs.iter().zip(&mut outs) {
        dequantize_in_place(c, a.scales(), b.scales());
    }
    Ok(outs)
}

/// [`gemm_quantized`] into a caller's buffer (`a.rows() × b.n()`), so a large output (the lm_head
/// at long T) is not allocated and faulted in on every call.
pub fn gemm_quantized_into(
    backend: &dyn Backend,
    a: &Quantized,
    b: Rhs<'_>,
    c: &mut [f32],
) -> Result<(), Error> {
    let expected = a.rows() * b.n();
    if c.len() != expected {
        return Err(Error::Shape {
            what: "output buffer",
            got: c.len(),
            expected,
        });
    }
    // One buffer: the backend writes i32 accumulators into it, which are then dequantized in place.
    backend.gemm_dequantized(a, b, c, &verify::LiveAudit::live(a, b))
}

/// `c` viewed as the i32 accumulators a backend writes before they are dequantized in place.
pub(crate) fn as_accumulators(c: &mut [f32]) -> &mut [i32] {
    // SAFETY: f32 and i32 have the same size and alignment and every bit pattern is valid for
    // both; the view borrows `c` mutably, so `c` is not used as f32 while it lives.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast::<i32>(), c.len()) }
}
