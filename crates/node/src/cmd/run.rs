//! `node run`: one turn of generation, with the split of `--stages` played in one process — every hop
//! goes through the real `wire` encode/decode and `ring::route` (DESIGN.md §5). The answer streams to
//! stdout as it is produced (text), or the turn's report is printed as one JSON object (json).

use std::io::Write;
use std::ops::ControlFlow;
use std::time::Instant;

use anyhow::{Context, bail};
use daisy_engine::{
    LocalRing, Prompt, SplitRun, TurnReport, check_stages, generate_turn, load_stages, verify,
};
use daisy_tokenizer::Message as ChatMessage;
use daisy_wire::Plan;

use super::options::{ComputeArgs, FormatArgs, GenerateArgs, ResidencyArgs};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`.
    #[arg(long)]
    model: String,
    /// Raw prompt text; special-token strings in it become their ids.
    #[arg(long)]
    prompt: String,
    #[command(flatten)]
    generate: GenerateArgs,
    /// Layer count of each stage, head first (`10,10,10`); one number is the unsplit run.
    #[arg(long, value_delimiter = ',')]
    stages: Option<Vec<usize>>,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    residency: ResidencyArgs,
    /// Rerun the prompt unsplit on the head and compare the ids.
    #[arg(long)]
    verify: bool,
    #[command(flatten)]
    format: FormatArgs,
}

/// The prompt of `--prompt` (and `--chat`).
pub(crate) fn prompt(text: &str, chat: bool) -> Prompt {
    if chat {
        Prompt::Chat(vec![ChatMessage {
            role: "user".into(),
            content: text.to_string(),
        }])
    } else {
        Prompt::Raw(text.to_string())
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let opts = args.generate.turn_options();
    daisy_engine::check_max_resident(args.residency.max_resident_layers)?;
    opts.check()?;
    let t0 = Instant::now();
    let opened = super::open(&args.model)?;
    let n_layers = opened.config().num_layers;
    let counts = args.stages.clone().unwrap_or_else(|| vec![n_layers]);
    let plan =
        Plan::from_counts(&counts, n_layers).with_context(|| format!("--stages {counts:?}"))?;
    let prompt_ids = opened
        .encode(&prompt(&args.prompt, args.generate.chat))
        .context(if args.generate.chat {
            "--chat"
        } else {
            "--prompt"
        })?;
    // Everything is validated; only now is a backend set up (a GPU's gates take a moment).
    let chosen = super::backend(args.compute.backend)?;
    let precision = args.compute.precision;
    let max = args.residency.max_resident_layers;
    let stages =
        crate::memory::loading(|| load_stages(&opened, &plan, precision, &chosen.backend, max))?;
    if stages.iter().any(|s| s.is_streamed()) {
        crate::memory::streaming();
    }
    check_stages(&plan, &stages)?;
    let load_s = t0.elapsed().as_secs_f64();
    let load_peak = daisy_engine::peak_rss_bytes();
    eprintln!(
        "loaded {} stage(s) {:?} of {} in {load_s:.2}s; {} prompt tokens, {} path, {} precision",
        plan.len(),
        counts,
        args.model,
        prompt_ids.len(),
        opts.path.name(),
        precision.name()
    );
    let json = args.format.json();
    let mut ring = LocalRing::new(&plan, &stages, 1);
    let mut stdout = std::io::stdout().lock();
    let mut generated = generate_turn(
        &opened,
        &stages[0],
        &prompt_ids,
        &opts,
        None,
        &mut |p| ring.lap(p),
        &mut |t| {
            if !json {
                // A closed stdout is no reason to stop a turn; its error shows at the end.
                let _ = write!(stdout, "{}", t.text).and_then(|()| stdout.flush());
            }
            ControlFlow::Continue(())
        },
    )?;
    generated.timings.load_s = load_s;
    if !json {
        writeln!(stdout).context("writing the answer to stdout")?;
    }
    drop(stdout);
    if generated.json_complete == Some(false) {
        bail!(
            "json-output: the value is not complete after --max-new-tokens {}",
            opts.max_new_tokens
        );
    }

    let verified = if args.verify {
        let solo = (plan.len() == 1).then(|| &stages[0]);
        let report = verify(
            &opened,
            solo,
            precision,
            &chosen.backend,
            &prompt_ids,
            &opts,
            SplitRun {
                ids: &generated.generation.ids,
                hops: &ring.hops,
                history: &[],
                kept: 0,
            },
            max,
        )?;
        if !json || !report.matched {
            eprintln!("{}", report.summary());
        }
        Some(report)
    } else {
        None
    };
    let failed = verified.as_ref().is_some_and(|v| !v.matched);
    if let (false, Some(profile)) = (json, stages[0].backend().profile()) {
        eprintln!("backend {}: {profile}", stages[0].backend().name());
    }
    if json {
        let mut report = TurnReport::of(
            &opened,
            &plan,
            &stages[0],
            chosen.adapter,
            opts.path,
            prompt_ids,
            generated,
            &ring.hops,
            verified,
        );
        report.load_peak_rss_bytes = load_peak;
        println!("{}", serde_json::to_string(&report)?);
    }
    if failed {
        bail!("verify failed: the split run and the unsplit run on the head gave different ids");
    }
    Ok(())
}
