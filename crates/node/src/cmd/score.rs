//! `node score`: one full-window pass over given ids — the argmax after each position, the
//! log-probability of each next given token and the perplexity (DESIGN.md §5).

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
    let plan = Plan::single(opened.config().num_layers)?;
    let chosen = super::backend(args.compute.backend)?;
    let stages = load_stages(&opened, &plan, precision, &chosen.backend, None)?;
    let mut ring = LocalRing::new(&plan, &stages, 1);
    let scored = score(&stages[0], &ids, &mut |p| ring.lap(p))?;
    if json_format {
        let perplexity = if scored.perplexity.is_finite() {
            json!(scored.perplexity)
        } else {
            json!(null)
        };
        println!(
            "{}",
            json!({
                "ids": ids,
                "argmax": scored.argmax,
                "logprobs": scored.logprobs,
                "perplexity": perplexity,
                "precision": precision.name(),
            })
        );
    } else {
        println!("{} tokens, perplexity {}", ids.len(), scored.perplexity);
    }
    Ok(())
}
