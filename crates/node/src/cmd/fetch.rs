//! `node fetch`: load one stage's slice of a model the way a device of the ring does before its first
//! lap — fetch only that stage's byte ranges (one coalesced range in flight while the previous one is
//! widened and quantized), build the stage — and report the bytes and the time it took.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use daisy_loader::Checkpoint;
use daisy_loader::hub::HubClient;
use daisy_model::{Precision, Stage};

use super::options::FormatArgs;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`
    /// fetched from `$HF_ENDPOINT` (default: the public Hub).
    #[arg(long)]
    model: String,
    /// The stage's layers, `start..end` (end exclusive); `0..0` holds none.
    #[arg(long, default_value = "0..0")]
    layers: String,
    /// Also load the head's tensors: the embedding, the final norm and the lm_head.
    #[arg(long)]
    head: bool,
    /// `int8` (weights held quantized) or `f32`.
    #[arg(long, value_enum, default_value_t = Precision::Int8)]
    precision: Precision,
    /// Only download the stage's tensors (no widening, no quantizing): the pure download time of the
    /// same bytes, to compare with the time to a ready stage.
    #[arg(long)]
    download_only: bool,
    /// A name for this device, sent to the server as `X-Daisy-Client` (a mirror counts bytes by it).
    #[arg(long)]
    client_id: Option<String>,
    #[command(flatten)]
    format: FormatArgs,
}

fn parse_layers(text: &str) -> anyhow::Result<Range<usize>> {
    let (a, b) = text
        .split_once("..")
        .with_context(|| format!("--layers `{text}`: expected start..end, e.g. 10..20"))?;
    let a: usize = a
        .trim()
        .parse()
        .with_context(|| format!("--layers `{text}`: bad start"))?;
    let b: usize = b
        .trim()
        .parse()
        .with_context(|| format!("--layers `{text}`: bad end"))?;
    if a > b {
        bail!("--layers `{text}`: start is after end");
    }
    Ok(a..b)
}

/// A Hub client named after this device, with a progress bar on stderr once the total is known.
pub(crate) fn hub_client(client_id: Option<&str>) -> anyhow::Result<Arc<HubClient>> {
    let mut client = super::hub_client()?;
    if let Some(id) = client_id {
        client = client.with_client_id(id);
    }
    Ok(Arc::new(client))
}

/// A byte progress bar on stderr with rate and ETA, fed by the client's fetched-bytes counter.
pub(crate) fn progress_bar(client: &HubClient, total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total).with_message(what.to_string());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let start = client.fetched();
    let b = bar.clone();
    client.set_progress(Arc::new(move |fetched| {
        b.set_position(fetched.saturating_sub(start))
    }));
    bar
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let layers = parse_layers(&args.layers)?;
    let precision = args.precision;
    let client = hub_client(args.client_id.as_deref())?;
    let t0 = Instant::now();
    let checkpoint = Checkpoint::open_with(&args.model, Some(client.clone()))
        .with_context(|| format!("opening model {}", args.model))?;
    let header_bytes = client.fetched();
    let config = checkpoint.config().clone();
    if layers.end > config.num_layers {
        bail!(
            "--layers {}..{}: the model has {} layers",
            layers.start,
            layers.end,
            config.num_layers
        );
    }
    let mut names: Vec<&str> = Vec::new();
    for layer in layers.clone() {
        names.extend(
            checkpoint
                .layer_tensors(layer)
                .iter()
                .map(|t| t.name.as_str()),
        );
    }
    if args.head {
        names.extend(
            checkpoint
                .non_layer_tensors()
                .iter()
                .map(|t| t.name.as_str()),
        );
    }
    let tensor_bytes: u64 = names
        .iter()
        .filter_map(|n| checkpoint.tensor(n))
        .map(|t| t.byte_len)
        .sum();
    let bar = progress_bar(&client, tensor_bytes, "fetching");
    let t1 = Instant::now();
    checkpoint.prefetch(&names);
    let held = if args.download_only {
        for name in &names {
            checkpoint.read_raw(name)?;
        }
        0
    } else {
        let stage = Stage::load(&checkpoint, &config, layers.clone(), args.head, precision)
            .with_context(|| format!("loading layers {}..{}", layers.start, layers.end))?;
        stage.weight_bytes()
    };
    let ready = t1.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let fetched = client.fetched();
    let summary = json!({
        "model": args.model,
        "commit": checkpoint.commit(),
        "layers": [layers.start, layers.end],
        "head": args.head,
        "tensors": names.len(),
        "tensor_bytes": tensor_bytes,
        "fetched_bytes": fetched,
        "open_bytes": header_bytes,
        "download_only": args.download_only,
        "weight_bytes_held": held,
        "open_seconds": t1.duration_since(t0).as_secs_f64(),
        "ready_seconds": ready,
    });
    if args.format.json() {
        println!("{summary}");
    } else {
        println!(
            "layers {}..{}{}: {} tensors, {} tensor bytes, {} bytes fetched, ready in {:.2}s",
            layers.start,
            layers.end,
            if args.head { " + head" } else { "" },
            names.len(),
            tensor_bytes,
            fetched,
            ready
        );
    }
    Ok(())
}
