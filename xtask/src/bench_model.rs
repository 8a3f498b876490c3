//! The model figures of `cargo xtask bench`: SmolLM2-135M-Instruct through the released `node`
//! binary, one stage, at each int8 precision (`int8`, the default, and `int8x2`) — prefill tok/s at
//! 64 and 512 prompt tokens (full window), decode tok/s on the cached path, peak RSS ÷ parameters of
//! the whole model in one process — and beside them the quality of each: on the essay (the golden's
//! ids), top-1 agreement with `transformers`' f32 argmax and how far the perplexity lies above
//! f32's. int8x2's speeds also appear as a fraction of int8's, so the price of its accuracy is
//! printed with it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::Figure;

pub(crate) const MODEL: &str = "target/fixtures/SmolLM2-135M-Instruct";
pub(crate) const TEXT: &str = "fixtures/text/essay.txt";

/// The golden of SmolLM2 (its essay ids and `transformers`' f32 argmax and perplexity).
const GOLDEN: &str = "fixtures/goldens/SmolLM2-135M-Instruct.json";

/// `node run` on SmolLM2 in int8 with `new_tokens` generated (end-of-sequence ignored) on `path`.
pub(crate) fn run_int8(
    root: &Path,
    prompt: &str,
    new_tokens: usize,
    path: &str,
) -> anyhow::Result<Value> {
    run_at(root, "int8", prompt, new_tokens, path)
}

/// [`run_int8`] at `precision`.
fn run_at(
    root: &Path,
    precision: &str,
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
            precision,
            "--format",
            "json",
        ],
    )
}

pub(crate) fn node(root: &Path, args: &[&str]) -> anyhow::Result<Value> {
    Ok(node_and_stderr(root, args)?.0)
}

/// [`node`], and what it printed on stderr.
pub(crate) fn node_and_stderr(root: &Path, args: &[&str]) -> anyhow::Result<(Value, String)> {
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
    let json = serde_json::from_str(line).context("node's last line is not JSON")?;
    Ok((json, String::from_utf8_lossy(&out.stderr).into_owned()))
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
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(GOLDEN)).with_context(|| format!("reading {GOLDEN}"))?,
    )
    .with_context(|| format!("parsing {GOLDEN}"))?;
    let ids_file = crate::target_dir()?.join("bench-essay-ids.json");
    std::fs::write(&ids_file, golden["text"]["ids"].to_string())
        .with_context(|| format!("writing {}", ids_file.display()))?;
    let f32_argmax = golden["text"]["f32_argmax"]
        .as_array()
        .context("the golden's text.f32_argmax")?;
    let f32_ppl = golden["text"]["f32_perplexity"]
        .as_f64()
        .context("the golden's text.f32_perplexity")?;
    let mut params = 0.0;
    let mut speeds: Vec<(String, f64)> = Vec::new();
    for precision in ["int8", "int8x2"] {
        let name = |what: &str| format!("model/smollm2-135m/{precision}/{what}");
        for n in [64usize, 512] {
            let prompt = prompt_of(&root, &text, n)?;
            let mut best = 0f64;
            let mut tokens = 0;
            for _ in 0..3 {
                let j = run_at(&root, precision, &prompt, 1, "full-window")?;
                tokens = j["prompt_ids"].as_array().map_or(0, Vec::len);
                best = best.max(tokens as f64 / timing(&j, "prefill_s")?);
            }
            eprintln!("prefill: {tokens} prompt tokens");
            speeds.push((format!("prefill_{n}"), best));
            figures.push(fig(&name(&format!("prefill_{n}")), best, "tok/s"));
        }
        let prompt = prompt_of(&root, &text, 16)?;
        let j = run_at(&root, precision, &prompt, 129, "cached")?;
        let decode = timing(&j, "decode_tokens_per_s")?;
        speeds.push(("decode_cached_1_stage".to_string(), decode));
        figures.push(fig(&name("decode_cached_1_stage"), decode, "tok/s"));
        let rss = j["peak_rss_bytes"]
            .as_f64()
            .context("peak_rss_bytes missing")?;
        params = j["params"].as_f64().context("params missing")?;
        figures.push(fig(&name("peak_rss"), rss / 1e6, "MB"));
        // The peak when loading had ended, and what stays resident after the turn.
        for (key, what) in [
            ("load_peak_rss_bytes", "peak_rss_at_load_end"),
            ("rss_bytes", "rss_after_turn"),
        ] {
            if let Some(v) = j[key].as_f64() {
                figures.push(fig(&name(what), v / 1e6, "MB"));
            }
        }
        figures.push(fig(
            &name("peak_rss_per_param"),
            rss / params,
            "bytes/param",
        ));
        let ids = ids_file.to_string_lossy();
        let scored = node(
            &root,
            &[
                "score",
                "--model",
                MODEL,
                "--ids-file",
                &ids,
                "--precision",
                precision,
                "--format",
                "json",
            ],
        )?;
        let argmax = scored["argmax"].as_array().context("score argmax")?;
        if argmax.len() != f32_argmax.len() {
            bail!(
                "scored {} positions of the essay, the golden {}",
                argmax.len(),
                f32_argmax.len()
            );
        }
        let agree = argmax
            .iter()
            .zip(f32_argmax)
            .filter(|(a, b)| a == b)
            .count();
        let ppl = scored["perplexity"].as_f64().context("score perplexity")?;
        figures.push(fig(
            &name("essay_top1_vs_f32"),
            100.0 * agree as f64 / argmax.len() as f64,
            "%",
        ));
        figures.push(fig(
            &name("essay_perplexity_above_f32"),
            100.0 * (ppl / f32_ppl - 1.0),
            "%",
        ));
    }
    // int8x2's speeds as a fraction of int8's (the first half of `speeds` is int8's).
    let half = speeds.len() / 2;
    for ((what, base), (_, two)) in speeds[..half].iter().zip(&speeds[half..]) {
        figures.push(fig(
            &format!("model/smollm2-135m/int8x2/{what}_vs_int8"),
            two / base,
            "x",
        ));
    }
    figures.push(fig("model/smollm2-135m/params", params / 1e6, "M"));
    Ok(figures)
}
