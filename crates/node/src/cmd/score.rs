//! `node score`: one full-window pass over given ids — the argmax after each position, the
//! log-probability of each next given token and the perplexity (DESIGN.md §5).

use std::path::PathBuf;

use anyhow::{Context, bail};
use daisy_model::{Precision, score};
use daisy_wire::Plan;
use serde_json::json;

use super::run::{LocalRing, backend, load_stages, open, parse_backend, read_text};

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
    /// `int8` or `f32`.
    #[arg(long, default_value = "int8")]
    precision: String,
    /// `auto` or `cpu`.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// `text` or `json`.
    #[arg(long, default_value = "text")]
    format: String,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let json_format = super::json_format(&args.format)?;
    let precision = Precision::parse(&args.precision)?;
    let choice = parse_backend(&args.backend)?;
    let opened = open(&args.model)?;
    let ids: Vec<u32> = match (&args.text, &args.file, &args.ids_file) {
        (Some(t), None, None) => opened.tokenizer.encode(t, true),
        (None, Some(f), None) => opened.tokenizer.encode(&read_text(f)?, true),
        (None, None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let ids: Vec<u64> = serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: expected a JSON array of token ids", f.display()))?;
            let vocab = opened.config.vocab_size;
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
    let plan = Plan::single(opened.config.num_layers)?;
    let (backend, _adapter) = backend(choice)?;
    let stages = load_stages(&opened, &plan, precision, &backend)?;
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
