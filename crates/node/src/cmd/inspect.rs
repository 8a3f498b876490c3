//! `node inspect --model M [--format json] [--headers-only]`: the config, the tensor table, bytes
//! per layer and embedding tying of a checkpoint, validated without computing: config, tokenizer,
//! every tensor header and the tensor set against the config, then every weight read and checked
//! finite (skipped with `--headers-only`). Any refusal is one `error: …` line and a non-zero exit.

use anyhow::Context;
use daisy_loader::{Checkpoint, Format, HiddenAct, ModelConfig, TensorInfo};
use serde_json::{Value, json};

use super::options::FormatArgs;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`.
    #[arg(long)]
    model: String,
    #[command(flatten)]
    format: FormatArgs,
    /// Check headers, config and tokenizer only; do not read the weights to check they are finite.
    #[arg(long)]
    headers_only: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let ckpt = super::checkpoint(&args.model)?;
    if !args.headers_only {
        ckpt.check_values()
            .with_context(|| format!("checking the weights of {}", args.model))?;
    }
    let tokenizer = daisy_engine::tokenizer_of(&ckpt)?;
    let report = report(&ckpt, tokenizer.vocab_size(), !args.headers_only);
    if args.format.json() {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", text(&ckpt, &report));
    }
    Ok(())
}

fn config_json(cfg: &ModelConfig) -> Value {
    json!({
        "arch": format!("{:?}", cfg.arch).to_lowercase(),
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "qkv_bias": cfg.qkv_bias,
        "hidden_act": match cfg.hidden_act { HiddenAct::Silu => "silu", HiddenAct::GeluNew => "gelu_new" },
        "sliding_window": cfg.sliding_window,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": cfg.eos_token_ids,
    })
}

fn sum(tensors: &[&TensorInfo]) -> (u64, usize) {
    tensors
        .iter()
        .fold((0, 0), |(b, p), t| (b + t.byte_len, p + t.elements()))
}

fn report(ckpt: &Checkpoint, tokenizer_vocab: usize, values_checked: bool) -> Value {
    let cfg = ckpt.config();
    let files = ckpt.files();
    let tensors: Vec<Value> = ckpt
        .tensors()
        .map(|t| {
            json!({
                "name": t.name,
                "stored_name": t.stored_name,
                "dtype": t.gguf_type.map_or_else(|| t.dtype.to_string(), |g| g.name()),
                "shape": t.shape,
                "bytes": t.byte_len,
                "file": files[t.shard],
                "offset": t.offset,
                "layer": t.layer,
            })
        })
        .collect();
    let layers: Vec<Value> = (0..cfg.num_layers)
        .map(|i| {
            let (bytes, parameters) = sum(&ckpt.layer_tensors(i));
            json!({"layer": i, "bytes": bytes, "parameters": parameters})
        })
        .collect();
    let (non_layer_bytes, non_layer_parameters) = sum(&ckpt.non_layer_tensors());
    let all: Vec<&TensorInfo> = ckpt.tensors().collect();
    let (total_bytes, parameters) = sum(&all);
    let tying = if cfg.tie_word_embeddings {
        let embed = if cfg.model_type == "gpt2" {
            "wte.weight"
        } else {
            "model.embed_tokens.weight"
        };
        json!({"tied": true, "lm_head": embed})
    } else {
        json!({"tied": false, "lm_head": "lm_head.weight"})
    };
    json!({
        "model": ckpt.describe(),
        "format": match ckpt.format() { Format::Safetensors => "safetensors", Format::Gguf => "gguf" },
        "files": files,
        "repo_id": ckpt.repo_id(),
        "commit": ckpt.commit(),
        "fingerprint": hex::encode(ckpt.fingerprint()),
        "config": config_json(cfg),
        "embeddings": tying,
        "tokenizer_vocab_size": tokenizer_vocab,
        "tensors": tensors,
        "layers": layers,
        "non_layer_bytes": non_layer_bytes,
        "non_layer_parameters": non_layer_parameters,
        "total_bytes": total_bytes,
        "parameters": parameters,
        "values_checked": values_checked,
    })
}

fn text(ckpt: &Checkpoint, r: &Value) -> String {
    use std::fmt::Write;
    let cfg = ckpt.config();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model        {} ({})",
        r["model"].as_str().unwrap_or(""),
        r["format"].as_str().unwrap_or("")
    );
    if !ckpt.repo_id().is_empty() {
        let _ = writeln!(s, "repo         {} @ {}", ckpt.repo_id(), ckpt.commit());
    }
    let _ = writeln!(
        s,
        "fingerprint  {}",
        r["fingerprint"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        s,
        "architecture {} (model_type {})",
        r["config"]["arch"].as_str().unwrap_or(""),
        cfg.model_type
    );
    let _ = writeln!(
        s,
        "layers {}  hidden {}  heads {}  kv heads {}  head_dim {}  intermediate {}  vocab {}",
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size
    );
    let _ = writeln!(
        s,
        "max positions {}  rope theta {}  norm eps {:e}  activation {}  qkv bias {}",
        cfg.max_position_embeddings,
        cfg.rope_theta,
        cfg.norm_eps,
        r["config"]["hidden_act"].as_str().unwrap_or(""),
        if cfg.qkv_bias { "yes" } else { "no" }
    );
    let sliding: Vec<String> = cfg
        .sliding_window
        .iter()
        .enumerate()
        .filter_map(|(i, w)| w.map(|w| format!("{i}:{w}")))
        .collect();
    let _ = writeln!(
        s,
        "sliding window {}",
        if sliding.is_empty() {
            "none".to_string()
        } else {
            sliding.join(" ")
        }
    );
    let _ = writeln!(
        s,
        "embeddings   {}",
        if cfg.tie_word_embeddings {
            format!(
                "tied (lm_head is {})",
                r["embeddings"]["lm_head"].as_str().unwrap_or("")
            )
        } else {
            "untied (lm_head.weight)".to_string()
        }
    );
    let _ = writeln!(
        s,
        "bos {}  eos {:?}  tokenizer vocab {}",
        cfg.bos_token_id
            .map_or_else(|| "none".to_string(), |b| b.to_string()),
        cfg.eos_token_ids,
        r["tokenizer_vocab_size"]
    );
    let _ = writeln!(
        s,
        "\ntensors ({})",
        r["tensors"].as_array().map_or(0, Vec::len)
    );
    let width = ckpt.tensors().map(|t| t.name.len()).max().unwrap_or(4);
    for t in ckpt.tensors() {
        let dtype = t
            .gguf_type
            .map_or_else(|| t.dtype.to_string(), |g| g.name());
        let shape: Vec<String> = t.shape.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            s,
            "  {:width$}  {:5}  {:>14}  {:>11} B",
            t.name,
            dtype,
            format!("[{}]", shape.join(", ")),
            t.byte_len
        );
    }
    let _ = writeln!(s, "\nbytes per layer");
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    for l in r["layers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "  layer {:>3}  {:>12} B  {:>11} parameters",
            n(&l["layer"]),
            n(&l["bytes"]),
            n(&l["parameters"])
        );
    }
    for (label, bytes, params) in [
        ("non-layer", "non_layer_bytes", "non_layer_parameters"),
        ("total", "total_bytes", "parameters"),
    ] {
        let _ = writeln!(
            s,
            "  {label:9}  {:>12} B  {:>11} parameters",
            n(&r[bytes]),
            n(&r[params])
        );
    }
    let _ = writeln!(
        s,
        "\nvalues       {}",
        if r["values_checked"] == true {
            "every weight read and finite"
        } else {
            "not read (--headers-only)"
        }
    );
    s
}
