//! The model figures of `cargo xtask bench`: SmolLM2-135M-Instruct (or the model of `--model DIR`)
//! through the released `node` binary, one stage, at each int8 precision (`int8`, the default, and `int8x2`) — prefill tok/s at
//! 64 and 512 prompt tokens (full window), decode tok/s on the cached path, peak RSS ÷ parameters of
//! the whole model in one process — and beside them the quality of each: on the essay (the golden's
//! ids), top-1 agreement with `transformers`' f32 argmax and how far the perplexity lies above
//! f32's (the fixture only: the quality figures need its golden). int8x2's speeds also appear as a
//! fraction of int8's, so the price of its accuracy is printed with it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::Figure;

pub(crate) const MODEL: &str = "target/fixtures/SmolLM2-135M-Instruct";
pub(crate) const TEXT: &str = "fixtures/text/essay.txt";

/// The golden of SmolLM2 (its essay ids and `transformers`' f32 argmax and perplexity).
const GOLDEN: &str = "fixtures/goldens/SmolLM2-135M-Instruct.json";

/// The model the model, ring and llama.cpp figures run on: the SmolLM2 fixture, or `--model DIR`.
#[derive(Clone, Debug)]
pub(crate) struct BenchModel {
    /// Its folder as `node --model` takes it (relative to the repository root, or absolute).
    pub(crate) dir: String,
    /// Its name in figure names and in the names of files made for it (`smollm2-135m`).
    pub(crate) slug: String,
    /// Its golden (the essay's ids, `transformers`' f32 argmax and perplexity), for the quality
    /// figures: the fixture's.
    golden: Option<&'static str>,
}

impl BenchModel {
    /// The SmolLM2-135M-Instruct fixture (`cargo xtask fixtures`).
    pub(crate) fn fixture() -> Self {
        Self {
            dir: MODEL.to_string(),
            slug: "smollm2-135m".to_string(),
            golden: Some(GOLDEN),
        }
    }

    /// `--model DIR`: a local folder of a Hugging Face model (`config.json`, its safetensors, its
    /// tokenizer), named in the figures by its folder's name.
    pub(crate) fn given(dir: &str) -> anyhow::Result<Self> {
        let path =
            std::fs::canonicalize(dir).with_context(|| format!("--model {dir}: no such folder"))?;
        if !path.join("config.json").is_file() {
            bail!(
                "--model {dir}: no config.json there; give the folder of a Hugging Face model \
                 (config.json, its .safetensors, tokenizer.json)"
            );
        }
        let mut model = Self {
            dir: path.to_string_lossy().into_owned(),
            slug: String::new(),
            golden: None,
        };
        model.slug = slug_of(&model.folder_name());
        Ok(model)
    }

    /// Whether this is the fixture (which `build_release` fetches when it is missing).
    fn is_fixture(&self) -> bool {
        self.golden.is_some()
    }

    /// Its folder's name as it is (`SmolLM2-135M-Instruct`).
    pub(crate) fn folder_name(&self) -> String {
        Path::new(&self.dir)
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    }

    /// Its folder as a path from the repository root.
    pub(crate) fn path(&self, root: &Path) -> PathBuf {
        root.join(&self.dir)
    }
}

/// A folder's name for figure names: lower case, anything but letters, digits, `.`, `_` and `-`
/// made `-`.
fn slug_of(name: &str) -> String {
    name.to_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .collect()
}

/// `node run` on `model` in int8 with `new_tokens` generated (end-of-sequence ignored) on `path`.
pub(crate) fn run_int8(
    root: &Path,
    model: &BenchModel,
    prompt: &str,
    new_tokens: usize,
    path: &str,
) -> anyhow::Result<Value> {
    run_at(root, model, "int8", prompt, new_tokens, path)
}

/// [`run_int8`] at `precision`.
fn run_at(
    root: &Path,
    model: &BenchModel,
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
            &model.dir,
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

/// The longest prefix of the essay (cut at a char boundary) that `model` encodes to at most `n`
/// tokens.
pub(crate) fn prompt_of(
    root: &Path,
    model: &BenchModel,
    text: &str,
    n: usize,
) -> anyhow::Result<String> {
    let count = |s: &str| -> anyhow::Result<usize> {
        let j = node(
            root,
            &[
                "tokenize", "--model", &model.dir, "--text", s, "--format", "json",
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

/// The fixtures (when `model` is the fixture), and `node` in release.
pub(crate) fn build_release(model: &BenchModel) -> anyhow::Result<()> {
    let root = crate::root();
    if model.is_fixture() && !root.join(MODEL).join("model.safetensors").is_file() {
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

pub(crate) fn figures(model: &BenchModel) -> anyhow::Result<Vec<Figure>> {
    let root = crate::root();
    build_release(model)?;
    let text =
        std::fs::read_to_string(root.join(TEXT)).with_context(|| format!("reading {TEXT}"))?;
    let mut figures = Vec::new();
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: name.to_string(),
        value,
        unit: unit.to_string(),
    };
    let quality = model.golden.map(|g| golden(&root, g)).transpose()?;
    let slug = &model.slug;
    let mut params = 0.0;
    let mut speeds: Vec<(String, f64)> = Vec::new();
    for precision in ["int8", "int8x2"] {
        let name = |what: &str| format!("model/{slug}/{precision}/{what}");
        for n in [64usize, 512] {
            let prompt = prompt_of(&root, model, &text, n)?;
            let mut best = 0f64;
            let mut tokens = 0;
            for _ in 0..3 {
                let j = run_at(&root, model, precision, &prompt, 1, "full-window")?;
                tokens = j["prompt_ids"].as_array().map_or(0, Vec::len);
                best = best.max(tokens as f64 / timing(&j, "prefill_s")?);
            }
            eprintln!("prefill: {tokens} prompt tokens");
            speeds.push((format!("prefill_{n}"), best));
            figures.push(fig(&name(&format!("prefill_{n}")), best, "tok/s"));
        }
        let prompt = prompt_of(&root, model, &text, 16)?;
        let j = run_at(&root, model, precision, &prompt, 129, "cached")?;
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
        let Some((ids_file, f32_argmax, f32_ppl)) = &quality else {
            continue;
        };
        let ids = ids_file.to_string_lossy();
        let scored = node(
            &root,
            &[
                "score",
                "--model",
                &model.dir,
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
            &format!("model/{slug}/int8x2/{what}_vs_int8"),
            two / base,
            "x",
        ));
    }
    figures.push(fig(&format!("model/{slug}/params"), params / 1e6, "M"));
    Ok(figures)
}

/// The golden's essay ids (written to a file for `node score`), f32 argmax and perplexity.
fn golden(root: &Path, file: &str) -> anyhow::Result<(PathBuf, Vec<Value>, f64)> {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"))?,
    )
    .with_context(|| format!("parsing {file}"))?;
    let ids_file = crate::target_dir()?.join("bench-essay-ids.json");
    std::fs::write(&ids_file, golden["text"]["ids"].to_string())
        .with_context(|| format!("writing {}", ids_file.display()))?;
    let f32_argmax = golden["text"]["f32_argmax"]
        .as_array()
        .context("the golden's text.f32_argmax")?
        .clone();
    let f32_ppl = golden["text"]["f32_perplexity"]
        .as_f64()
        .context("the golden's text.f32_perplexity")?;
    Ok((ids_file, f32_argmax, f32_ppl))
}
