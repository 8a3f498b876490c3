//! The tensor set a configuration requires: canonical names and shapes, and how names found in a
//! checkpoint map onto them.
//!
//! Llama-family names are exactly Hugging Face's (`model.layers.{i}.self_attn.q_proj.weight`).
//! GPT-2 names drop the `transformer.` prefix (`h.{i}.attn.c_attn.weight`); its Conv1D weights
//! stay `[in, out]` as stored.

use crate::{Arch, ModelConfig};

/// Every tensor `cfg` requires, with its shape, in a fixed order: non-layer tensors first, then
/// each layer's.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = Vec::new();
    match cfg.arch {
        Arch::Llama => {
            out.push(("model.embed_tokens.weight".to_string(), vec![v, h]));
            out.push(("model.norm.weight".to_string(), vec![h]));
        }
        Arch::Gpt2 => {
            out.push(("wte.weight".to_string(), vec![v, h]));
            out.push((
                "wpe.weight".to_string(),
                vec![cfg.max_position_embeddings, h],
            ));
            out.push(("ln_f.weight".to_string(), vec![h]));
            out.push(("ln_f.bias".to_string(), vec![h]));
        }
    }
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    for layer in 0..cfg.num_layers {
        out.extend(layer_tensors(cfg, layer));
    }
    out
}

/// The tensors of decoder layer `i`, with shapes.
pub fn layer_tensors(cfg: &ModelConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let q = cfg.num_heads * cfg.head_dim;
    let kv = cfg.num_kv_heads * cfg.head_dim;
    let ff = cfg.intermediate_size;
    let t = |suffix: &str, shape: Vec<usize>| (format!("{}{suffix}", layer_prefix(cfg, i)), shape);
    match cfg.arch {
        Arch::Llama => {
            let mut v = vec![
                t("input_layernorm.weight", vec![h]),
                t("self_attn.q_proj.weight", vec![q, h]),
                t("self_attn.k_proj.weight", vec![kv, h]),
                t("self_attn.v_proj.weight", vec![kv, h]),
            ];
            if cfg.qkv_bias {
                v.push(t("self_attn.q_proj.bias", vec![q]));
                v.push(t("self_attn.k_proj.bias", vec![kv]));
                v.push(t("self_attn.v_proj.bias", vec![kv]));
            }
            v.extend([
                t("self_attn.o_proj.weight", vec![h, q]),
                t("post_attention_layernorm.weight", vec![h]),
                t("mlp.gate_proj.weight", vec![ff, h]),
                t("mlp.up_proj.weight", vec![ff, h]),
                t("mlp.down_proj.weight", vec![h, ff]),
            ]);
            v
        }
        Arch::Gpt2 => vec![
            t("ln_1.weight", vec![h]),
            t("ln_1.bias", vec![h]),
            t("attn.c_attn.weight", vec![h, 3 * h]),
            t("attn.c_attn.bias", vec![3 * h]),
            t("attn.c_proj.weight", vec![h, h]),
            t("attn.c_proj.bias", vec![h]),
            t("ln_2.weight", vec![h]),
            t("ln_2.bias", vec![h]),
            t("mlp.c_fc.weight", vec![h, ff]),
            t("mlp.c_fc.bias", vec![ff]),
            t("mlp.c_proj.weight", vec![ff, h]),
            t("mlp.c_proj.bias", vec![h]),
        ],
    }
}

/// The name prefix of layer `i`'s tensors (`model.layers.{i}.` or `h.{i}.`).
pub fn layer_prefix(cfg: &ModelConfig, i: usize) -> String {
    match cfg.arch {
        Arch::Llama => format!("model.layers.{i}."),
        Arch::Gpt2 => format!("h.{i}."),
    }
}

/// What to do with a name found in a safetensors checkpoint.
pub(crate) enum Found {
    /// A tensor under this canonical name.
    Tensor(String),
    /// A known buffer or duplicate that carries no weights we use.
    Ignore,
}

/// Map a stored safetensors name to its canonical name.
pub(crate) fn canonical_name(cfg: &ModelConfig, stored: &str) -> Found {
    match cfg.arch {
        Arch::Llama => {
            if stored.ends_with(".rotary_emb.inv_freq") {
                return Found::Ignore;
            }
            if cfg.tie_word_embeddings && stored == "lm_head.weight" {
                return Found::Ignore;
            }
            Found::Tensor(stored.to_string())
        }
        Arch::Gpt2 => {
            let name = stored.strip_prefix("transformer.").unwrap_or(stored);
            let is_buffer = name.starts_with("h.")
                && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))
                && name.split('.').count() == 4;
            if is_buffer || (cfg.tie_word_embeddings && name == "lm_head.weight") {
                return Found::Ignore;
            }
            Found::Tensor(name.to_string())
        }
    }
}
