//! `node run`: one turn of generation, with the split of `--stages` played in one process — every hop
//! goes through the real `wire` encode/decode and `ring::route` (DESIGN.md §5).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use daisy_gemm_int8::Backend;
use daisy_loader::Checkpoint;
use daisy_model::{
    Config, GenerateOptions, JsonMask, Path, Precision, Sampling, Stage, generate_masked,
};
use daisy_tokenizer::{ChatTemplate, Message as ChatMessage, Tokenizer};
use daisy_wire::Plan;
pub(crate) use node::lap::LocalRing;
use serde_json::json;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local folder in Hugging Face layout, a `.gguf` file, or a repo id `org/name[@revision]`.
    #[arg(long)]
    model: String,
    /// Raw prompt text; special-token strings in it become their ids.
    #[arg(long)]
    prompt: String,
    /// Render the prompt as one user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Keep generating past an end-of-sequence id: exactly `--max-new-tokens` ids.
    #[arg(long)]
    ignore_eos: bool,
    /// 0 is greedy; above 0 each token position has its own draw from `--seed`.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// The sampling seed (used above temperature 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep the completion inside one JSON value: each token is chosen among the 40 most likely
    /// that continue it, and the turn ends when the value is complete.
    #[arg(long)]
    json_output: bool,
    /// Layer count of each stage, head first (`10,10,10`); one number is the unsplit run.
    #[arg(long, value_delimiter = ',')]
    stages: Option<Vec<usize>>,
    /// `int8` (every product through the verified GEMM) or `f32` (the reference).
    #[arg(long, default_value = "int8")]
    precision: String,
    /// `auto`, `full-window` or `cached`.
    #[arg(long, default_value = "auto")]
    path: String,
    /// `auto`, `cpu` or `gpu`.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Rerun the prompt unsplit on the head and compare the ids.
    #[arg(long)]
    verify: bool,
    /// `text` or `json` (one JSON object as the last line of stdout).
    #[arg(long, default_value = "text")]
    format: String,
}

/// A checkpoint opened and validated (config, every tensor header), its config and tokenizer.
pub(crate) struct Opened {
    pub(crate) checkpoint: Checkpoint,
    pub(crate) config: Config,
    pub(crate) tokenizer: Tokenizer,
}

/// Open `model` and validate everything before any computation.
pub(crate) fn open(model: &str) -> anyhow::Result<Opened> {
    let checkpoint = Checkpoint::open(model).with_context(|| format!("opening model {model}"))?;
    let config =
        Config::from_loader(checkpoint.config()).with_context(|| format!("model {model}"))?;
    checkpoint.check_values()?;
    let tokenizer = super::tokenize::load_tokenizer(&checkpoint)?;
    if tokenizer.vocab_size() > config.vocab_size {
        bail!(
            "tokenizer has {} tokens but the model's vocabulary is {}: expected at most the model's",
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    Ok(Opened {
        checkpoint,
        config,
        tokenizer,
    })
}

/// The backend `--backend` names, admitted by the exact gates: `gpu` never falls back, `auto` says on
/// stderr what it chose and why. Returns the backend and the wgpu adapter's name when it is the GPU.
pub(crate) fn backend(
    choice: daisy_wgsl::BackendChoice,
) -> anyhow::Result<(Arc<dyn Backend>, Option<String>)> {
    let selected = match choice {
        // Enumerate in a child process: a software rasterizer's driver never enters this one.
        daisy_wgsl::BackendChoice::Auto => match super::adapters::in_child() {
            Ok(list) => daisy_wgsl::select_auto(&list),
            // No child (e.g. the executable was replaced): enumerate here instead.
            Err(_) => daisy_wgsl::select(choice),
        },
        _ => daisy_wgsl::select(choice),
    }
    .with_context(|| format!("--backend {choice}"))?;
    if choice == daisy_wgsl::BackendChoice::Auto {
        eprintln!("{}", selected.reason);
    }
    Ok((selected.backend, selected.adapter))
}

/// `--backend`: auto, cpu or gpu.
pub(crate) fn parse_backend(name: &str) -> anyhow::Result<daisy_wgsl::BackendChoice> {
    name.parse()
        .with_context(|| format!("--backend `{name}`, expected auto, cpu or gpu"))
}

/// Load the stages of `plan` with `backend`.
pub(crate) fn load_stages(
    opened: &Opened,
    plan: &Plan,
    precision: Precision,
    backend: &Arc<dyn Backend>,
) -> anyhow::Result<Vec<Stage>> {
    plan.stages()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut stage = Stage::load(
                &opened.checkpoint,
                &opened.config,
                s.layers.clone(),
                i == 0,
                precision,
            )
            .with_context(|| format!("loading stage {i} (layers {:?})", s.layers))?;
            stage.set_backend(backend.clone());
            Ok(stage)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ranges(plan: &Plan) -> Vec<Range<usize>> {
    plan.stages().iter().map(|s| s.layers.clone()).collect()
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let json_format = super::json_format(&args.format)?;
    let precision = Precision::parse(&args.precision)?;
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!(
            "--temperature {}, expected a finite number at least 0",
            args.temperature
        );
    }
    let choice = parse_backend(&args.backend)?;
    let t0 = Instant::now();
    let opened = open(&args.model)?;
    let n_layers = opened.config.num_layers;
    let counts = args.stages.clone().unwrap_or_else(|| vec![n_layers]);
    let plan =
        Plan::from_counts(&counts, n_layers).with_context(|| format!("--stages {counts:?}"))?;
    let prompt_ids = if args.chat {
        let bytes = opened
            .checkpoint
            .tokenizer_config_json()?
            .context("--chat: the model has no tokenizer_config.json")?;
        let template = ChatTemplate::from_tokenizer_config(&bytes)?
            .context("--chat: the model's tokenizer_config.json has no chat_template")?;
        let rendered = template.render(
            &[ChatMessage {
                role: "user".into(),
                content: args.prompt.clone(),
            }],
            true,
        )?;
        opened.tokenizer.encode(&rendered, false)
    } else {
        opened.tokenizer.encode(&args.prompt, true)
    };
    if prompt_ids.is_empty() {
        bail!("the prompt encodes to no tokens, expected at least one");
    }
    let path = Path::resolve(&args.path, prompt_ids.len(), plan.len())?;
    // Everything is validated; only now is a backend set up (a GPU's gates take a moment).
    let (backend, adapter) = backend(choice)?;
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        eos_token_ids: opened.config_eos(),
        ignore_eos: args.ignore_eos,
        sampling: Sampling {
            temperature: args.temperature,
            seed: args.seed,
        },
        path,
    };
    let stages = load_stages(&opened, &plan, precision, &backend)?;
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "loaded {} stage(s) {:?} of {} in {load_s:.2}s; {} prompt tokens, {} path, {} precision",
        plan.len(),
        counts,
        args.model,
        prompt_ids.len(),
        path.name(),
        precision.name()
    );
    let t1 = Instant::now();
    let mut ring = LocalRing::new(&plan, &stages, 1);
    // The passes before the first token: the whole window, or every prefill chunk.
    let prefill_laps = match path {
        Path::FullWindow => 1,
        Path::Cached => daisy_model::prefill_chunks(prompt_ids.len()).len(),
    };
    let mut prefill_s = 0.0;
    let new_mask = || {
        args.json_output.then(|| {
            let vocab = opened.config.vocab_size.max(opened.tokenizer.vocab_size());
            JsonMask::new(
                (0..vocab as u32)
                    .map(|id| opened.tokenizer.token_bytes(id))
                    .collect(),
            )
        })
    };
    let mut mask = new_mask();
    let generation = generate_masked(&stages[0], &prompt_ids, &opts, mask.as_mut(), &mut |p| {
        let lap = p.lap;
        let out = ring.lap(p);
        if lap + 1 == prefill_laps {
            prefill_s = t1.elapsed().as_secs_f64();
        }
        out
    })?;
    let generate_s = t1.elapsed().as_secs_f64();
    let decode_tokens = generation.ids.len().saturating_sub(1);
    let text = opened.tokenizer.decode(&generation.ids, true)?;
    let json_complete = mask.as_ref().map(JsonMask::complete);
    if json_complete == Some(false) {
        eprintln!(
            "json-output: the value is not complete after --max-new-tokens {}",
            args.max_new_tokens
        );
    }

    let mut verify = serde_json::Value::Null;
    let mut verify_failed = None;
    if args.verify {
        let single = Plan::single(n_layers)?;
        let solo = if plan.len() == 1 {
            None
        } else {
            Some(load_stages(&opened, &single, precision, &backend)?)
        };
        let solo_stages = solo.as_deref().unwrap_or(&stages);
        let mut solo_ring = LocalRing::new(&single, solo_stages, 2);
        let mut solo_mask = new_mask();
        let again = generate_masked(
            &solo_stages[0],
            &prompt_ids,
            &opts,
            solo_mask.as_mut(),
            &mut |p| solo_ring.lap(p),
        )?;
        let equal = again.ids == generation.ids;
        if equal && !json_format {
            eprintln!(
                "verify: the unsplit run on the head gave the same {} ids",
                again.ids.len()
            );
        }
        if !equal {
            verify_failed = Some(format!(
                "verify failed: the split run gave ids {:?}, the unsplit run on the head {:?}",
                generation.ids, again.ids
            ));
        }
        verify = json!({ "ids_equal": equal, "ids": again.ids, "path": path.name() });
    }

    if json_format {
        let hops: Vec<_> = ring
            .hops
            .iter()
            .enumerate()
            .map(|(i, h)| json!({ "hop": i, "after_layer": h.after_layer, "sha256": hex(&h.sha256) }))
            .collect();
        let plan_json: Vec<_> = ranges(&plan)
            .iter()
            .map(|r| json!([r.start, r.end]))
            .collect();
        let out = json!({
            "prompt_ids": prompt_ids,
            "ids": generation.ids,
            "text": text,
            "plan": plan_json,
            "stages": counts,
            "fingerprint": hex(&stages[0].fingerprint()),
            "backend": { "name": stages[0].backend().name(), "adapter": adapter },
            "precision": precision.name(),
            "path": path.name(),
            "hops": hops,
            "laps": generation.laps,
            "verify": verify,
            "json_complete": json_complete,
            "timings": {
                "load_s": load_s,
                "generate_s": generate_s,
                "tokens_per_s": generation.ids.len() as f64 / generate_s.max(1e-9),
                "prefill_s": prefill_s,
                "prefill_tokens_per_s": prompt_ids.len() as f64 / prefill_s.max(1e-9),
                "decode_s": generate_s - prefill_s,
                "decode_tokens_per_s": decode_tokens as f64 / (generate_s - prefill_s).max(1e-9),
            },
            "params": opened.config.num_params(),
            "peak_rss_bytes": peak_rss_bytes(),
        });
        println!("{out}");
    } else {
        println!("{text}");
    }
    if let Some(msg) = verify_failed {
        bail!(msg);
    }
    Ok(())
}

impl Opened {
    /// End-of-sequence ids from the config (and the tokenizer's `eos_token` if the config has none).
    pub(crate) fn config_eos(&self) -> Vec<u32> {
        self.checkpoint.config().eos_token_ids.clone()
    }
}

/// Read a file as UTF-8 text, refusing invalid bytes.
pub(crate) fn read_text(path: &PathBuf) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not valid UTF-8 (first invalid byte at offset {}): expected UTF-8 text",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Peak resident set size of this process (`VmHWM`), when the platform reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
