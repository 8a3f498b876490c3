//! Project tasks, run as `cargo xtask <task>` (the alias lives in `.cargo/config.toml`).
//!
//! - `fixtures`: build `target/fixtures/` (cached; a second run does no work)
//! - `conformance`: replay real model splits and the mutation cases that must fail
//! - `bench [--format json]`: the benchmarks, one JSON object per line with `--format json`
//! - `demo`: the main job — SmolLM2 split into three stages answers a question, verified
//! - `tidy`: the dependency invariants of `ARCHITECTURE.md`, one line per violation
//! - `ci`: everything CI runs; green here means green in CI

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

mod bench;
mod bench_hub;
mod bench_model;
mod conformance;
mod fixtures;
mod tidy;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str =
    "usage: cargo xtask <fixtures|conformance|bench [--format json]|demo [PROMPT]|tidy|ci>";

fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(task) = args.first() else {
        bail!("{USAGE}")
    };
    let rest = &args[1..];
    match task.as_str() {
        "fixtures" => fixtures::run(rest),
        "conformance" => conformance::run(rest),
        "bench" => bench::run(rest),
        "ci" => ci(rest),
        "demo" => demo(rest),
        "tidy" => tidy::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown task `{other}`; {USAGE}"),
    }
}

/// The workspace root (the folder holding the root `Cargo.toml`).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Run a command in the workspace root, failing with its name when it fails.
pub(crate) fn cmd(program: &str, args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(root())
        .status()
        .with_context(|| format!("could not start `{program}`"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

/// `cargo metadata --format-version 1 --no-deps` of the workspace, parsed.
pub(crate) fn metadata() -> anyhow::Result<serde_json::Value> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root())
        .output()
        .context("could not start `cargo metadata`")?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing the output of `cargo metadata`")
}

/// Everything CI checks: fixtures, formatting, the dependency rules, lints, then every test of the
/// workspace.
fn ci(args: &[String]) -> anyhow::Result<()> {
    if let Some(extra) = args.first() {
        bail!("`ci` takes no arguments, got `{extra}`");
    }
    fixtures::run(&[])?;
    cmd("cargo", &["fmt", "--all", "--", "--check"])?;
    tidy::run(&[])?;
    cmd(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    cmd("cargo", &["test", "--workspace"])
}

/// The main job on the embedded default: the SmolLM2 fixture split into three stages, every hop through
/// the wire and the router, the ids verified against an unsplit run on the head.
fn demo(args: &[String]) -> anyhow::Result<()> {
    let prompt = match args {
        [] => "What are the three primary colors?",
        [p] => p.as_str(),
        _ => bail!("`demo` takes at most one argument, the prompt"),
    };
    fixtures::run(&[])?;
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let model = model.to_str().context("the workspace path is not UTF-8")?;
    cmd(
        "cargo",
        &[
            "run",
            "--release",
            "--quiet",
            "-p",
            "node",
            "--",
            "run",
            "--model",
            model,
            "--chat",
            "--prompt",
            prompt,
            "--stages",
            "10,10,10",
            "--max-new-tokens",
            "64",
            "--verify",
        ],
    )
}
