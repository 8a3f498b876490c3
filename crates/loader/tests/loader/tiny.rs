//! The tiny random models written by `transformers` (fixtures/tiny): every one opens, its tensor
//! set matches the parameter count `transformers` reported, and its config resolves as the file says.

use daisy_loader::{Arch, Checkpoint, DType};
use serde_json::Value;

use crate::root;

fn manifest() -> Value {
    let text = std::fs::read_to_string(root().join("fixtures/tiny/MANIFEST.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn open(name: &str) -> Checkpoint {
    let path = root().join("fixtures/tiny").join(name);
    Checkpoint::open(&path.to_string_lossy()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn parameter_counts_and_dtypes_match_the_manifest() {
    let manifest = manifest();
    for (name, entry) in manifest["models"].as_object().unwrap() {
        let ckpt = open(name);
        let params: usize = ckpt.tensors().map(|t| t.elements()).sum();
        assert_eq!(
            params as u64,
            entry["parameters"].as_u64().unwrap(),
            "{name}"
        );
        let dtype = match entry["dtype"].as_str().unwrap() {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "bfloat16" => DType::BF16,
            other => panic!("{name}: dtype {other}"),
        };
        assert!(ckpt.tensors().all(|t| t.dtype == dtype), "{name}");
        let shards: Vec<&str> = entry["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(ckpt.files(), shards, "{name}");
        assert_eq!(
            ckpt.config().vocab_size as u64,
            entry["vocab_size"].as_u64().unwrap()
        );
        ckpt.check_values().unwrap();
    }
}

#[test]
fn configs_resolve_as_written() {
    let qwen = open("qwen2");
    let cfg = qwen.config();
    assert!(cfg.qkv_bias);
    assert_eq!(cfg.rope_theta, 1_000_000.0);
    assert_eq!(cfg.sliding_window, vec![None, None, Some(5), Some(5)]);
    assert!(
        qwen.tensor("model.layers.0.self_attn.q_proj.bias")
            .is_some()
    );

    let mistral = open("mistral");
    assert_eq!(mistral.config().sliding_window, vec![Some(6); 3]);
    assert_eq!(mistral.config().head_dim, 16);
    assert!(!mistral.config().tie_word_embeddings);
    assert!(mistral.tensor("lm_head.weight").is_some());

    let llama = open("llama");
    assert_eq!(llama.config().rope_theta, 500_000.0);
    assert_eq!(llama.config().sliding_window, vec![None; 3]);
    assert_eq!(llama.config().eos_token_ids, vec![4]);
    assert_eq!(llama.layer_tensors(2).len(), 9);
    assert_eq!(llama.non_layer_tensors().len(), 3);

    let gpt2 = open("gpt2");
    let cfg = gpt2.config();
    assert_eq!(cfg.arch, Arch::Gpt2);
    assert_eq!(cfg.intermediate_size, 4 * 64);
    // Conv1D weights stay [in, out].
    assert_eq!(
        gpt2.tensor("h.0.attn.c_attn.weight").unwrap().shape,
        vec![64, 192]
    );
    assert_eq!(
        gpt2.tensor("h.0.mlp.c_proj.weight").unwrap().shape,
        vec![256, 64]
    );
    assert!(gpt2.tensor("wpe.weight").is_some());
}

/// Rewrite the qwen2 config and open it with the same weights.
fn qwen_with(
    edit: impl Fn(&mut serde_json::Map<String, Value>),
) -> Result<Checkpoint, daisy_loader::Error> {
    let tmp = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/tiny/qwen2");
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let mut cfg: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(
        tmp.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    Checkpoint::open(&tmp.path().to_string_lossy())
}

#[test]
fn layer_types_decide_the_sliding_window_when_present() {
    // Without layer_types: use_sliding_window and max_window_layers (2) decide.
    let c = qwen_with(|c| {
        c.remove("layer_types");
    })
    .unwrap();
    assert_eq!(
        c.config().sliding_window,
        vec![None, None, Some(5), Some(5)]
    );
    let c = qwen_with(|c| {
        c.remove("layer_types");
        c.insert("max_window_layers".into(), 3.into());
    })
    .unwrap();
    assert_eq!(c.config().sliding_window, vec![None, None, None, Some(5)]);
    let c = qwen_with(|c| {
        c.remove("layer_types");
        c.insert("use_sliding_window".into(), false.into());
    })
    .unwrap();
    assert_eq!(c.config().sliding_window, vec![None; 4]);
    // With layer_types, they decide even against max_window_layers.
    let c = qwen_with(|c| {
        c.insert("max_window_layers".into(), 0.into());
        c.insert(
            "layer_types".into(),
            serde_json::json!([
                "sliding_attention",
                "full_attention",
                "full_attention",
                "sliding_attention"
            ]),
        );
    })
    .unwrap();
    assert_eq!(
        c.config().sliding_window,
        vec![Some(5), None, None, Some(5)]
    );
    // Qwen2 drops the window unless use_sliding_window, whatever layer_types says (as transformers).
    let c = qwen_with(|c| {
        c.insert("use_sliding_window".into(), false.into());
    })
    .unwrap();
    assert_eq!(c.config().sliding_window, vec![None; 4]);
    // Top-level rope_theta is the older spelling of rope_parameters.rope_theta.
    let c = qwen_with(|c| {
        c.remove("rope_parameters");
        c.insert("rope_theta".into(), 12345.0.into());
    })
    .unwrap();
    assert_eq!(c.config().rope_theta, 12345.0);
    let err = qwen_with(|c| {
        c.insert("layer_types".into(), serde_json::json!(["full_attention"]));
    })
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .contains("`layer_types` has 1 entries for 4 layers"),
        "{err}"
    );
}
