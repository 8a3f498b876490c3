//! Causal self-attention as GEMMs, per head (DESIGN.md §3.6), with the optional per-stage KV cache.
//!
//! Follows `transformers`' eager attention (`LlamaAttention`, `GPT2Attention`): scores = Q·Kᵀ, scaled
//! by 1/sqrt(head_dim), masked (causal, and the sliding window: a query at q sees keys k with
//! q−W < k ≤ q), softmax in f32, times V. It differs in that both products are GEMMs over every key
//! present in the call — masked keys included, with masked probabilities exactly 0 — so that the
//! sliding window never changes which rows enter a GEMM (and so never changes an int8 scale).
//! At int8 a long call's query rows go in runs of 64, each run's products stopping at the last key
//! it sees (half the causal square is never computed): the kept keys and values keep their
//! scales, and the dropped cells are masked scores and zero probabilities, so every cell is the
//! whole call's, bit for bit.
//!
//! The query heads that share a kv head g run as one GEMM pair: their rows stacked into one A against
//! the same K_g (and V_gᵀ). Rows quantize independently, so each cell is the one a GEMM per head gives,
//! bit for bit; K_g and V_gᵀ are quantized once per group instead of once per head, and the K rows of
//! the cache are kept quantized (a row's scale is its own, so appending is exact). The groups' products
//! go to the backend as one batch of independent products (one round trip on a GPU) while their
//! scores are small; on the CPU a call of several rows shares its (group, run) pairs out over the
//! GEMM's threads instead, each pair's products on one thread. Each product's cells are the same
//! every way.

use daisy_gemm_int8::{Error as GemmError, GrowingRows, Quantized, for_each_rows};
use smallvec::SmallVec;

use crate::gemm::{ActRhs, Ctx, act_gemm_batch, act_rhs, quantize_keys};
use crate::ops::softmax_visible_rows;
use crate::{Error, Result};

/// The keys and values one layer has seen, after RoPE, one buffer per kv head (`len × head_dim`),
/// and for int8 the key rows quantized (values and scales, per kv head; at int8x2 their second
/// planes too).
#[derive(Clone, Debug, Default)]
pub(crate) struct LayerCache {
    k: Vec<Vec<f32>>,
    /// Vᵀ per kv head (a row per value channel, a column per position), kept quantized as it grows.
    vt: Vec<GrowingRows>,
    kq: Vec<Quantized>,
    kq2: Vec<Quantized>,
    len: usize,
}

impl LayerCache {
    /// Positions held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keep the keys and values of the first `len` positions (rejected lookahead drafts, or the end
    /// of an earlier turn that a new one does not share).
    pub(crate) fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let hd = match (self.k.first(), self.len) {
            (Some(k), n) if n > 0 => k.len() / n,
            _ => 0,
        };
        for k in &mut self.k {
            k.truncate(len * hd);
        }
        for vt in &mut self.vt {
            vt.truncate(len);
        }
        for q in self.kq.iter_mut().chain(&mut self.kq2) {
            q.truncate(len);
        }
        self.len = len;
    }
}

/// Score cells (all kv-head groups) up to which one call's groups go to the backend as one batch.
const BATCH_SCORE_CELLS: usize = 1 << 22;

/// Score rows masked and softmaxed together (their sums advance together).
const SOFTMAX_ROWS: usize = 8;

/// Query rows from which a call's products are cut into runs of this many rows, each against the
/// keys it sees only (the causal triangle's other half is never computed).
const CAUSAL_ROWS: usize = 64;

/// The query rows of one run of an attention call's products: the whole call where its rows are
/// few, or at f32 (whose sums over a shorter row need not round as over the whole); runs of
/// [`CAUSAL_ROWS`] otherwise. At int8 a run's cells are those of the whole call bit for bit: rows
/// quantize independently, the keys a run leaves out are the masked ones, and its probabilities
/// there are exactly 0, so the values' integer sums are the same without them.
fn causal_rows(precision: crate::Precision, t: usize) -> usize {
    match precision.is_int8() && t > CAUSAL_ROWS {
        true => CAUSAL_ROWS,
        false => t.max(1),
    }
}

/// The output of an attention call, written by its runs, each its own cells (from several threads
/// where the runs are shared out).
struct Cells(*mut f32);

// SAFETY: the runs that share it write disjoint cells (see `attention_in_runs`).
unsafe impl Sync for Cells {}

impl Cells {
    /// Copy `row` to cells `at ..< at + row.len()`.
    ///
    /// # Safety
    /// Those cells lie inside the output, and no other thread touches them meanwhile.
    unsafe fn write(&self, at: usize, row: &[f32]) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), self.0.add(at), row.len()) };
    }
}

/// One entry per kv head of a call, held inline up to eight (no allocation per layer at decode).
type PerKvHead<T> = SmallVec<[T; 8]>;

/// The shape of one attention call.
pub(crate) struct Heads {
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) window: Option<usize>,
}

/// The scores' scale: `transformers` scales by the f32 rounding of head_dim^-0.5 computed in f64.
pub(crate) fn score_scale(head_dim: usize) -> f32 {
    libm::pow(head_dim as f64, -0.5) as f32
}

/// Attention of `t` query rows at positions `pos0..pos0+t`.
///
/// `qkv` holds `t` rows of the q/k/v projection as it comes out of its GEMM: each row its query heads
/// (`num_heads·head_dim`), then its key heads and its value heads (`num_kv_heads·head_dim` each).
/// Without a cache the call sees exactly these keys and `pos0` must be 0; with one, the new keys are
/// appended and the call sees every cached key plus these. Returns `t × num_heads·head_dim`.
pub(crate) fn attention(
    cx: Ctx<'_>,
    shape: &Heads,
    qkv: &[f32],
    t: usize,
    pos0: usize,
    cache: Option<&mut LayerCache>,
    layer: usize,
) -> Result<Vec<f32>> {
    let step = causal_rows(cx.precision, t);
    attention_in_runs(
        cx,
        shape,
        (qkv, t, pos0),
        cache,
        layer,
        (step, leading, head_of),
    )
}

/// A leading corner of a product's B operand (`n` rows of their first `k` values).
type Cut = fn(&ActRhs<'_>, usize, usize) -> std::result::Result<ActRhs<'static>, GemmError>;

/// [`ActRhs::leading`]: each row keeps its whole row's scale.
fn leading(b: &ActRhs<'_>, n: usize, k: usize) -> std::result::Result<ActRhs<'static>, GemmError> {
    b.leading(n, k)
}

/// The query head that is the `i`-th of kv head `g`'s `group`.
type HeadOf = fn(usize, usize, usize) -> usize;

/// Query heads lie kv group after kv group: head `g·group + i`.
fn head_of(g: usize, group: usize, i: usize) -> usize {
    g * group + i
}

/// `cut` of each operand: `n` rows of their first `k` values.
fn cut_each<'b>(
    ops: &[ActRhs<'_>],
    (n, k): (usize, usize),
    cut: Cut,
    what: &dyn Fn() -> String,
) -> Result<PerKvHead<ActRhs<'b>>> {
    ops.iter()
        .map(|b| cut(b, n, k))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| crate::gemm::gemm_err(what, e))
}

/// [`attention`] with its query rows in runs of `step` (the whole call when `step ≥ t`), each run's
/// keys and values cut to the ones it sees by `cut`, its outputs placed in query head `head(…)`.
fn attention_in_runs(
    cx: Ctx<'_>,
    shape: &Heads,
    (qkv, t, pos0): (&[f32], usize, usize),
    cache: Option<&mut LayerCache>,
    layer: usize,
    (step, cut, head): (usize, Cut, HeadOf),
) -> Result<Vec<f32>> {
    let step = step.max(1);
    let Heads {
        num_heads,
        num_kv_heads,
        head_dim: hd,
        window,
    } = *shape;
    let kv_cols = num_kv_heads * hd;
    let q_cols = num_heads * hd;
    let width = q_cols + 2 * kv_cols;
    if qkv.len() != t * width {
        return Err(Error::Invalid(format!(
            "attention of layer {layer}: {} projected values for {t} rows of {width}",
            qkv.len()
        )));
    }
    // Head `g`'s columns of the part that starts at column `from` of the rows `rows`.
    let split = |from: usize, g: usize, rows: std::ops::Range<usize>, out: &mut Vec<f32>| {
        for row in qkv.chunks_exact(width).take(rows.end).skip(rows.start) {
            out.extend_from_slice(&row[from + g * hd..from + (g + 1) * hd]);
        }
    };
    let mut local = LayerCache::default();
    let cache = match cache {
        Some(c) => {
            if c.len != pos0 {
                return Err(Error::Activation {
                    got: t,
                    pos: pos0,
                    expected: t,
                    want_pos: c.len,
                });
            }
            c
        }
        None => {
            if pos0 != 0 {
                return Err(Error::Invalid(format!(
                    "full-window attention starts at position 0, got {pos0}"
                )));
            }
            &mut local
        }
    };
    if cache.k.is_empty() {
        cache.k = vec![Vec::new(); num_kv_heads];
        let quantized = cx.precision == crate::Precision::Int8;
        cache.vt = vec![GrowingRows::new(hd, quantized); num_kv_heads];
        if cx.precision.is_int8() {
            let empty = Quantized::empty(hd)
                .map_err(|e| crate::gemm::gemm_err(&|| format!("keys of layer {layer}"), e))?;
            if cx.precision.two_planes() {
                cache.kq2 = vec![empty.clone(); num_kv_heads];
            }
            cache.kq = vec![empty; num_kv_heads];
        }
    }
    let mut new_k = Vec::with_capacity(t * hd);
    for g in 0..num_kv_heads {
        new_k.clear();
        split(q_cols, g, 0..t, &mut new_k);
        if cx.precision.is_int8() {
            let what = || format!("keys of layer {layer} kv head {g}");
            let planes = (&mut cache.kq[g], cache.kq2.get_mut(g));
            quantize_keys(cx.precision, &new_k, t, hd, planes, &what)?;
        }
        if !cx.precision.is_int8() {
            cache.k[g].extend_from_slice(&new_k);
        }
        new_k.clear();
        split(q_cols + kv_cols, g, 0..t, &mut new_k);
        cache.vt[g].push_columns(&new_k, t).map_err(|e| {
            crate::gemm::gemm_err(&|| format!("values of layer {layer} kv head {g}"), e)
        })?;
    }
    cache.len += t;
    let nk = cache.len;
    let cache = &*cache;
    let scale = score_scale(hd);
    let group = num_heads / num_kv_heads;
    // A query at qpos sees the keys kpos ≤ qpos with kpos + W > qpos: one run of its row. The
    // scores of one group for the `c` query rows from position `q0`, `nv` keys wide, head after
    // head: rows from `r0`, SOFTMAX_ROWS at a time.
    let mask_softmax = |q0: usize, c: usize, nv: usize| {
        move |r0: usize, rows: &mut [f32]| {
            for (i, chunk) in rows.chunks_mut(SOFTMAX_ROWS * nv).enumerate() {
                let mut runs: [std::ops::Range<usize>; SOFTMAX_ROWS] = Default::default();
                let count = chunk.len() / nv;
                for (j, (run, row)) in runs.iter_mut().zip(chunk.chunks_exact_mut(nv)).enumerate() {
                    let qpos = q0 + (r0 + i * SOFTMAX_ROWS + j) % c;
                    let lo = window.map_or(0, |w| (qpos + 1).saturating_sub(w));
                    *run = lo..(qpos + 1).min(nv);
                    for s in row.get_mut(run.clone()).unwrap_or_default() {
                        *s *= scale;
                    }
                }
                softmax_visible_rows(chunk, nv, &runs[..count]);
            }
        }
    };
    // The kv-head groups whose products go to the backend together (one round trip per kind of
    // product on a device): all of them while their scores stay small, else one at a time. Where
    // the backend gains from products issued side by side (the CPU), every group's runs are units
    // shared out over the GEMM's threads instead, each run's products on its thread alone: a run's
    // products are small (192 rows × 64 keys at the first run of SmolLM2's), and shared out one by
    // one over the pool they left a worker waiting a third of attention's time.
    let concurrent = cx.backend.concurrent() && t > 1;
    let batch = match concurrent || group * t * nk * num_kv_heads <= BATCH_SCORE_CELLS {
        true => num_kv_heads,
        false => 1,
    };
    let groups: PerKvHead<usize> = (0..num_kv_heads).collect();
    // Every cell is written below (each head's rows of each kv group).
    let mut out = daisy_gemm_int8::output_buffer(t * q_cols);
    let cells = Cells(out.as_mut_ptr());
    for gs in groups.chunks(batch) {
        let named = |gs: &[usize], kind: &'static str| {
            let (first, last) = (gs[0], gs[gs.len() - 1]);
            move || match first == last {
                true => format!("attention {kind} of layer {layer} kv head {first}"),
                false => format!("attention {kind} of layer {layer} kv heads {first}..={last}"),
            }
        };
        // V_gᵀ: one row per value channel over every key present; at int8 kept quantized by the
        // cache, otherwise made into this call's operand from its f32 rows.
        let vts: Vec<Vec<f32>> = gs
            .iter()
            .filter(|&&g| cache.vt[g].quantized().is_none())
            .map(|&g| (0..hd).flat_map(|c| cache.vt[g].row(c)).copied().collect())
            .collect();
        let kept: Option<PerKvHead<&Quantized>> =
            gs.iter().map(|&g| cache.vt[g].quantized()).collect();
        let values: PerKvHead<ActRhs<'_>> = match kept {
            Some(kept) => kept.into_iter().map(|q| ActRhs::Int8(q, None)).collect(),
            None => vts
                .iter()
                .map(|vt| act_rhs(cx, vt, hd, nk, &named(gs, "values")))
                .collect::<Result<_>>()?,
        };
        let keys: PerKvHead<ActRhs<'_>> = gs
            .iter()
            .map(|&g| match cx.precision {
                crate::Precision::Int8 | crate::Precision::Int8x2 => {
                    ActRhs::Int8(&cache.kq[g], cache.kq2.get(g))
                }
                crate::Precision::F32 => ActRhs::F32 {
                    b: &cache.k[g],
                    n: nk,
                    k: hd,
                },
            })
            .collect();
        // The query rows `r0..r1` of the call for the groups `gs[sub]`: they see the keys up to
        // position `pos0 + r1` only, so their products stop there (the cells past it are masked,
        // and their probabilities are exactly 0, which the values' product would only add).
        let run = |sub: std::ops::Range<usize>, r0: usize| -> Result<()> {
            let (gs, keys, values) = (&gs[sub.clone()], &keys[sub.clone()], &values[sub]);
            let r1 = (r0 + step).min(t);
            let (c, nv) = (r1 - r0, pos0 + r1);
            let rows = group * c;
            // A: the rows of every query head of a group, head after head; the groups one after
            // another in one buffer.
            let mut queries = Vec::with_capacity(gs.len() * rows * hd);
            for &g in gs {
                for h in g * group..(g + 1) * group {
                    split(0, h, r0..r1, &mut queries);
                }
            }
            let cut_keys = match nv < nk {
                true => cut_each(keys, (nv, hd), cut, &named(gs, "keys"))?,
                false => PerKvHead::new(),
            };
            let jobs: PerKvHead<(&[f32], usize, &ActRhs<'_>)> = queries
                .chunks_exact(rows * hd)
                .zip(if nv < nk { &cut_keys[..] } else { keys })
                .map(|(a, b)| (a, rows, b))
                .collect();
            let mut scores = act_gemm_batch(cx, &jobs, &named(gs, "scores"))?;
            drop(jobs);
            for s in &mut scores {
                for_each_rows(s, nv, mask_softmax(pos0 + r0, c, nv));
            }
            let cut_values = match nv < nk {
                true => cut_each(values, (hd, nv), cut, &named(gs, "values"))?,
                false => PerKvHead::new(),
            };
            let jobs: PerKvHead<(&[f32], usize, &ActRhs<'_>)> = scores
                .iter()
                .zip(if nv < nk { &cut_values[..] } else { values })
                .map(|(a, b)| (a.as_slice(), rows, b))
                .collect();
            let outs = act_gemm_batch(cx, &jobs, &named(gs, "values"))?;
            drop(jobs);
            for (&g, o) in gs.iter().zip(&outs) {
                for (hi, rows_of) in o.chunks_exact(c * hd).enumerate() {
                    let h = head(g, group, hi);
                    for (r, row) in (r0..r1).zip(rows_of.chunks_exact(hd)) {
                        // SAFETY: row r < t and head h < num_heads: `out`'s cells
                        // `r·q_cols + h·hd ..+ hd` lie inside it (t × q_cols), and no other run
                        // writes them (runs of other rows or other kv heads' query heads).
                        unsafe { cells.write(r * q_cols + h * hd, row) };
                    }
                }
            }
            cut_keys
                .into_iter()
                .chain(cut_values)
                .for_each(ActRhs::recycle);
            scores
                .into_iter()
                .chain(outs)
                .for_each(daisy_gemm_int8::recycle_output);
            Ok(())
        };
        if concurrent {
            // One unit per kv head and run, the largest runs (most keys) first from both ends,
            // so that the two ends meet at the smallest.
            let mut units: Vec<(usize, usize)> = (0..gs.len())
                .flat_map(|i| (0..t).step_by(step).map(move |r0| (i, r0)))
                .collect();
            units.sort_by_key(|&(i, r0)| (std::cmp::Reverse(r0), i));
            let (front, back): (Vec<_>, Vec<_>) = units
                .iter()
                .enumerate()
                .partition(|(j, _)| j.is_multiple_of(2));
            let order: Vec<(usize, usize)> = front
                .into_iter()
                .chain(back.into_iter().rev())
                .map(|(_, &u)| u)
                .collect();
            let failed: std::sync::Mutex<Option<(usize, Error)>> = std::sync::Mutex::new(None);
            daisy_gemm_int8::for_each_unit(order.len(), |u| {
                let (i, r0) = order[u];
                if let Err(e) = run(i..i + 1, r0) {
                    let mut failed = failed.lock().unwrap_or_else(|e| e.into_inner());
                    if failed.as_ref().is_none_or(|(v, _)| u < *v) {
                        *failed = Some((u, e));
                    }
                }
            });
            if let Some((_, e)) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
        } else {
            for r0 in (0..t).step_by(step) {
                run(0..gs.len(), r0)?;
            }
        }
        values.into_iter().for_each(ActRhs::recycle);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use daisy_gemm_int8::{Backend, CpuBackend, Rhs, seeded_matrix};

    use super::*;
    use crate::Precision;

    /// A cut that quantizes the kept values afresh (each row's scale over its kept part only):
    /// the mistake the causal runs must not make.
    fn requantizing_cut(
        b: &ActRhs<'_>,
        n: usize,
        k: usize,
    ) -> std::result::Result<ActRhs<'static>, GemmError> {
        let ActRhs::Int8Owned((corner, None)) = b.leading(n, k)? else {
            unreachable!("the test cuts single int8 planes")
        };
        let mut x = Vec::with_capacity(n * k);
        for (r, &s) in corner.scales().iter().enumerate() {
            x.extend(corner.row(r).iter().map(|&v| f32::from(v) * s));
        }
        Ok(ActRhs::Int8Owned((
            daisy_gemm_int8::quantize_rows(&x, n, k)?,
            None,
        )))
    }

    /// Attention of `t` rows after `before` cached ones (none: the full window), in runs of `step`.
    fn run(
        precision: Precision,
        shape: &Heads,
        (before, t): (usize, usize),
        step: usize,
        cut: Cut,
    ) -> Vec<f32> {
        let runs = (step, cut, head_of as HeadOf);
        run_on(&CpuBackend::new(), precision, shape, (before, t), runs).unwrap()
    }

    /// [`run`] on `backend`, the outputs placed by `head`.
    fn run_on(
        backend: &dyn Backend,
        precision: Precision,
        shape: &Heads,
        (before, t): (usize, usize),
        (step, cut, head): (usize, Cut, HeadOf),
    ) -> Result<Vec<f32>> {
        let cx = Ctx { precision, backend };
        let width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim;
        let qkv = seeded_matrix(7, before + t, width);
        let mut cache = LayerCache::default();
        if before > 0 {
            let first = (&qkv[..before * width], before, 0);
            attention_in_runs(
                cx,
                shape,
                first,
                Some(&mut cache),
                0,
                (before, cut, head_of),
            )?;
        }
        let rest = (&qkv[before * width..], t, before);
        let cache = (before > 0).then_some(&mut cache);
        attention_in_runs(cx, shape, rest, cache, 0, (step, cut, head))
    }

    /// Whether `a` and `b` hold the same f32 values bit for bit.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The CPU backend's products issued from one thread after another (not `concurrent`, as a
    /// device's are).
    struct OneThread(CpuBackend);

    impl Backend for OneThread {
        fn name(&self) -> String {
            "one-thread-cpu".into()
        }

        fn gemm_i32(
            &self,
            a: &Quantized,
            b: Rhs<'_>,
            out: &mut [i32],
        ) -> std::result::Result<(), GemmError> {
            self.0.gemm_i32(a, b, out)
        }
    }

    /// Runs shared out over the GEMM's threads (the CPU backend) give the bits of the same runs
    /// one after another on one thread (a backend that is not `concurrent`): full window and after
    /// a cache, grouped and plain heads, a sliding window, int8, int8x2 and f32. (Under the test
    /// harness another test may hold the pool, and a call's runs then go one by one on its own
    /// thread, through the same shared path.) Its mutation, the shared runs placing two query heads
    /// of the first kv group in each other's columns, must move outputs.
    #[test]
    fn runs_shared_out_over_threads_give_the_one_threads_bits() {
        let one_thread = OneThread(CpuBackend::new());
        let cpu = CpuBackend::new();
        for precision in [Precision::Int8, Precision::Int8x2, Precision::F32] {
            for (heads, kv, window) in [(6, 2, None), (4, 4, Some(37)), (9, 3, None)] {
                let shape = Heads {
                    num_heads: heads,
                    num_kv_heads: kv,
                    head_dim: 24,
                    window,
                };
                for (before, t) in [(0, 300), (29, 100), (0, 2)] {
                    let runs = (causal_rows(precision, t), leading as Cut, head_of as HeadOf);
                    let shared = run_on(&cpu, precision, &shape, (before, t), runs).unwrap();
                    let alone = run_on(&one_thread, precision, &shape, (before, t), runs).unwrap();
                    assert!(
                        same_bits(&shared, &alone),
                        "{} heads {heads}/{kv} window {window:?} rows {before}+{t}",
                        precision.name()
                    );
                }
            }
        }
        let shape = Heads {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 24,
            window: None,
        };
        let swapped: HeadOf = |g, group, i| match (g, i) {
            (0, 0) => 1,
            (0, 1) => 0,
            _ => g * group + i,
        };
        let int8 = |backend: &dyn Backend, head: HeadOf| {
            run_on(
                backend,
                Precision::Int8,
                &shape,
                (0, 300),
                (64, leading, head),
            )
            .unwrap()
        };
        let moved = !same_bits(&int8(&one_thread, head_of), &int8(&cpu, swapped));
        assert!(moved, "runs placed in the wrong heads went unseen");
    }

    #[test]
    fn causal_runs_give_the_whole_calls_bits() {
        let mut runs = 0;
        for precision in [Precision::Int8, Precision::Int8x2] {
            for window in [None, Some(37)] {
                for (heads, kv) in [(6, 2), (4, 4)] {
                    let shape = Heads {
                        num_heads: heads,
                        num_kv_heads: kv,
                        head_dim: 24,
                        window,
                    };
                    for (before, t) in [(0, 150), (29, 100), (5, 64), (0, 1)] {
                        let whole = run(precision, &shape, (before, t), t, leading);
                        for step in [1, 16, 33, 64] {
                            let cut = run(precision, &shape, (before, t), step, |b, n, k| {
                                b.leading(n, k)
                            });
                            let same = same_bits(&whole, &cut);
                            assert!(
                                same,
                                "{} window {window:?} heads {heads}/{kv} rows {before}+{t} in runs of {step}",
                                precision.name()
                            );
                            runs += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(runs, 2 * 2 * 2 * 4 * 4);
        // The check sees its mistake: cutting the values by quantizing their kept part afresh
        // moves outputs.
        let shape = Heads {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 24,
            window: None,
        };
        let whole = run(Precision::Int8, &shape, (0, 150), 150, |b, n, k| {
            b.leading(n, k)
        });
        let mutant = run(Precision::Int8, &shape, (0, 150), 64, requantizing_cut);
        assert!(
            !same_bits(&whole, &mutant),
            "a cut quantized afresh went unnoticed"
        );
    }
}
