//! Causal self-attention as GEMMs, per head (DESIGN.md §3.6), with the optional per-stage KV cache.
//!
//! Follows `transformers`' eager attention (`LlamaAttention`, `GPT2Attention`): scores = Q·Kᵀ, scaled
//! by 1/sqrt(head_dim), masked (causal, and the sliding window: a query at q sees keys k with
//! q−W < k ≤ q), softmax in f32, times V. It differs in that both products are GEMMs over every key
//! present in the call — masked keys included, with masked probabilities exactly 0 — so that the
//! sliding window never changes which rows enter a GEMM (and so never changes an int8 scale).
//!
//! The query heads that share a kv head g run as one GEMM pair: their rows stacked into one A against
//! the same K_g (and V_gᵀ). Rows quantize independently, so each cell is the one a GEMM per head gives,
//! bit for bit; K_g and V_gᵀ are quantized once per group instead of once per head, and the K rows of
//! the cache are kept quantized (a row's scale is its own, so appending is exact). The groups' products
//! go to the backend as one batch of independent products (one round trip on a GPU) while their
//! scores are small; each product's cells are the same either way.

use daisy_gemm_int8::{GrowingRows, Quantized, for_each_rows};
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
    // Head `g`'s columns of the part that starts at column `from` of every row.
    let split = |from: usize, g: usize, out: &mut Vec<f32>| {
        for row in qkv.chunks_exact(width) {
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
        split(q_cols, g, &mut new_k);
        if cx.precision.is_int8() {
            let what = || format!("keys of layer {layer} kv head {g}");
            let planes = (&mut cache.kq[g], cache.kq2.get_mut(g));
            quantize_keys(cx.precision, &new_k, t, hd, planes, &what)?;
        }
        if !cx.precision.is_int8() {
            cache.k[g].extend_from_slice(&new_k);
        }
        new_k.clear();
        split(q_cols + kv_cols, g, &mut new_k);
        cache.vt[g].push_columns(&new_k, t).map_err(|e| {
            crate::gemm::gemm_err(&|| format!("values of layer {layer} kv head {g}"), e)
        })?;
    }
    cache.len += t;
    let nk = cache.len;
    let cache = &*cache;
    let scale = score_scale(hd);
    let group = num_heads / num_kv_heads;
    let rows = group * t;
    // A query at qpos sees the keys kpos ≤ qpos with kpos + W > qpos: one run of its row.
    // Rows from `r0` of one group's scores, SOFTMAX_ROWS at a time.
    let mask_softmax = |r0: usize, rows: &mut [f32]| {
        for (c, chunk) in rows.chunks_mut(SOFTMAX_ROWS * nk).enumerate() {
            let mut runs: [std::ops::Range<usize>; SOFTMAX_ROWS] = Default::default();
            let count = chunk.len() / nk;
            for (j, (run, row)) in runs.iter_mut().zip(chunk.chunks_exact_mut(nk)).enumerate() {
                let qpos = pos0 + (r0 + c * SOFTMAX_ROWS + j) % t;
                let lo = window.map_or(0, |w| (qpos + 1).saturating_sub(w));
                *run = lo..(qpos + 1).min(nk);
                for s in row.get_mut(run.clone()).unwrap_or_default() {
                    *s *= scale;
                }
            }
            softmax_visible_rows(chunk, nk, &runs[..count]);
        }
    };
    // The kv-head groups whose products go to the backend together (one round trip per kind of
    // product on a device): all of them while their scores stay small, else one at a time.
    let batch = match rows * nk * num_kv_heads <= BATCH_SCORE_CELLS {
        true => num_kv_heads,
        false => 1,
    };
    let groups: PerKvHead<usize> = (0..num_kv_heads).collect();
    // Every cell is written below (each head's rows of each kv group).
    let mut out = daisy_gemm_int8::output_buffer(t * q_cols);
    for gs in groups.chunks(batch) {
        let named = |kind: &'static str| {
            move || match gs {
                [g] => format!("attention {kind} of layer {layer} kv head {g}"),
                _ => format!(
                    "attention {kind} of layer {layer} kv heads {}..={}",
                    gs[0],
                    gs[gs.len() - 1]
                ),
            }
        };
        // A: the rows of every query head of a group, head after head; the groups one after
        // another in one buffer.
        let mut queries = Vec::with_capacity(gs.len() * rows * hd);
        for &g in gs {
            for h in g * group..(g + 1) * group {
                split(0, h, &mut queries);
            }
        }
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
        let jobs: PerKvHead<(&[f32], usize, &ActRhs<'_>)> = queries
            .chunks_exact(rows * hd)
            .zip(&keys)
            .map(|(a, b)| (a, rows, b))
            .collect();
        let mut scores = act_gemm_batch(cx, &jobs, &named("scores"))?;
        for s in &mut scores {
            for_each_rows(s, nk, mask_softmax);
        }
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
                .map(|vt| act_rhs(cx, vt, hd, nk, &named("values")))
                .collect::<Result<_>>()?,
        };
        let jobs: PerKvHead<(&[f32], usize, &ActRhs<'_>)> = scores
            .iter()
            .zip(&values)
            .map(|(a, b)| (a.as_slice(), rows, b))
            .collect();
        let outs = act_gemm_batch(cx, &jobs, &named("values"))?;
        for (&g, o) in gs.iter().zip(&outs) {
            for (hi, head) in o.chunks_exact(t * hd).enumerate() {
                let h = g * group + hi;
                for (r, row) in head.chunks_exact(hd).enumerate() {
                    out[r * q_cols + h * hd..r * q_cols + (h + 1) * hd].copy_from_slice(row);
                }
            }
        }
        drop(jobs);
        scores
            .into_iter()
            .chain(outs)
            .for_each(daisy_gemm_int8::recycle_output);
    }
    Ok(out)
}
