//! The tokenizer synthesized from `tokenizer.ggml.*` against the `tokenizer.json` files that
//! `transformers`/`tokenizers` wrote for the tiny models: the same vocabulary, merges and special
//! tokens, and for each `tokenizer.ggml.pre` the pipeline upstream uses (`qwen2` as the Qwen2
//! tokenizer, `gpt-2` as GPT-2's, `smollm` as the Digits + ByteLevel sequence).

use daisy_loader::MemSource;
use daisy_loader::gguf::{read_gguf, tokenizer_json};
use serde_json::Value;

use crate::root;

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn kv_string(out: &mut Vec<u8>, key: &str, value: &str) {
    string(out, key);
    out.extend(8u32.to_le_bytes());
    string(out, value);
}

fn kv_strings(out: &mut Vec<u8>, key: &str, values: &[String]) {
    string(out, key);
    out.extend(9u32.to_le_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend((values.len() as u64).to_le_bytes());
    for v in values {
        string(out, v);
    }
}

fn kv_i32s(out: &mut Vec<u8>, key: &str, values: &[i32]) {
    string(out, key);
    out.extend(9u32.to_le_bytes());
    out.extend(5u32.to_le_bytes());
    out.extend((values.len() as u64).to_le_bytes());
    for v in values {
        out.extend(v.to_le_bytes());
    }
}

fn tiny_tokenizer(model: &str) -> Value {
    let path = root()
        .join("fixtures/tiny")
        .join(model)
        .join("tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn merges_as_strings(json: &Value) -> Vec<String> {
    json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
            other => panic!("merge {other}"),
        })
        .collect()
}

/// A metadata-only GGUF carrying `tokenizer`'s vocabulary with `tokenizer.ggml.pre = pre`, and
/// the tokenizer.json synthesized from it.
fn synthesize(tokenizer: &Value, pre: &str) -> Result<Value, daisy_loader::Error> {
    let vocab = tokenizer["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for added in tokenizer["added_tokens"].as_array().unwrap() {
        if added["special"] == true {
            types[added["id"].as_u64().unwrap() as usize] = 3;
        }
    }
    let mut kvs = Vec::new();
    kv_string(&mut kvs, "tokenizer.ggml.model", "gpt2");
    kv_string(&mut kvs, "tokenizer.ggml.pre", pre);
    kv_strings(&mut kvs, "tokenizer.ggml.tokens", &tokens);
    kv_strings(
        &mut kvs,
        "tokenizer.ggml.merges",
        &merges_as_strings(tokenizer),
    );
    kv_i32s(&mut kvs, "tokenizer.ggml.token_type", &types);
    let mut file = b"GGUF".to_vec();
    file.extend(3u32.to_le_bytes());
    file.extend(0u64.to_le_bytes());
    file.extend(5u64.to_le_bytes());
    file.extend(kvs);
    let gguf = read_gguf(&MemSource::new("tokenizer.gguf", file)).unwrap();
    let bytes = tokenizer_json(&gguf)?;
    Ok(serde_json::from_slice(&bytes).unwrap())
}

fn specials(json: &Value) -> Vec<(u64, String)> {
    json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["special"] == true)
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn qwen2_and_gpt2_pipelines_match_the_files_upstream_writes() {
    for (model, pre) in [("qwen2", "qwen2"), ("gpt2", "gpt-2")] {
        let upstream = tiny_tokenizer(model);
        let ours = synthesize(&upstream, pre).unwrap();
        assert_eq!(ours["normalizer"], upstream["normalizer"], "{model}");
        assert_eq!(ours["pre_tokenizer"], upstream["pre_tokenizer"], "{model}");
        assert_eq!(
            ours["model"]["vocab"], upstream["model"]["vocab"],
            "{model}"
        );
        assert_eq!(
            merges_as_strings(&ours),
            merges_as_strings(&upstream),
            "{model}"
        );
        assert_eq!(specials(&ours), specials(&upstream), "{model}");
        assert_eq!(ours["decoder"]["type"], "ByteLevel");
    }
}

#[test]
fn smollm_is_digits_then_byte_level_and_unknown_pre_is_refused() {
    // The tiny mistral tokenizer was built with the same Digits + ByteLevel sequence.
    let upstream = tiny_tokenizer("mistral");
    let ours = synthesize(&upstream, "smollm").unwrap();
    assert_eq!(ours["pre_tokenizer"], upstream["pre_tokenizer"]);
    assert_eq!(ours["normalizer"], Value::Null);
    // The pipelines differ from one another: a wrong mapping would be seen.
    let qwen = synthesize(&upstream, "qwen2").unwrap();
    assert_ne!(qwen["pre_tokenizer"], upstream["pre_tokenizer"]);
    let err = synthesize(&upstream, "llama-bpe").unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.pre \"llama-bpe\" is not supported"),
        "{err}"
    );
}
