//! `node tokenize --model M (--text T | --file F) [--format json]`: encode text with the model's
//! tokenizer the way `run --prompt` does (DESIGN.md §5): special-token strings become their ids and
//! the post-processor applies (`encode(text, add_special_tokens=True)`).

use std::path::PathBuf;

use anyhow::{Context, bail};
use daisy_loader::Checkpoint;
use daisy_tokenizer::Tokenizer;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`.
    #[arg(long)]
    model: String,
    /// The text to encode, as given.
    #[arg(long, required_unless_present = "file", conflicts_with = "file")]
    text: Option<String>,
    /// A file whose bytes are the text (no trimming; invalid UTF-8 is refused).
    #[arg(long)]
    file: Option<PathBuf>,
    /// `text`: the ids separated by spaces; `json`: one JSON object `{"ids": [...]}`.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// The checkpoint's tokenizer, or an error naming what it refuses. `run` and `inspect` call this
/// before computing anything.
pub(crate) fn load_tokenizer(checkpoint: &Checkpoint) -> anyhow::Result<Tokenizer> {
    let json = checkpoint
        .tokenizer_json()
        .context("reading tokenizer.json")?;
    Tokenizer::from_json(&json).context("loading tokenizer.json")
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) => t.clone(),
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => bail!(
                    "{} is not valid UTF-8 (first invalid byte at offset {}): expected UTF-8 text",
                    path.display(),
                    e.utf8_error().valid_up_to()
                ),
            }
        }
        _ => bail!("give exactly one of --text and --file"),
    };
    let checkpoint =
        Checkpoint::open(&args.model).with_context(|| format!("opening model {}", args.model))?;
    let tokenizer = load_tokenizer(&checkpoint)?;
    let ids = tokenizer.encode(&text, true);
    match args.format {
        Format::Text => {
            let line: Vec<String> = ids.iter().map(u32::to_string).collect();
            println!("{}", line.join(" "));
        }
        Format::Json => println!("{}", serde_json::json!({ "ids": ids })),
    }
    Ok(())
}
