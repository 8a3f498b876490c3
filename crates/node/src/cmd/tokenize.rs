//! `node tokenize --model M (--text T | --file F) [--format json]`: encode text with the model's
//! tokenizer the way `run --prompt` does (DESIGN.md §5): special-token strings become their ids and
//! the post-processor applies (`encode(text, add_special_tokens=True)`).

use std::path::PathBuf;

use anyhow::{Context, bail};

use super::options::{Format, FormatArgs};

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
    #[command(flatten)]
    format: FormatArgs,
}

/// Read a file as UTF-8 text, refusing invalid bytes.
pub(crate) fn read_text(path: &PathBuf) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not valid UTF-8 (first invalid byte at offset {}): expected UTF-8 text",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) => t.clone(),
        (None, Some(path)) => read_text(path)?,
        _ => bail!("give exactly one of --text and --file"),
    };
    let checkpoint = super::checkpoint(&args.model)?;
    let tokenizer = daisy_engine::tokenizer_of(&checkpoint)?;
    let ids = tokenizer.encode(&text, true);
    match args.format.format {
        Format::Text => {
            let line: Vec<String> = ids.iter().map(u32::to_string).collect();
            println!("{}", line.join(" "));
        }
        Format::Json => println!("{}", serde_json::json!({ "ids": ids })),
    }
    Ok(())
}
