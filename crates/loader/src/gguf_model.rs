//! A GGUF file as a model: the [`ModelConfig`] from `{arch}.*` metadata and the mapping of
//! llama.cpp tensor names (`token_embd`, `blk.{i}.attn_q`, …) to the Hugging Face Llama names.

use crate::gguf::{GgufFile, Value};
use crate::{Arch, Error, HiddenAct, ModelConfig};

/// Read the config from GGUF metadata. Architectures `llama` and `qwen2` are accepted.
pub(crate) fn config_from_gguf(file: &str, g: &GgufFile) -> Result<ModelConfig, Error> {
    let err = |problem: String| Error::Config {
        file: file.into(),
        problem,
    };
    let arch = g
        .metadata
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| err("missing string `general.architecture`".into()))?
        .to_string();
    if arch != "llama" && arch != "qwen2" {
        return Err(Error::UnsupportedModelType(arch));
    }
    let get = |key: &str| g.metadata.get(&format!("{arch}.{key}"));
    let need = |key: &str| -> Result<usize, Error> {
        get(key)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| err(format!("missing integer `{arch}.{key}`")))
    };
    if let Some(kind) = get("rope.scaling.type")
        && kind.as_str() != Some("none")
    {
        return Err(Error::UnsupportedRopeScaling(format!(
            "`{arch}.rope.scaling.type` {kind:?}"
        )));
    }
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv = match get("attention.head_count_kv") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| err(format!("`{arch}.attention.head_count_kv` is {v:?}")))?
            as usize,
        None => heads,
    };
    let head_dim = match get("attention.key_length").and_then(Value::as_u64) {
        Some(d) => d as usize,
        None if heads > 0 && hidden % heads == 0 => hidden / heads,
        None => {
            return Err(err(format!(
                "embedding_length {hidden} not divisible by {heads} heads"
            )));
        }
    };
    if let Some(rot) = get("rope.dimension_count").and_then(Value::as_u64)
        && rot as usize != head_dim
    {
        return Err(err(format!(
            "partial rotary embedding ({rot} of {head_dim} dimensions) is not supported"
        )));
    }
    let tokens = g
        .metadata
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[_]>::len);
    let vocab = match get("vocab_size").and_then(Value::as_u64) {
        Some(v) => v as usize,
        None => tokens.ok_or_else(|| err("no vocab size and no tokenizer.ggml.tokens".into()))?,
    };
    let layers = need("block_count")?;
    let has = |name: &str| g.tensors.iter().any(|t| t.name == name);
    let token_id = |key: &str| {
        g.metadata
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let config = ModelConfig {
        arch: Arch::Llama,
        model_type: arch.clone(),
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim,
        intermediate_size: need("feed_forward_length")?,
        vocab_size: vocab,
        max_position_embeddings: need("context_length")?,
        rope_theta: get("rope.freq_base")
            .and_then(Value::as_f32)
            .unwrap_or(10_000.0),
        norm_eps: get("attention.layer_norm_rms_epsilon")
            .and_then(Value::as_f32)
            .ok_or_else(|| {
                err(format!(
                    "missing float `{arch}.attention.layer_norm_rms_epsilon`"
                ))
            })?,
        tie_word_embeddings: !has("output.weight"),
        qkv_bias: has("blk.0.attn_q.bias"),
        hidden_act: HiddenAct::Silu,
        sliding_window: vec![None; layers],
        bos_token_id: token_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids: token_id("tokenizer.ggml.eos_token_id")
            .into_iter()
            .collect(),
    };
    config.validate(file)?;
    Ok(config)
}

/// The Hugging Face name of a llama.cpp tensor name, or `None` when it is not one we know.
pub(crate) fn canonical_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}
