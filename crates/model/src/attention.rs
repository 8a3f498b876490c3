//! Causal self-attention as GEMMs, per head (DESIGN.md §3.6), with the optional per-stage KV cache.
//!
//! Follows `transformers`' eager attention (`LlamaAttention`, `GPT2Attention`): scores = Q·Kᵀ, scaled
//! by 1/sqrt(head_dim), masked (causal, and the sliding window: a query at q sees keys k with
//! q−W < k ≤ q), softmax in f32, times V. It differs in that both products are GEMMs over every key
//! present in the call — masked keys included, with masked probabilities exactly 0 — so that the
//! sliding window never changes which rows enter a GEMM (and so never changes an int8 scale).

use rayon::prelude::*;

use crate::gemm::{Ctx, act_gemm};
use crate::ops::softmax;
use crate::{Error, Result};

/// The keys and values one layer has seen, after RoPE, one buffer per kv head (`len × head_dim`).
#[derive(Clone, Debug, Default)]
pub(crate) struct LayerCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

/// The shape of one attention call.
pub(crate) struct Heads {
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) window: Option<usize>,
}

/// Attention of `t` query rows at positions `pos0..pos0+t`.
///
/// `q` is `t × num_heads·head_dim`, `k` and `v` are `t × num_kv_heads·head_dim`. Without a cache the
/// call sees exactly these keys and `pos0` must be 0; with one, the new keys are appended and the call
/// sees every cached key plus these. Returns `t × num_heads·head_dim`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    cx: Ctx<'_>,
    shape: &Heads,
    q: &[f32],
    k: &[f32],
    v: &[f32],
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
    let split = |src: &[f32], g: usize, out: &mut Vec<f32>| {
        for row in src.chunks_exact(kv_cols) {
            out.extend_from_slice(&row[g * hd..(g + 1) * hd]);
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
        cache.v = vec![Vec::new(); num_kv_heads];
    }
    for g in 0..num_kv_heads {
        split(k, g, &mut cache.k[g]);
        split(v, g, &mut cache.v[g]);
    }
    cache.len += t;
    let nk = cache.len;
    let cache = &*cache;
    // `transformers` scales by the f32 rounding of head_dim^-0.5 computed in f64.
    let scale = libm::pow(hd as f64, -0.5) as f32;
    let group = num_heads / num_kv_heads;
    // V_gᵀ: one row per value channel over every key present.
    let vt: Vec<Vec<f32>> = (0..num_kv_heads)
        .map(|g| {
            let mut out = vec![0f32; hd * nk];
            for (j, row) in cache.v[g].chunks_exact(hd).enumerate() {
                for (c, x) in row.iter().enumerate() {
                    out[c * nk + j] = *x;
                }
            }
            out
        })
        .collect();
    let heads: Vec<Result<Vec<f32>>> = (0..num_heads)
        .into_par_iter()
        .map(|h| {
            let g = h / group;
            let mut qh = Vec::with_capacity(t * hd);
            for row in q.chunks_exact(q_cols) {
                qh.extend_from_slice(&row[h * hd..(h + 1) * hd]);
            }
            let what = || format!("attention scores of layer {layer} head {h}");
            let mut scores = act_gemm(cx, &qh, t, &cache.k[g], nk, hd, &what)?;
            for (r, row) in scores.chunks_exact_mut(nk).enumerate() {
                let qpos = pos0 + r;
                for (kpos, s) in row.iter_mut().enumerate() {
                    let visible = kpos <= qpos && window.is_none_or(|w| kpos + w > qpos);
                    *s = if visible {
                        *s * scale
                    } else {
                        f32::NEG_INFINITY
                    };
                }
                softmax(row);
            }
            let what = || format!("attention values of layer {layer} head {h}");
            act_gemm(cx, &scores, t, &vt[g], hd, nk, &what)
        })
        .collect();
    let mut out = vec![0f32; t * q_cols];
    for (h, head) in heads.into_iter().enumerate() {
        let head = head?;
        for (r, row) in head.chunks_exact(hd).enumerate() {
            out[r * q_cols + h * hd..r * q_cols + (h + 1) * hd].copy_from_slice(row);
        }
    }
    Ok(out)
}
