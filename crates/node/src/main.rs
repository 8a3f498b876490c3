//! The DaisyChain-Infer node: the command line of DESIGN.md §5.
//!
//! Each subcommand lives in its own module under `cmd/`; this file only parses and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod control;
mod memory;
mod net;
mod rtc;
#[cfg(feature = "test-hooks")]
mod test_hooks;

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
enum Command {
    /// List the wgpu adapters this machine offers (hardware or software), without opening a device.
    Adapters(cmd::adapters::Args),
    /// Load one stage's slice of a model (only its byte ranges) and report bytes and time.
    Fetch(cmd::fetch::Args),
    /// Start a ring on this machine as separate processes (a head and its members) and run a prompt.
    Demo(cmd::demo::Args),
    /// Lead a ring: serve signaling (and a local model folder), plan, and drive the turns.
    Head(cmd::head::Args),
    /// Show a checkpoint's config, tensor table, bytes per layer and tying; validates without computing.
    Inspect(cmd::inspect::Args),
    /// Offer this device to a head's ring (the join URL on the command line or stdin).
    Join(cmd::join::Args),
    /// Serve local model folders with the Hub's URL layout and range support (a LAN mirror).
    Mirror(cmd::mirror::Args),
    /// Generate from a prompt, the split of `--stages` played in one process through the real wire.
    Run(cmd::run::Args),
    /// Teacher-forced pass over given ids: argmax, log-probabilities and perplexity.
    Score(cmd::score::Args),
    /// Encode text with the model's tokenizer: special-token strings become their ids.
    Tokenize(cmd::tokenize::Args),
}

fn main() -> ExitCode {
    quiet_mesa();
    memory::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` print as clap lays them out and succeed.
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("error: {}", cmd::options::one_line(&err));
            return ExitCode::FAILURE;
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", cmd::options::failure(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Adapters(args) => cmd::adapters::run(args),
        Command::Fetch(args) => cmd::fetch::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Head(args) => cmd::head::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Join(args) => cmd::join::run(args),
        Command::Mirror(args) => cmd::mirror::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Score(args) => cmd::score::run(args),
        Command::Tokenize(args) => cmd::tokenize::run(args),
    }
}

/// Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" on stderr when a headless
/// machine has none, which would break the one-line error contract; point it at the temp folder.
fn quiet_mesa() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: first thing in `main`, before any thread exists that could read the environment.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}
