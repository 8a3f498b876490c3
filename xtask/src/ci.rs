//! `cargo xtask ci`: everything CI checks — fixtures, formatting, the dependency rules, lints, then
//! every test of the workspace — ending with one line `N passed, M failed`, the sum of the test
//! harness's `test result:` lines.

use std::fs::Permissions;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::thread;

use anyhow::{Context, bail};

use crate::{Reported, cmd, fixtures, root, tidy};

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    if let Some(extra) = args.first() {
        bail!("`ci` takes no arguments, got `{extra}`");
    }
    // Mesa prints `XDG_RUNTIME_DIR is invalid or not set` for every GPU test without one. Kept until
    // the end of `ci`, so every child cargo (and the tests it runs) sees it; removed on drop.
    let _runtime_dir = private_runtime_dir()?;
    fixtures::run(&[])?;
    cmd("cargo", &["fmt", "--all", "--", "--check"])?;
    tidy::run(&[])?;
    cmd(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            "node/test-hooks",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    test_workspace()
}

/// When `XDG_RUNTIME_DIR` is unset (or empty), point it at a fresh temporary folder of mode 0700.
fn private_runtime_dir() -> anyhow::Result<Option<tempfile::TempDir>> {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|v| !v.is_empty()) {
        return Ok(None);
    }
    let dir = tempfile::Builder::new()
        .prefix("xtask-xdg-runtime-")
        .permissions(Permissions::from_mode(0o700))
        .tempdir()
        .context("creating a private XDG_RUNTIME_DIR")?;
    // SAFETY: `ci` sets this before it starts any thread or child process, and xtask has no thread
    // of its own before `ci` runs, so no other thread can be reading the environment.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", dir.path()) };
    Ok(Some(dir))
}

/// `cargo test --workspace`, its output streamed through as it comes and its `test result:` lines
/// summed; ends with the line `N passed, M failed`.
fn test_workspace() -> anyhow::Result<()> {
    // The test-only kernel corruption switch is compiled in for the test run (never in a release).
    let args = ["test", "--workspace", "--features", "node/test-hooks"];
    eprintln!("$ {}", crate::quoted("cargo", &args));
    let mut child = Command::new("cargo")
        .args(args)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not start `cargo test`")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let from_stderr = thread::spawn(move || relay(stderr, &mut io::stderr()));
    let mut total = relay(stdout, &mut io::stdout())?;
    let from_stderr = from_stderr
        .join()
        .map_err(|_| anyhow::anyhow!("the thread reading cargo's stderr panicked"))??;
    total.add(from_stderr);
    let status = child.wait().context("waiting for `cargo test`")?;

    if !status.success() {
        eprintln!(
            "error: `{}` failed with {status}",
            crate::quoted("cargo", &args)
        );
    } else if total.failed > 0 {
        eprintln!("error: {} test(s) failed", total.failed);
    }
    println!("{} passed, {} failed", total.passed, total.failed);
    if !status.success() || total.failed > 0 {
        return Err(Reported.into());
    }
    Ok(())
}

/// Tests counted from the harness's `test result:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    passed: u64,
    failed: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
    }
}

/// Copy `from` to `to` line by line as it arrives, counting the `test result:` lines.
fn relay(from: impl Read, to: &mut impl Write) -> io::Result<Tally> {
    let mut total = Tally::default();
    let mut from = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        if from.read_until(b'\n', &mut line)? == 0 {
            return Ok(total);
        }
        to.write_all(&line)?;
        to.flush()?;
        if let Some(tally) = test_result(&String::from_utf8_lossy(&line)) {
            total.add(tally);
        }
    }
}

/// The counts of one libtest summary line,
/// `test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s`
/// (colour codes allowed); `None` for any other line.
fn test_result(line: &str) -> Option<Tally> {
    let line = strip_ansi(line);
    let rest = line.trim().strip_prefix("test result:")?;
    let (_, counts) = rest.split_once('.')?;
    let mut tally = Tally::default();
    let mut seen = (false, false);
    for part in counts.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => (tally.passed, seen.0) = (n, true),
            "failed" => (tally.failed, seen.1) = (n, true),
            _ => {}
        }
    }
    (seen == (true, true)).then_some(tally)
}

/// `line` without ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Tally, relay, test_result};

    #[test]
    fn reads_passing_and_failing_summaries() {
        let ok = "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; \
                  finished in 0.01s\n";
        assert_eq!(
            test_result(ok),
            Some(Tally {
                passed: 12,
                failed: 0
            })
        );
        let failed = "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered \
                      out; finished in 1.50s";
        assert_eq!(
            test_result(failed),
            Some(Tally {
                passed: 3,
                failed: 2
            })
        );
        let coloured = "test result: \u{1b}[32mok\u{1b}[0m. 4 passed; 0 failed; 0 ignored";
        assert_eq!(
            test_result(coloured),
            Some(Tally {
                passed: 4,
                failed: 0
            })
        );
    }

    #[test]
    fn other_lines_are_not_summaries() {
        for line in [
            "test tidy::tests::clean ... ok",
            "running 12 tests",
            "test result: ok.",
            "   Compiling xtask v0.1.0 (/ws/xtask)",
            "println!(\"test result: ok. {n} passed\")",
        ] {
            assert_eq!(test_result(line), None, "{line}");
        }
    }

    #[test]
    fn relay_copies_everything_and_sums() {
        let input = "running 2 tests\n\
                     test a ... ok\n\
                     test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n\
                     test result: FAILED. 5 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\
                     no newline at the end";
        let mut out = Vec::new();
        let total = relay(input.as_bytes(), &mut out).unwrap();
        assert_eq!(out, input.as_bytes());
        assert_eq!(
            total,
            Tally {
                passed: 7,
                failed: 1
            }
        );
    }
}
