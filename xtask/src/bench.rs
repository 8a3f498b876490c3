//! `cargo xtask bench [--format text|json] [--model DIR] [--compare-llama-cpp DIR [--llama-gguf
//! FILE]] [FILTER]`: run every bench source (criterion benches of a package) and print its figures, one
//! `{"name","value","unit"}` JSON object per line with `--format json`, an aligned table otherwise.
//! Cargo's and criterion's own output goes to stderr. With `--compare-llama-cpp`, a llama.cpp that
//! the user built runs on the same weights in the same run, and ours over theirs is printed
//! (`bench_llama`).
//!
//! A source is a criterion bench target plus the figures derived from what it measured (fractions of
//! a peak, of a bandwidth). Add a source to [`SOURCES`] to add figures; FILTER is passed to criterion
//! as its regular-expression filter.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, bail};
use serde_json::Value;

/// One reported number.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: String,
}

/// A criterion bench target and what to derive from its figures.
struct Source {
    /// Package that owns the bench.
    package: &'static str,
    /// Its `[[bench]]` name.
    bench: &'static str,
    /// Unit and divisor for a criterion `Elements` throughput of the benchmark named `full_id`.
    elements: fn(full_id: &str) -> (&'static str, f64),
    /// Figures computed from this source's measured figures.
    derive: fn(&[Figure]) -> Vec<Figure>,
}

const SOURCES: &[Source] = &[
    Source {
        package: "daisy-gemm-int8",
        bench: "gemm",
        elements: |_| ("GOP/s", 1e9),
        derive: gemm_derived,
    },
    Source {
        package: "daisy-model",
        bench: "ops",
        elements: |_| ("G exp/s", 1e9),
        derive: |_| Vec::new(),
    },
    Source {
        package: "daisy-conformance",
        bench: "shard",
        elements: |_| ("", 1.0),
        derive: shard_derived,
    },
];

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut json = false;
    let mut filter = None;
    let mut llama: Option<super::bench_llama::Llama> = None;
    let mut gguf = None;
    let mut model = super::bench_model::BenchModel::fixture();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--format" => match it.next().map(String::as_str) {
                Some("json") => json = true,
                Some("text") => json = false,
                other => bail!("--format takes text or json, got {other:?}"),
            },
            "--compare-llama-cpp" => match it.next() {
                Some(dir) => {
                    llama = Some(super::bench_llama::Llama {
                        dir: dir.into(),
                        gguf: None,
                    })
                }
                None => bail!("--compare-llama-cpp takes the folder of a llama.cpp build"),
            },
            "--llama-gguf" => match it.next() {
                Some(file) => gguf = Some(PathBuf::from(file)),
                None => bail!("--llama-gguf takes a Q8_0 GGUF file of the benched model"),
            },
            "--model" => match it.next() {
                Some(dir) => model = super::bench_model::BenchModel::given(dir)?,
                None => bail!(
                    "--model takes the folder of a Hugging Face model (config.json, its \
                     .safetensors, tokenizer.json) for the model, ring and llama.cpp figures"
                ),
            },
            flag if flag.starts_with('-') => bail!(
                "unknown flag `{flag}`; usage: cargo xtask bench [--format text|json] \
                 [--model DIR] [--compare-llama-cpp DIR [--llama-gguf FILE]] [FILTER]"
            ),
            pattern if filter.is_none() => filter = Some(pattern.to_string()),
            extra => bail!("unexpected argument `{extra}`; only one FILTER is taken"),
        }
    }
    if let Some(l) = &mut llama {
        l.gguf = gguf;
    } else if gguf.is_some() {
        bail!("--llama-gguf goes with --compare-llama-cpp");
    }
    let mut figures = Vec::new();
    for source in SOURCES {
        figures.extend(run_source(source, filter.as_deref())?);
    }
    if filter
        .as_deref()
        .is_none_or(|f| "hub".contains(f) || f.contains("hub"))
    {
        figures.extend(super::bench_hub::figures()?);
    }
    if filter
        .as_deref()
        .is_none_or(|f| "model".contains(f) || f.contains("model"))
    {
        figures.extend(super::bench_model::figures(&model)?);
    }
    if filter
        .as_deref()
        .is_none_or(|f| "ring".contains(f) || f.contains("ring"))
    {
        // The ring's figures need the release node (a no-op when the model figures built it).
        super::bench_model::build_release(&model)?;
        figures.extend(super::bench_ring::figures(&model)?);
    }
    if let Some(l) = &llama {
        figures.extend(super::bench_llama::figures(&super::root(), &model, l)?);
        let ratios = super::bench_llama::ratios(&figures, &model.slug);
        figures.extend(ratios);
    }
    if json {
        for f in &figures {
            println!(
                "{}",
                serde_json::json!({ "name": f.name, "value": f.value, "unit": f.unit })
            );
        }
    } else {
        let width = figures.iter().map(|f| f.name.len()).max().unwrap_or(0);
        for f in &figures {
            println!("{:width$}  {:>10.2} {}", f.name, f.value, f.unit);
        }
    }
    Ok(())
}

fn run_source(source: &Source, filter: Option<&str>) -> anyhow::Result<Vec<Figure>> {
    let started = SystemTime::now();
    let mut args = vec![
        "bench",
        "--package",
        source.package,
        "--bench",
        source.bench,
        "--",
    ];
    args.extend(filter);
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(&args)
        .current_dir(super::root())
        .stdout(std::io::stderr())
        .status()
        .context("could not start cargo bench")?;
    if !status.success() {
        bail!("`cargo {}` failed with {status}", args.join(" "));
    }
    let dir = criterion_dir();
    let mut found = Vec::new();
    collect(&dir, started, &mut found)?;
    let mut figures = found
        .iter()
        .map(|run| figure(source, run))
        .collect::<anyhow::Result<Vec<_>>>()
        .with_context(|| format!("reading criterion results under {}", dir.display()))?;
    figures.sort_by(|a, b| a.name.cmp(&b.name));
    let derived = (source.derive)(&figures);
    figures.extend(derived);
    Ok(figures)
}

fn criterion_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| super::root().join("target"), PathBuf::from);
    target.join("criterion")
}

/// Every `new/` folder under `dir` whose estimates were written after `since`.
fn collect(dir: &Path, since: SystemTime, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            let estimates = path.join("estimates.json");
            let fresh = fs::metadata(&estimates)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since);
            if fresh {
                out.push(path);
            }
        } else {
            collect(&path, since, out)?;
        }
    }
    Ok(())
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A criterion result as a throughput: count per iteration ÷ mean time per iteration.
fn figure(source: &Source, new_dir: &Path) -> anyhow::Result<Figure> {
    let bench = read_json(&new_dir.join("benchmark.json"))?;
    let estimates = read_json(&new_dir.join("estimates.json"))?;
    let name = bench["full_id"]
        .as_str()
        .context("benchmark.json has no full_id")?
        .to_string();
    let mean_ns = estimates["mean"]["point_estimate"]
        .as_f64()
        .context("estimates.json has no mean")?;
    let per_sec = |count: &Value| -> anyhow::Result<f64> {
        let count = count.as_f64().context("throughput is not a number")?;
        Ok(count / (mean_ns * 1e-9))
    };
    let throughput = &bench["throughput"];
    let (value, unit) = if let Some(n) = throughput.get("Elements") {
        let (unit, div) = (source.elements)(&name);
        (per_sec(n)? / div, unit.to_string())
    } else if let Some(n) = throughput.get("BytesDecimal") {
        (per_sec(n)? / 1e9, "GB/s".to_string())
    } else if let Some(n) = throughput.get("Bytes") {
        (per_sec(n)? / (1u64 << 30) as f64, "GiB/s".to_string())
    } else {
        (mean_ns / 1e6, "ms".to_string())
    };
    Ok(Figure { name, value, unit })
}

/// The flat shard's restart as a multiple of reading the shard file (issue 18 asks ≤ 1.5): ready
/// (mapped), and ready with every layer's hash checked by a first pass.
fn shard_derived(figures: &[Figure]) -> Vec<Figure> {
    let ms = |name: &str| figures.iter().find(|f| f.name == name).map(|f| f.value);
    let Some(read) = ms("shard/read-file") else {
        return Vec::new();
    };
    ["restart-mapped", "restart-and-first-pass"]
        .iter()
        .filter_map(|what| {
            ms(&format!("shard/{what}")).map(|t| Figure {
                name: format!("shard/{what}/of-read-file"),
                value: t / read,
                unit: "x".into(),
            })
        })
        .collect()
}

/// The gemm-int8 targets: prefill (t ≥ 64) as a fraction of the measured int8 peak, and the decode
/// sweep as a fraction of the measured memory read bandwidth.
fn gemm_derived(figures: &[Figure]) -> Vec<Figure> {
    // The best this machine showed for a prefix (any thread count): a fair denominator even when
    // other work on the machine slowed the two-thread run.
    let best = |prefix: &str| {
        figures
            .iter()
            .filter(|f| f.name.starts_with(prefix))
            .map(|f| f.value)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    let mut out = Vec::new();
    if let Some(peak) = best("gemm-peak/avx512vnni/").or_else(|| best("gemm-peak/avx2/")) {
        let prefill: Vec<f64> = figures
            .iter()
            .filter(|f| {
                f.name.starts_with("gemm/")
                    && (f.name.contains("/t64-") || f.name.contains("/t512-"))
            })
            .map(|f| 100.0 * f.value / peak)
            .collect();
        if !prefill.is_empty() {
            let min = prefill.iter().copied().fold(f64::INFINITY, f64::min);
            let mean = prefill.iter().sum::<f64>() / prefill.len() as f64;
            out.push(Figure {
                name: "gemm-int8/prefill-t64+/min-of-peak".into(),
                value: min,
                unit: "%".into(),
            });
            out.push(Figure {
                name: "gemm-int8/prefill-t64+/mean-of-peak".into(),
                value: mean,
                unit: "%".into(),
            });
        }
    }
    let decode = figures
        .iter()
        .find(|f| f.name.starts_with("gemm-decode/"))
        .map(|f| f.value);
    if let (Some(decode), Some(memory)) = (decode, best("memory/read/")) {
        out.push(Figure {
            name: "gemm-int8/decode/of-memory-bandwidth".into(),
            value: 100.0 * decode / memory,
            unit: "%".into(),
        });
    }
    out
}
