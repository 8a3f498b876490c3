//! Project tasks, run as `cargo xtask <task>` (the alias lives in `.cargo/config.toml`).
//!
//! - `fixtures`: build `target/fixtures/` (cached; a second run does no work)
//! - `conformance`: replay real model splits and the mutation cases that must fail
//! - `bench [--format json] [--model DIR] [--compare-llama-cpp DIR] [FILTER]`: the benchmarks, one
//!   JSON object per line with `--format json`; `--model` runs the model, ring and llama.cpp figures
//!   on a local Hugging Face model instead of the SmolLM2 fixture
//! - `demo`: the main job — SmolLM2 on a ring of three processes answers a question, verified
//! - `tidy`: the dependency invariants of `ARCHITECTURE.md`, one line per violation
//! - `ci`: everything CI runs, ending with one line `N passed, M failed`; green here means green in CI

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::OnceLock;

use anyhow::{Context, bail};

mod bench;
mod bench_hub;
mod bench_llama;
mod bench_model;
mod bench_ring;
mod ci;
mod conformance;
mod fixtures;
mod tidy;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<Reported>() => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A failure the task has already reported in full: `main` only sets the exit status.
#[derive(Debug)]
pub(crate) struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed (reported above)")
    }
}

impl std::error::Error for Reported {}

const USAGE: &str = "usage: cargo xtask <fixtures|conformance|bench [--format json] [--model DIR] [--compare-llama-cpp DIR] [FILTER]|demo [PROMPT]|tidy|ci>";

fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(task) = args.first() else {
        bail!("{USAGE}")
    };
    let rest = &args[1..];
    match task.as_str() {
        "fixtures" => fixtures::run(rest),
        "conformance" => conformance::run(rest),
        "bench" => bench::run(rest),
        "ci" => ci::run(rest),
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

/// `program args…` as one line quoted for a POSIX shell, so that an echoed command can be pasted.
pub(crate) fn quoted(program: &str, args: &[&str]) -> String {
    let words = std::iter::once(program).chain(args.iter().copied());
    // Quoting fails only on a NUL byte, which no argument of a real command holds.
    shlex::try_join(words.clone()).unwrap_or_else(|_| words.collect::<Vec<_>>().join(" "))
}

/// Cargo's target folder: `$CARGO_TARGET_DIR` when set (relative to the current folder, as cargo
/// reads it), otherwise the `target_directory` of `cargo metadata`. Found once per process.
pub(crate) fn target_dir() -> anyhow::Result<PathBuf> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = FOUND.get() {
        return Ok(dir.clone());
    }
    let dir = find_target_dir()?;
    Ok(FOUND.get_or_init(|| dir).clone())
}

fn find_target_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return std::path::absolute(&dir)
            .with_context(|| format!("resolving CARGO_TARGET_DIR {}", Path::new(&dir).display()));
    }
    metadata()?["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("`cargo metadata` reported no target_directory")
}

/// Run a command in the workspace root, failing with its name when it fails.
pub(crate) fn cmd(program: &str, args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ {}", quoted(program, args));
    let status = Command::new(program)
        .args(args)
        .current_dir(root())
        .status()
        .with_context(|| format!("could not start `{program}`"))?;
    if !status.success() {
        bail!("`{}` failed with {status}", quoted(program, args));
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

/// The main job on the embedded default: the SmolLM2 fixture on a real ring of three processes on
/// loopback (`node demo`: a head and two members joined over WebRTC, each holding a third of the
/// layers), the answer streamed and verified against an unsplit run on the head. The node is built
/// first with cargo's progress showing, then run straight from the target folder.
fn demo(args: &[String]) -> anyhow::Result<()> {
    let prompt = match args {
        [] => "What are the three primary colors?",
        [p] => p.as_str(),
        _ => bail!("`demo` takes at most one argument, the prompt"),
    };
    fixtures::run(&[])?;
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let model = model.to_str().context("the workspace path is not UTF-8")?;
    cmd("cargo", &["build", "--release", "-p", "node"])?;
    let node = target_dir()?
        .join("release")
        .join(format!("node{}", std::env::consts::EXE_SUFFIX));
    let node = node
        .to_str()
        .context("the target folder's path is not UTF-8")?;
    cmd(
        node,
        &[
            "demo",
            "--model",
            model,
            "--chat",
            "--prompt",
            prompt,
            "--stages",
            "10,10,10",
            // Enough for the answer to end at end-of-sequence rather than mid-sentence.
            "--max-new-tokens",
            "256",
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::quoted;

    #[test]
    fn echoed_commands_paste_into_a_shell() {
        assert_eq!(
            quoted("cargo", &["build", "--release", "-p", "node"]),
            "cargo build --release -p node"
        );
        assert_eq!(
            quoted(
                "/tmp/my target/release/node",
                &[
                    "run",
                    "--prompt",
                    "What's $HOME `x`?",
                    "--stages",
                    "10,10,10"
                ]
            ),
            r#"'/tmp/my target/release/node' run --prompt "What's "'$HOME `x`?' --stages '10,10,10'"#
        );
    }
}
