//! The Hub-loading figures of `cargo xtask bench`: time to a ready stage (fetch, widen, quantize)
//! against the pure download time of the same bytes, from `node mirror` capped at a LAN-like rate.
//! Goal: ready ≤ 1.1 × download, which holds only when fetching overlaps the widening.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::Figure;

/// The rate the mirror sends each response at, in MB/s (a gigabit LAN).
const RATE_MB_S: &str = "100";
const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn figures() -> anyhow::Result<Vec<Figure>> {
    crate::fixtures::run(&[])?;
    let root = crate::root();
    crate::cmd("cargo", &["build", "--release", "--quiet", "-p", "node"])?;
    let node = crate::target_dir()?.join("release/node");
    let served = tempfile_dir()?;
    let org = served.join("HuggingFaceTB");
    std::fs::create_dir_all(&org)?;
    let link = org.join("SmolLM2-135M-Instruct");
    if !link.exists() {
        std::os::unix::fs::symlink(root.join("target/fixtures/SmolLM2-135M-Instruct"), &link)?;
    }
    let mut child = Command::new(&node)
        .args([
            "mirror",
            served.to_str().context("path not UTF-8")?,
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--rate-limit", RATE_MB_S])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting node mirror")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("mirror stdout")?).read_line(&mut line)?;
    let _mirror = Killed(child);
    let endpoint = line
        .trim()
        .strip_prefix("listening on ")
        .context("mirror did not print its URL")?
        .to_string();
    let fetch = |layers: &str, head: bool, download_only: bool| -> anyhow::Result<f64> {
        let mut cmd = Command::new(&node);
        cmd.args([
            "fetch", "--model", REPO, "--layers", layers, "--format", "json",
        ])
        .env("HF_ENDPOINT", &endpoint)
        .env("HF_HUB_CACHE", served.join("no-cache"));
        if head {
            cmd.arg("--head");
        }
        if download_only {
            cmd.arg("--download-only");
        }
        let out = cmd.output().context("running node fetch")?;
        if !out.status.success() {
            bail!(
                "node fetch failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8(out.stdout)?;
        let v: Value = serde_json::from_str(stdout.lines().last().context("no output")?)?;
        v["ready_seconds"].as_f64().context("no ready_seconds")
    };
    let mut out = Vec::new();
    for (name, layers, head) in [
        ("stage-middle-10-layers", "10..20", false),
        ("stage-head-10-layers", "0..10", true),
    ] {
        // Best of three, each: the machine is shared.
        let best = |download_only| -> anyhow::Result<f64> {
            let mut times = Vec::new();
            for _ in 0..3 {
                times.push(fetch(layers, head, download_only)?);
            }
            Ok(times.into_iter().fold(f64::INFINITY, f64::min))
        };
        let download = best(true)?;
        let ready = best(false)?;
        out.push(Figure {
            name: format!("hub/{name}/download"),
            value: download,
            unit: "s".into(),
        });
        out.push(Figure {
            name: format!("hub/{name}/ready"),
            value: ready,
            unit: "s".into(),
        });
        out.push(Figure {
            name: format!("hub/{name}/ready-over-download"),
            value: ready / download,
            unit: "x".into(),
        });
    }
    Ok(out)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = crate::root().join("target/bench-hub");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
