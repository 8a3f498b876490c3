//! The matrix products of a stage (DESIGN.md §3.6), at one of two precisions.
//!
//! `F32` is the reference: plain f32 products in one fixed order. `Int8` sends every product through
//! the verified GEMM of `daisy-gemm-int8`, with weights held quantized.

use crate::ops::matmul_f32;
use crate::{Error, Result};

/// The precision of every matrix product of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// A weight matrix `n×k` (row = output channel) as a stage holds it.
pub(crate) enum Weight {
    F32(Vec<f32>),
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
            Precision::F32 | Precision::Int8 => Weight::F32(w),
        };
        Ok(Self { weight, n, k, bias })
    }

    /// Bytes held by the weight and bias.
    pub(crate) fn bytes(&self) -> usize {
        let w = match &self.weight {
            Weight::F32(w) => w.len() * 4,
        };
        w + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// `t` rows of `x` (each `k` wide) times the weight, plus the bias; `what` names the layer for errors.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        t: usize,
        _what: &dyn Fn() -> String,
    ) -> Result<Vec<f32>> {
        let mut y = match &self.weight {
            Weight::F32(w) => matmul_f32(x, t, w, self.n, self.k),
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

/// `C = A·Bᵀ` for two activation operands (attention scores and attention × values).
pub(crate) fn act_gemm(
    precision: Precision,
    a: &[f32],
    t: usize,
    b: &[f32],
    n: usize,
    k: usize,
    _what: &dyn Fn() -> String,
) -> Result<Vec<f32>> {
    match precision {
        Precision::F32 | Precision::Int8 => Ok(matmul_f32(a, t, b, n, k)),
    }
}
