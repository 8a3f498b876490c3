//! `node adapters`: the wgpu adapters this machine offers, without opening a device. `--backend auto`
//! asks a child process this question, so that on a machine whose only adapter is a software
//! rasterizer the driver (~50 MB resident for Mesa's lavapipe) is never loaded into the node.

use std::process::Command;

use anyhow::{Context, bail};
use daisy_wgsl::AdapterSummary;
use serde_json::json;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    format: super::options::FormatArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let json_format = args.format.json();
    let list = daisy_wgsl::adapters();
    if json_format {
        let out: Vec<_> = list
            .iter()
            .map(|a| json!({ "name": a.name, "software": a.software }))
            .collect();
        println!("{}", serde_json::Value::Array(out));
    } else {
        for a in &list {
            let kind = if a.software { "software" } else { "hardware" };
            println!("{}\t{kind}", a.name);
        }
        if list.is_empty() {
            eprintln!("no wgpu adapter found");
        }
    }
    Ok(())
}

/// The adapters as a child `node adapters --format json` sees them (same environment).
pub(crate) fn in_child() -> anyhow::Result<Vec<AdapterSummary>> {
    let exe = std::env::current_exe().context("locating the node executable")?;
    let out = Command::new(exe)
        .args(["adapters", "--format", "json"])
        .output()
        .context("running `node adapters`")?;
    if !out.status.success() {
        bail!(
            "`node adapters` exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).context("reading `node adapters` output")?;
    list.iter()
        .map(|a| {
            Ok(AdapterSummary {
                name: a["name"]
                    .as_str()
                    .context("adapter without a name")?
                    .to_owned(),
                software: a["software"]
                    .as_bool()
                    .context("adapter without `software`")?,
            })
        })
        .collect()
}
