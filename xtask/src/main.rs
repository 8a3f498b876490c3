//! Project tasks, run as `cargo xtask <task>`: fixtures, conformance, bench, ci.

use std::process::ExitCode;

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

fn run(args: &[String]) -> anyhow::Result<()> {
    match args.first().map(String::as_str) {
        Some(task) => anyhow::bail!("unknown task `{task}`; tasks: fixtures, conformance, bench, ci"),
        None => anyhow::bail!("usage: cargo xtask <fixtures|conformance|bench|ci>"),
    }
}
