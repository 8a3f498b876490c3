//! The DaisyChain-Infer node: the command line of DESIGN.md §5.
//!
//! Each subcommand lives in its own module under `cmd/`; this file only parses and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// Run one Hugging Face language model across several devices.
///
/// Each device holds only its own slice of the model's layers; a token is produced by passing the
/// hidden state around a ring of peers. Every matrix multiply goes through one verified INT8 GEMM.
#[derive(Parser)]
#[command(name = "node", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {}
}
