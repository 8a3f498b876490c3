//! Stages read straight from a `daisy_loader::Checkpoint`: its config resolved into [`Config`], its
//! tensors served through [`Source`].

use daisy_loader::{Arch, Checkpoint, DType, ModelConfig};

use crate::config::{Activation, Config, Family};
use crate::source::{RawDType, RawTensor, Source};
use crate::{Error, Result};

impl Config {
    /// The model crate's view of a loader config.
    pub fn from_loader(c: &ModelConfig) -> Result<Self> {
        let cfg = Config {
            family: match c.arch {
                Arch::Llama => Family::Llama,
                Arch::Gpt2 => Family::Gpt2,
            },
            hidden_size: c.hidden_size,
            num_layers: c.num_layers,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            intermediate_size: c.intermediate_size,
            vocab_size: c.vocab_size,
            max_position_embeddings: c.max_position_embeddings,
            rope_theta: c.rope_theta,
            norm_eps: c.norm_eps,
            tie_word_embeddings: c.tie_word_embeddings,
            qkv_bias: c.qkv_bias,
            activation: match c.hidden_act {
                daisy_loader::Activation::Silu => Activation::Silu,
                daisy_loader::Activation::GeluNew => Activation::GeluNew,
            },
            sliding_window: c.sliding_window.clone(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

fn shape(ck: &Checkpoint, name: &str) -> Result<Vec<usize>> {
    ck.tensor(name)
        .map(|t| t.shape.clone())
        .ok_or_else(|| Error::Loader(daisy_loader::Error::NoSuchTensor(name.to_string())))
}

impl Source for Checkpoint {
    fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let shape = shape(self, name)?;
        Ok((shape, Checkpoint::read_f32(self, name)?))
    }

    fn read_raw(&self, name: &str) -> Result<Option<RawTensor>> {
        let shape = shape(self, name)?;
        let (dtype, bytes) = Checkpoint::read_raw(self, name)?;
        let dtype = match dtype {
            DType::F32 => RawDType::F32,
            DType::F16 => RawDType::F16,
            DType::BF16 => RawDType::BF16,
        };
        // Non-finite embedding rows are refused on lookup (the embedding's output is checked).
        Ok(Some((shape, dtype, bytes)))
    }

    fn has(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }

    fn fingerprint(&self) -> [u8; 32] {
        Checkpoint::fingerprint(self)
    }
}
