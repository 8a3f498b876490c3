//! The options several subcommands share, defined once as clap types and flattened into each.

use daisy_engine::{BackendChoice, LOOKAHEAD_DRAFTS, PathChoice, Precision, Sampling, TurnOptions};

/// `--format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Readable text on stdout.
    #[default]
    Text,
    /// One JSON object as the last line of stdout (logs and progress go to stderr).
    Json,
}

/// `--format text|json`.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct FormatArgs {
    /// `text`, or `json`: one JSON object as the last line of stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub(crate) format: Format,
}

impl FormatArgs {
    pub(crate) fn json(self) -> bool {
        self.format == Format::Json
    }
}

/// How the products of a run are computed.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct ComputeArgs {
    /// `int8`: every product through the verified GEMM (the product); `int8x2`: every operand as two
    /// int8 planes, answers within a hair of f32's for about 3x the int8 work and 2x its weight
    /// memory; `f32`: the reference. The head's choice holds for the whole ring.
    #[arg(long, value_enum, default_value_t = Precision::Int8)]
    pub(crate) precision: Precision,
    /// `auto` takes the faster of the CPU kernels and a hardware GPU by measured GEMM rate (and says
    /// so on stderr); `gpu` uses a wgpu adapter that passed the exact gates or fails; `cpu`.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub(crate) backend: BackendChoice,
}

/// The precision as an assignment carries it to a member.
pub(crate) fn weights_of(precision: Precision) -> daisy_wire::Weights {
    match precision {
        Precision::Int8 => daisy_wire::Weights::Int8,
        Precision::F32 => daisy_wire::Weights::F32,
        Precision::Int8x2 => daisy_wire::Weights::Int8x2,
    }
}

/// The precision an assignment asks a member for.
pub(crate) fn precision_of(weights: daisy_wire::Weights) -> Precision {
    match weights {
        daisy_wire::Weights::Int8 => Precision::Int8,
        daisy_wire::Weights::F32 => Precision::F32,
        daisy_wire::Weights::Int8x2 => Precision::Int8x2,
    }
}

/// The command-line spelling of a clap value.
fn value_name(v: &impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

impl ComputeArgs {
    /// These options as command-line arguments, for a child process.
    pub(crate) fn to_args(self) -> Vec<String> {
        let mut args = vec!["--precision".to_string(), value_name(&self.precision)];
        args.extend(self.backend_args());
        args
    }

    /// `--backend` alone (a member takes its precision from the head's assignment).
    pub(crate) fn backend_args(self) -> Vec<String> {
        vec!["--backend".to_string(), value_name(&self.backend)]
    }
}

/// How much of a stage stays in memory (`run`, `head`, `join`).
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct ResidencyArgs {
    /// Hold at most N of a stage's layers in memory (at least 2): a stage with more streams them
    /// from its flat shard in the cache folder (written on the first load, used as it is after),
    /// two unpacked at a time — the same bits, for a stage whose layers do not fit in RAM.
    #[arg(long, value_name = "N")]
    pub(crate) max_resident_layers: Option<usize>,
}

/// Whether a ring stage keeps its layers for the next start (`head`, `join`).
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct KeepArgs {
    /// Keep this stage's int8 layers (two or more, resident) as a flat shard in the cache folder
    /// after loading them, and read it on the next start of the same layers of the same model:
    /// ready without fetching or quantizing them again. `off` neither reads nor writes one.
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
    pub(crate) keep_layers: Switch,
}

impl KeepArgs {
    pub(crate) fn on(&self) -> bool {
        self.keep_layers == Switch::On
    }
}

/// The generation options of a turn (`run`, `demo`).
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// Render the prompt as one user message with the model's chat template.
    #[arg(long)]
    pub(crate) chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub(crate) max_new_tokens: usize,
    /// Keep generating past an end-of-sequence id: exactly `--max-new-tokens` ids.
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// 0 is greedy; above 0 each token position has its own draw from `--seed`.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// The sampling seed (used above temperature 0).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Draw only among the most likely tokens whose probabilities add up to this (above temperature
    /// 0); 1 keeps every token.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,
    /// Keep the completion inside one JSON object or array: each token is chosen among the 40 most
    /// likely that continue it, and the turn ends when the value is complete.
    #[arg(long)]
    pub(crate) json_output: bool,
    /// `auto` is the cached path for every generation, on any number of stages, so a split and an
    /// unsplit run give the same ids; `full-window` re-runs the whole window for every token.
    #[arg(long, value_enum, default_value_t = PathChoice::Auto)]
    pub(crate) path: PathChoice,
    /// `on`: when the context's last 3, 2 or 1 tokens occurred earlier, the tokens that followed
    /// them (up to 8) are drafted and scored in the same lap as the next token, and those the model
    /// itself chooses are kept — several tokens per lap on repetitive text. Its own deterministic
    /// path: split-invariant and replayed by Verify, not bit-equal to `off`.
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    pub(crate) lookahead: Switch,
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Switch {
    On,
    Off,
}

impl GenerateArgs {
    /// These options as command-line arguments, for a child process.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--max-new-tokens".to_string(),
            self.max_new_tokens.to_string(),
            "--temperature".to_string(),
            self.temperature.to_string(),
            "--seed".to_string(),
            self.seed.to_string(),
            "--top-p".to_string(),
            self.top_p.to_string(),
            "--path".to_string(),
            value_name(&self.path),
            "--lookahead".to_string(),
            value_name(&self.lookahead),
        ];
        for (on, flag) in [
            (self.chat, "--chat"),
            (self.ignore_eos, "--ignore-eos"),
            (self.json_output, "--json-output"),
        ] {
            if on {
                args.push(flag.to_string());
            }
        }
        args
    }

    pub(crate) fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            max_new_tokens: self.max_new_tokens,
            ignore_eos: self.ignore_eos,
            sampling: Sampling {
                temperature: self.temperature,
                seed: self.seed,
                top_p: self.top_p,
            },
            path: self.path.resolve(),
            json_output: self.json_output,
            lookahead: match self.lookahead {
                Switch::On => LOOKAHEAD_DRAFTS,
                Switch::Off => 0,
            },
        }
    }
}

/// One line for a command-line error clap found (an unknown value, a missing argument), in the
/// form every other refusal takes: `--backend `tpu`, expected auto, cpu or gpu`.
pub(crate) fn one_line(err: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let get = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => Some(v.join(", ")),
        _ => None,
    };
    if err.kind() == clap::error::ErrorKind::InvalidValue
        && let (Some(arg), Some(value)) =
            (get(ContextKind::InvalidArg), get(ContextKind::InvalidValue))
    {
        let arg = arg.split_whitespace().next().unwrap_or(&arg).to_string();
        let expected = match err.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(v)) if !v.is_empty() => {
                let (last, rest) = v.split_last().expect("not empty");
                if rest.is_empty() {
                    last.clone()
                } else {
                    format!("{} or {last}", rest.join(", "))
                }
            }
            _ => "a valid value".to_string(),
        };
        return format!("{arg} `{value}`, expected {expected}");
    }
    let rendered = err.to_string();
    let first = rendered.lines().next().unwrap_or("invalid command line");
    first.trim_start_matches("error: ").to_string()
}

/// A failure and its causes on one line, as `{:#}` writes them, less any cause that only repeats
/// the end of what comes before it: some errors print their source inside their own message
/// (`IO error: Connection refused (os error 111)`, whose source is `Connection refused (os error
/// 111)`), which `{:#}` would then say twice.
pub(crate) fn failure(err: &anyhow::Error) -> String {
    said(err.chain())
}

/// [`failure`] for an error of another kind than `anyhow`'s.
pub(crate) fn failure_of(err: &(dyn std::error::Error + 'static)) -> String {
    said(anyhow::Chain::new(err))
}

fn said(chain: anyhow::Chain<'_>) -> String {
    let mut line = String::new();
    for cause in chain {
        let said = cause.to_string();
        if said.is_empty() || line.ends_with(&said) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&said);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::{failure, failure_of};

    /// An error that prints its source inside its own message, as a WebSocket client's I/O
    /// error does.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "IO error: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_failure_says_each_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused (111)");
        let err = anyhow::Error::new(Wrapping(refused)).context("could not reach the head");
        assert_eq!(
            format!("{err:#}"),
            "could not reach the head: IO error: refused (111): refused (111)"
        );
        assert_eq!(
            failure(&err),
            "could not reach the head: IO error: refused (111)"
        );
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused (111)");
        assert_eq!(failure_of(&Wrapping(refused)), "IO error: refused (111)");
        // Causes that do not repeat each other all stay, in order.
        let err = anyhow::anyhow!("the shard is short")
            .context("reading layer 3")
            .context("loading the stage");
        assert_eq!(
            failure(&err),
            "loading the stage: reading layer 3: the shard is short"
        );
    }
}
