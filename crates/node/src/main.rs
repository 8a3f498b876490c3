//! The DaisyChain-Infer node: the command line of DESIGN.md §5.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run one Hugging Face language model across several devices.
#[derive(Parser)]
#[command(name = "node", version, about, long_about = None)]
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
