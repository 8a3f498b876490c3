//! The matrix products of a stage (DESIGN.md §3.6), at one of two precisions.
//!
//! `F32` is the reference: plain f32 products in one fixed order. `Int8` sends every product through
//! the verified GEMM of `daisy-gemm-int8`, with weights held quantized.

use daisy_gemm_int8::{
    Backend, PackedWeights, Quantized, Rhs, gemm, gemm_quantized, quantize_rows,
};

use crate::ops::matmul_f32;
use crate::shard::{Put, Take};
use crate::source::Embedding;
use crate::{Error, Result};

/// The precision of every matrix product of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Precision {
    /// Every GEMM through the verified INT8 unit (the product).
    #[default]
    Int8,
    /// Plain f32 products in one fixed order (the reference).
    F32,
}

impl Precision {
    /// `int8` or `f32`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "int8" => Ok(Self::Int8),
            "f32" => Ok(Self::F32),
            other => Err(Error::Invalid(format!(
                "precision `{other}`, expected int8 or f32"
            ))),
        }
    }

    /// `int8` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::F32 => "f32",
        }
    }
}

/// What every product of a forward pass runs with.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) precision: Precision,
    pub(crate) backend: &'a dyn Backend,
}

/// A weight matrix `n×k` (row = output channel) as a stage holds it: f32, or int8 with one scale per
/// output channel, quantized once at load.
pub(crate) enum Weight {
    F32(Vec<f32>),
    Int8(PackedWeights),
}

pub(crate) fn gemm_err(what: &dyn Fn() -> String, e: daisy_gemm_int8::Error) -> Error {
    Error::Gemm {
        what: what(),
        reason: e.to_string(),
    }
}

/// `y = x·Wᵀ (+ b)`.
pub(crate) struct Linear {
    weight: Weight,
    n: usize,
    k: usize,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// From an `n×k` weight in f32 (consumed) and an optional bias of `n`.
    pub(crate) fn new(
        precision: Precision,
        w: Vec<f32>,
        n: usize,
        k: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => Weight::F32(w),
            Precision::Int8 => Weight::Int8(
                PackedWeights::new(&w, n, k)
                    .map_err(|e| gemm_err(&|| format!("quantizing a {n}x{k} weight"), e))?,
            ),
        };
        Ok(Self { weight, n, k, bias })
    }

    /// A tied lm_head: the embedding table as the weight. The int8 copy is quantized a block of rows
    /// at a time (rows quantize independently, so the bits are those of quantizing the whole table),
    /// so the table is never held widened to f32 in full.
    pub(crate) fn tied(
        precision: Precision,
        embed: &Embedding,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => {
                let w = embed.to_f32();
                embed.release(0, n);
                Weight::F32(w)
            }
            Precision::Int8 => {
                const BLOCK: usize = 1024;
                let what = || format!("quantizing the tied {n}x{k} lm_head");
                let (mut q, mut scales) = (Vec::with_capacity(n * k), Vec::with_capacity(n));
                let mut rows = Vec::with_capacity(BLOCK * k);
                for r0 in (0..n).step_by(BLOCK) {
                    let r1 = (r0 + BLOCK).min(n);
                    rows.clear();
                    for r in r0..r1 {
                        embed.row_into(r, &mut rows);
                    }
                    // A mapped table's pages, once quantized, are not kept resident for it.
                    embed.release(r0, r1);
                    let block = quantize_rows(&rows, r1 - r0, k).map_err(|e| gemm_err(&what, e))?;
                    q.extend_from_slice(block.q());
                    scales.extend_from_slice(block.scales());
                }
                let all = Quantized::from_parts(n, k, q, scales).map_err(|e| gemm_err(&what, e))?;
                Weight::Int8(PackedWeights::from_quantized(&all))
            }
        };
        Ok(Self {
            weight,
            n,
            k,
            bias: None,
        })
    }

    /// The weight as held (int8 values and scales, or f32) and the bias, for a shard.
    pub(crate) fn write(&self, put: &mut Put<'_>) {
        put.u64(self.n as u64);
        put.u64(self.k as u64);
        match &self.weight {
            Weight::F32(w) => {
                put.u8(0);
                put.f32s(w);
            }
            Weight::Int8(p) => {
                put.u8(1);
                put.packed(p);
            }
        }
        match &self.bias {
            None => put.u8(0),
            Some(b) => {
                put.u8(1);
                put.f32s(b);
            }
        }
    }

    /// What [`Linear::write`] wrote, refused unless it is `n×k` at `precision`; int8 arrays are
    /// borrowed where they lie (the shard's hash vouches for their values).
    pub(crate) fn read(
        take: &mut Take<'_>,
        precision: Precision,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let bad = |why: String| Error::Invalid(format!("a shard's {n}x{k} weight: {why}"));
        let (got_n, got_k) = (take.u64()? as usize, take.u64()? as usize);
        if (got_n, got_k) != (n, k) {
            return Err(bad(format!("it is {got_n}x{got_k}")));
        }
        let weight = match (take.u8()?, precision) {
            (0, Precision::F32) => {
                let w = take.f32s()?;
                if w.len() != n * k {
                    return Err(bad(format!("{} values", w.len())));
                }
                Weight::F32(w)
            }
            (1, Precision::Int8) => Weight::Int8(take.packed(n, k)?),
            (tag, _) => {
                return Err(bad(format!(
                    "held as {}, the stage runs {}",
                    if tag == 1 { "int8" } else { "f32" },
                    precision.name()
                )));
            }
        };
        let bias = match take.u8()? {
            0 => None,
            _ => {
                let b = take.f32s()?;
                if b.len() != n {
                    return Err(bad(format!("a bias of {}", b.len())));
                }
                Some(b)
            }
        };
        Ok(Self { weight, n, k, bias })
    }

    /// Bytes held by the weight and bias.
    pub(crate) fn bytes(&self) -> usize {
        let w = match &self.weight {
            Weight::F32(w) => w.len() * 4,
            Weight::Int8(p) => p.bytes(),
        };
        w + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// `t` rows of `x` (each `k` wide) times the weight, plus the bias; `what` names the layer for errors.
    pub(crate) fn forward(
        &self,
        cx: Ctx<'_>,
        x: &[f32],
        t: usize,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<f32>> {
        let mut y = match &self.weight {
            Weight::F32(w) => matmul_f32(x, t, w, self.n, self.k),
            Weight::Int8(p) => gemm(cx.backend, x, t, p).map_err(|e| gemm_err(what, e))?,
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.n) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
        Ok(y)
    }
}

/// The B operand of an attention product (`n×k`: K rows, or Vᵀ rows), prepared once for every
/// query head that shares it.
pub(crate) enum ActRhs<'a> {
    F32 {
        b: &'a [f32],
        n: usize,
        k: usize,
    },
    /// Quantized for this call (Vᵀ), or borrowed from the key cache.
    Int8Owned(Quantized),
    Int8(&'a Quantized),
}

/// `b` (`n×k`) as the B operand at the context's precision: quantized per row for int8.
pub(crate) fn act_rhs<'a>(
    cx: Ctx<'_>,
    b: &'a [f32],
    n: usize,
    k: usize,
    what: &dyn Fn() -> String,
) -> Result<ActRhs<'a>> {
    match cx.precision {
        Precision::F32 => Ok(ActRhs::F32 { b, n, k }),
        Precision::Int8 => quantize_rows(b, n, k)
            .map(ActRhs::Int8Owned)
            .map_err(|e| gemm_err(what, e)),
    }
}

/// Quantize `t` new key rows (`k` wide) and append them to a quantized key cache.
pub(crate) fn quantize_keys(
    rows: &[f32],
    t: usize,
    k: usize,
    cache: &mut Quantized,
    what: &dyn Fn() -> String,
) -> Result<()> {
    let new = quantize_rows(rows, t, k).map_err(|e| gemm_err(what, e))?;
    cache.append(&new).map_err(|e| gemm_err(what, e))
}

/// `C = A·Bᵀ` for an activation A (`t×k`) and a prepared activation B (attention scores and
/// attention × values).
pub(crate) fn act_gemm_rhs(
    cx: Ctx<'_>,
    a: &[f32],
    t: usize,
    b: &ActRhs<'_>,
    what: &dyn Fn() -> String,
) -> Result<Vec<f32>> {
    let qb: &Quantized = match b {
        ActRhs::F32 { b, n, k } => return Ok(matmul_f32(a, t, b, *n, *k)),
        ActRhs::Int8Owned(qb) => qb,
        ActRhs::Int8(qb) => qb,
    };
    let qa = quantize_rows(a, t, qb.k()).map_err(|e| gemm_err(what, e))?;
    gemm_quantized(cx.backend, &qa, Rhs::Activation(qb)).map_err(|e| gemm_err(what, e))
}
