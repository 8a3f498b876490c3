//! A Hugging Face `tokenizer.json` (and the chat-template part of `tokenizer_config.json`)
//! synthesized from a GGUF file's `tokenizer.ggml.*` metadata, shaped like the files upstream
//! ships so that `tokenizers.Tokenizer.from_file` loads it and builds the same pipeline.
//!
//! `tokenizer.ggml.pre` names llama.cpp's pre-tokenizer; each accepted value maps to the
//! pipeline of the upstream tokenizer.json it was converted from (llama.cpp `llama-vocab.cpp`).

use serde_json::{Value as Json, json};

use crate::Error;
use crate::gguf::{GgufFile, Value};

/// The split regex of Qwen2's `tokenizer.json`.
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp token types.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

fn strings<'a>(g: &'a GgufFile, key: &str) -> Result<Vec<&'a str>, Error> {
    let items = g
        .metadata
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| Error::Tokenizer(format!("gguf has no array `{key}`")))?;
    items
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| Error::Tokenizer(format!("`{key}` holds a non-string")))
        })
        .collect()
}

fn byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets, "use_regex": use_regex})
}

/// Build `tokenizer.json` bytes from the GGUF tokenizer metadata.
pub fn tokenizer_json(g: &GgufFile) -> Result<Vec<u8>, Error> {
    let model = g
        .metadata
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str);
    if model != Some("gpt2") {
        return Err(Error::Tokenizer(format!(
            "tokenizer.ggml.model {model:?} is not supported (expected \"gpt2\", byte-level BPE)"
        )));
    }
    let pre = g
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let (normalizer, pre_tokenizer, post_processor, decoder) = match pre {
        "smollm" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(false, true, true),
            ]}),
            byte_level(true, false, true),
            byte_level(true, true, true),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_REGEX}, "behavior": "Isolated", "invert": false},
                byte_level(false, false, false),
            ]}),
            byte_level(false, false, false),
            byte_level(false, false, false),
        ),
        "gpt-2" => (
            Json::Null,
            byte_level(false, true, true),
            byte_level(true, false, true),
            byte_level(true, true, true),
        ),
        other => {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.pre \"{other}\" is not supported (expected smollm, qwen2 or gpt-2)"
            )));
        }
    };
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.metadata.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(v) => v
            .as_array()
            .filter(|a| a.len() == tokens.len())
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| {
                Error::Tokenizer("tokenizer.ggml.token_type is not one integer per token".into())
            })?,
    };
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        if vocab.insert(token.to_string(), json!(id)).is_some() {
            return Err(Error::Tokenizer(format!(
                "token {token:?} appears twice in the vocabulary"
            )));
        }
        if kind == TOKEN_TYPE_CONTROL || kind == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": kind != TOKEN_TYPE_CONTROL,
                "special": kind == TOKEN_TYPE_CONTROL,
            }));
        }
    }
    for merge in &merges {
        let parts: Vec<&str> = merge.split(' ').collect();
        if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(Error::Tokenizer(format!(
                "merge {merge:?} is not two tokens"
            )));
        }
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    });
    Ok(serde_json::to_vec(&tokenizer).expect("json"))
}

/// `{"chat_template", "bos_token", "eos_token", …}` from the GGUF metadata, or `None` when the file
/// carries no chat template.
pub fn tokenizer_config_json(g: &GgufFile) -> Result<Option<Vec<u8>>, Error> {
    let Some(template) = g.metadata.get("tokenizer.chat_template") else {
        return Ok(None);
    };
    let template = template
        .as_str()
        .ok_or_else(|| Error::Tokenizer("tokenizer.chat_template is not a string".into()))?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let token = |key: &str| -> Json {
        g.metadata
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|id| tokens.get(id as usize))
            .map_or(Json::Null, |t| json!(t))
    };
    let add_bos = g
        .metadata
        .get("tokenizer.ggml.add_bos_token")
        .and_then(Value::as_bool);
    let config = json!({
        "chat_template": template,
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": add_bos.unwrap_or(false),
    });
    Ok(Some(serde_json::to_vec_pretty(&config).expect("json")))
}
