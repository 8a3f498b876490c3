//! `node score`: one full-window pass over given ids — the argmax after each position, the
//! log-probability of each next given token and the perplexity (DESIGN.md §5) — and, against an
//! earlier run's JSON (typically `--precision f32`), how often the two argmaxes agree and the ratio
//! of the perplexities: the quality of the int8 path in two numbers.

use std::path::PathBuf;

use anyhow::{Context, bail};
use daisy_engine::{LocalRing, load_stages};
use daisy_model::score;
use daisy_wire::Plan;
use serde_json::json;

use super::options::{ComputeArgs, FormatArgs};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`.
    #[arg(long)]
    model: String,
    /// Text to score, encoded as `run --prompt` is.
    #[arg(long, conflicts_with_all = ["file", "ids_file"])]
    text: Option<String>,
    /// A file whose bytes are the text (no trimming; invalid UTF-8 is refused).
    #[arg(long, conflicts_with = "ids_file")]
    file: Option<PathBuf>,
    /// A JSON array of token ids.
    #[arg(long)]
    ids_file: Option<PathBuf>,
    /// The `--format json` output of an earlier `node score` of the same ids (an f32 run, say):
    /// report the share of positions whose argmax agrees with it and the perplexity ratio.
    #[arg(long, value_name = "FILE")]
    against: Option<PathBuf>,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    format: FormatArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let json_format = args.format.json();
    let precision = args.compute.precision;
    let opened = super::open(&args.model)?;
    let ids: Vec<u32> = match (&args.text, &args.file, &args.ids_file) {
        (Some(t), None, None) => opened.tokenizer.encode(t, true),
        (None, Some(f), None) => opened
            .tokenizer
            .encode(&super::tokenize::read_text(f)?, true),
        (None, None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let ids: Vec<u64> = serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: expected a JSON array of token ids", f.display()))?;
            let vocab = opened.config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&i| i >= vocab as u64) {
                bail!(
                    "{}: token id {bad} is outside the vocabulary of {vocab} tokens",
                    f.display()
                );
            }
            ids.into_iter().map(|i| i as u32).collect()
        }
        _ => bail!("give exactly one of --text, --file and --ids-file"),
    };
    if ids.is_empty() {
        bail!("nothing to score: the input has no tokens");
    }
    // Read before the pass, so that a wrong file fails at once.
    let against = args
        .against
        .as_deref()
        .map(|f| Against::read(f, &ids))
        .transpose()?;
    let plan = Plan::single(opened.config().num_layers)?;
    let chosen = super::backend(args.compute.backend)?;
    let stages =
        crate::memory::loading(|| load_stages(&opened, &plan, precision, &chosen.backend, None))?;
    if stages.iter().any(|s| s.is_streamed()) {
        crate::memory::streaming();
    }
    let mut ring = LocalRing::new(&plan, &stages, 1);
    let scored = score(&stages[0], &ids, &mut |p| ring.lap(p))?;
    let compared = against
        .as_ref()
        .map(|a| a.compare(&scored.argmax, scored.perplexity));
    if json_format {
        let mut out = json!({
            "ids": ids,
            "argmax": scored.argmax,
            "logprobs": scored.logprobs,
            "perplexity": finite(scored.perplexity),
            "precision": precision.name(),
        });
        if let Some(c) = &compared {
            out["against"] = json!({
                "agree": c.agree,
                "positions": c.positions,
                "top1_agreement": c.agree as f64 / c.positions as f64,
                "perplexity": finite(c.their_perplexity),
                "perplexity_ratio": finite(c.perplexity_ratio),
            });
        }
        println!("{out}");
    } else {
        println!("{} tokens, perplexity {}", ids.len(), scored.perplexity);
        if let (Some(c), Some(f)) = (&compared, &args.against) {
            println!(
                "against {}: top-1 agreement {:.2}% ({} of {} positions), perplexity ratio {:.4} \
                 ({} there)",
                f.display(),
                100.0 * c.agree as f64 / c.positions as f64,
                c.agree,
                c.positions,
                c.perplexity_ratio,
                c.their_perplexity
            );
        }
    }
    Ok(())
}

/// A number, or `null` where it is not finite (JSON has no NaN).
fn finite(x: f64) -> serde_json::Value {
    if x.is_finite() { json!(x) } else { json!(null) }
}

/// An earlier run's argmax and perplexity over the same ids.
struct Against {
    argmax: Vec<u32>,
    perplexity: f64,
}

/// How this run compares with an [`Against`].
struct Compared {
    agree: usize,
    positions: usize,
    their_perplexity: f64,
    perplexity_ratio: f64,
}

impl Against {
    /// The JSON `node score --format json` printed (its last line); refused unless it scored
    /// exactly `ids`.
    fn read(file: &std::path::Path, ids: &[u32]) -> anyhow::Result<Self> {
        #[derive(serde::Deserialize)]
        struct Run {
            ids: Vec<u32>,
            argmax: Vec<u32>,
            perplexity: Option<f64>,
        }
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let run: Run = serde_json::from_str(last).with_context(|| {
            format!(
                "{}: expected the JSON of `node score --format json` (ids, argmax, perplexity)",
                file.display()
            )
        })?;
        if run.ids != ids {
            let at = run.ids.iter().zip(ids).position(|(a, b)| a != b);
            match at {
                Some(i) => bail!(
                    "{} scored other ids: position {i} is {} there and {} here",
                    file.display(),
                    run.ids[i],
                    ids[i]
                ),
                None => bail!(
                    "{} scored {} ids, this run {}",
                    file.display(),
                    run.ids.len(),
                    ids.len()
                ),
            }
        }
        if run.argmax.len() != ids.len() {
            bail!(
                "{}: {} argmax entries for {} ids",
                file.display(),
                run.argmax.len(),
                ids.len()
            );
        }
        Ok(Self {
            argmax: run.argmax,
            perplexity: run.perplexity.unwrap_or(f64::NAN),
        })
    }

    fn compare(&self, argmax: &[u32], perplexity: f64) -> Compared {
        Compared {
            agree: self
                .argmax
                .iter()
                .zip(argmax)
                .filter(|(a, b)| a == b)
                .count(),
            positions: argmax.len(),
            their_perplexity: self.perplexity,
            perplexity_ratio: perplexity / self.perplexity,
        }
    }
}
