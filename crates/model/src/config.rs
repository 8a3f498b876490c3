//! The resolved model configuration a stage is built from.

use crate::{Error, Result};

/// Which block structure the model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama, Mistral, Qwen2, SmolLM: RMSNorm, RoPE, grouped-query attention, SwiGLU.
    Llama,
    /// GPT-2: LayerNorm with bias, learned positions, fused QKV, GELU MLP.
    Gpt2,
}

/// The MLP's activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x·sigmoid(x)` (Llama's SwiGLU gate).
    Silu,
    /// GPT-2's tanh approximation.
    GeluNew,
    /// The exact erf GELU.
    Gelu,
}

impl Activation {
    /// Parse a `hidden_act` / `activation_function` name as `transformers` spells it.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "silu" | "swish" => Ok(Self::Silu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Self::GeluNew),
            "gelu" => Ok(Self::Gelu),
            other => Err(Error::Config(format!(
                "activation `{other}`, expected silu, gelu_new or gelu"
            ))),
        }
    }
}

/// A model's shape and constants, resolved from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub family: Family,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f32,
    pub norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub activation: Activation,
    /// Per layer: the sliding window `W` (a query at q sees keys k with q−W < k ≤ q), or none.
    pub sliding_window: Vec<Option<usize>>,
}

impl Config {
    /// Check the relations the forward pass relies on; every fault is reported.
    pub fn validate(&self) -> Result<()> {
        let mut faults = Vec::new();
        if self.num_layers == 0 {
            faults.push("num_layers is 0".to_string());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            faults.push(format!(
                "num_heads {} must be a positive multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            faults.push(format!(
                "head_dim {} must be positive and even",
                self.head_dim
            ));
        }
        if self.family == Family::Gpt2 && self.num_heads * self.head_dim != self.hidden_size {
            faults.push(format!(
                "GPT-2 needs num_heads·head_dim = hidden_size, got {}·{} and {}",
                self.num_heads, self.head_dim, self.hidden_size
            ));
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            faults
                .push("hidden_size, vocab_size and intermediate_size must be positive".to_string());
        }
        if self.sliding_window.len() != self.num_layers {
            faults.push(format!(
                "{} sliding-window entries for {} layers",
                self.sliding_window.len(),
                self.num_layers
            ));
        }
        if self.sliding_window.contains(&Some(0)) {
            faults.push("a sliding window of 0 tokens".to_string());
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            faults.push(format!("norm eps {}", self.norm_eps));
        }
        if self.family == Family::Llama && !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            faults.push(format!("rope_theta {}", self.rope_theta));
        }
        if faults.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(faults.join("; ")))
        }
    }

    /// Parameters of the whole model, a tied matrix counted once.
    pub fn num_params(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let kv = self.num_kv_heads * self.head_dim;
        let q = self.num_heads * self.head_dim;
        let (per_layer, extra) = match self.family {
            Family::Llama => {
                let bias = if self.qkv_bias { q + 2 * kv } else { 0 };
                (h * q + 2 * h * kv + q * h + bias + 3 * h * i + 2 * h, h)
            }
            Family::Gpt2 => (
                h * 3 * h + 3 * h + h * h + h + 2 * h * i + i + h + 4 * h,
                2 * h + self.max_position_embeddings * h,
            ),
        };
        let lm = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + lm + extra + self.num_layers * per_layer
    }
}
