//! The model figures of `cargo xtask bench`: SmolLM2-135M-Instruct through the released `node`
//! binary, int8, one stage — prefill tok/s at 64 and 512 prompt tokens (full window), decode tok/s on
//! the cached path, and peak RSS ÷ parameters of the whole model in one process.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::Figure;

pub(crate) const MODEL: &str = "target/fixtures/SmolLM2-135M-Instruct";
pub(crate) const TEXT: &str = "fixtures/text/essay.txt";

/// `node` from the release profile (built here).
/// `node run` on SmolLM2 in int8 with `new_tokens` generated (end-of-sequence ignored) on `path`.
pub(crate) fn run_int8(
    root: &Path,
    prompt: &str,
    new_tokens: usize,
    path: &str,
) -> anyhow::Result<Value> {
    let n = new_tokens.to_string();
    node(
        root,
        &[
            "run",
            "--model",
            MODEL,
            "--prompt",
            prompt,
            "--max-new-tokens",
            &n,
            "--ignore-eos",
            "--path",
            path,
            "--precision",
            "int8",
            "--format",
            "json",
        ],
    )
}

pub(crate) fn node(root: &Path, args: &[&str]) -> anyhow::Result<Value> {
    let node = crate::target_dir()?.join("release/node");
    let out = Command::new(&node)
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("could not start {}", node.display()))?;
    if !out.status.success() {
        bail!(
            "node {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().context("node printed nothing")?;
    serde_json::from_str(line).context("node's last line is not JSON")
}

/// The longest prefix of the essay (cut at a char boundary) that encodes to at most `n` tokens.
pub(crate) fn prompt_of(root: &Path, text: &str, n: usize) -> anyhow::Result<String> {
    let count = |s: &str| -> anyhow::Result<usize> {
        let j = node(
            root,
            &[
                "tokenize", "--model", MODEL, "--text", s, "--format", "json",
            ],
        )?;
        Ok(j["ids"].as_array().context("tokenize ids")?.len())
    };
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let (mut lo, mut hi) = (1usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let end = chars.get(mid).map_or(text.len(), |c| c.0);
        if count(&text[..end])? <= n {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    let end = chars.get(lo).map_or(text.len(), |c| c.0);
    Ok(text[..end].to_string())
}

pub(crate) fn timing(j: &Value, key: &str) -> anyhow::Result<f64> {
    j["timings"][key]
        .as_f64()
        .with_context(|| format!("timings.{key} missing"))
}

/// The fixtures, and `node` in release.
pub(crate) fn build_release() -> anyhow::Result<()> {
    let root = crate::root();
    if !root.join(MODEL).join("model.safetensors").is_file() {
        crate::fixtures::run(&[])?;
    }
    eprintln!("$ cargo build --release --package node");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--package", "node"])
        .current_dir(&root)
        .stdout(std::io::stderr())
        .status()
        .context("could not start cargo build")?;
    if !status.success() {
        bail!("building node in release failed with {status}");
    }
    Ok(())
}

pub(crate) fn figures() -> anyhow::Result<Vec<Figure>> {
    let root = crate::root();
    build_release()?;
    let text =
        std::fs::read_to_string(root.join(TEXT)).with_context(|| format!("reading {TEXT}"))?;
    let mut figures = Vec::new();
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: name.to_string(),
        value,
        unit: unit.to_string(),
    };
    for n in [64usize, 512] {
        let prompt = prompt_of(&root, &text, n)?;
        let mut best = 0f64;
        let mut tokens = 0;
        for _ in 0..3 {
            let j = run_int8(&root, &prompt, 1, "full-window")?;
            tokens = j["prompt_ids"].as_array().map_or(0, Vec::len);
            best = best.max(tokens as f64 / timing(&j, "prefill_s")?);
        }
        eprintln!("prefill: {tokens} prompt tokens");
        figures.push(fig(
            &format!("model/smollm2-135m/int8/prefill_{n}"),
            best,
            "tok/s",
        ));
    }
    let prompt = prompt_of(&root, &text, 16)?;
    let j = run_int8(&root, &prompt, 129, "cached")?;
    figures.push(fig(
        "model/smollm2-135m/int8/decode_cached_1_stage",
        timing(&j, "decode_tokens_per_s")?,
        "tok/s",
    ));
    let rss = j["peak_rss_bytes"]
        .as_f64()
        .context("peak_rss_bytes missing")?;
    let params = j["params"].as_f64().context("params missing")?;
    figures.push(fig("model/smollm2-135m/int8/peak_rss", rss / 1e6, "MB"));
    figures.push(fig(
        "model/smollm2-135m/int8/peak_rss_per_param",
        rss / params,
        "bytes/param",
    ));
    figures.push(fig("model/smollm2-135m/params", params / 1e6, "M"));
    Ok(figures)
}
