//! A turn, driven from the head: generation through any lap (in one process or around a networked
//! ring), each token reported as it is produced and the turn cancellable between tokens; Verify; and
//! the typed report `node run --format json` prints.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use daisy_gemm_int8::Backend;
use daisy_model::{
    ForwardPath, GenerateOptions, Generation, JsonMask, Pass, Precision, Resume, Sampling, Stage,
    generate_streaming, prefill_chunks, rebuild,
};
use daisy_wire::Plan;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::lap::{Hop, LocalRing};
use crate::open::Opened;
use crate::stages::{MaxResident, load_stages};

/// `--path`: which forward path a generation takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PathChoice {
    /// The cached path whenever it applies — every generation, on any number of stages — so a split
    /// and an unsplit run of the same request give the same ids by default.
    #[default]
    Auto,
    /// Every token re-runs the whole window (no KV cache).
    FullWindow,
    /// Chunked prefill by prompt length, per-stage KV, one token per pass.
    Cached,
}

impl PathChoice {
    /// The path a generation takes. It depends on the request only, never on the number of stages
    /// or devices; both paths apply to every prompt, so `auto` is the cached one.
    pub fn resolve(self) -> ForwardPath {
        match self {
            Self::Auto | Self::Cached => ForwardPath::Cached,
            Self::FullWindow => ForwardPath::FullWindow,
        }
    }
}

/// What a turn needs besides the prompt.
#[derive(Clone, Debug)]
pub struct TurnOptions {
    pub max_new_tokens: usize,
    pub ignore_eos: bool,
    pub sampling: Sampling,
    pub path: ForwardPath,
    /// Keep the completion inside one JSON object or array (the JSON mask).
    pub json_output: bool,
    /// Lookahead: at most this many drafted tokens scored with each next token (0 is off).
    pub lookahead: usize,
}

/// How many drafts `--lookahead on` scores with each next token.
pub const LOOKAHEAD_DRAFTS: usize = 8;

impl TurnOptions {
    /// Refused when the temperature is negative or not finite, or `top_p` is not in (0, 1].
    pub fn check(&self) -> Result<()> {
        let t = self.sampling.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::Invalid(format!(
                "temperature {t}, expected a finite number at least 0"
            )));
        }
        let p = self.sampling.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::Invalid(format!(
                "top_p {p}, expected a number above 0 and at most 1"
            )));
        }
        Ok(())
    }

    fn generate_options(&self, eos_token_ids: &[u32]) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            eos_token_ids: eos_token_ids.to_vec(),
            ignore_eos: self.ignore_eos,
            sampling: self.sampling,
            path: self.path,
            lookahead: self.lookahead,
        }
    }
}

/// One generated token, as the turn reports it.
#[derive(Clone, Debug)]
pub struct TokenEvent<'a> {
    /// Its position among the generated tokens (0 is the first).
    pub index: usize,
    pub id: u32,
    /// The text it adds to the answer (empty while a multi-byte character is incomplete).
    pub text: &'a str,
}

/// A finished generation with its timings.
#[derive(Clone, Debug)]
pub struct Generated {
    pub generation: Generation,
    pub text: String,
    /// `Some(false)` when the JSON mask was on and the value is not complete.
    pub json_complete: Option<bool>,
    pub timings: Timings,
}

/// Where the time of a turn went.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Timings {
    pub load_s: f64,
    pub generate_s: f64,
    pub tokens_per_s: f64,
    pub prefill_s: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_s: f64,
    pub decode_tokens_per_s: f64,
}

/// Decodes ids incrementally: byte-level decoding is the concatenation of each token's bytes, so
/// only the ids not yet shown are decoded, and they are held back while they end inside a character.
/// An id the tokenizer does not define adds no text (as `tokenizers` decodes it), said once a turn.
struct TextStream<'a> {
    opened: &'a Opened,
    count: usize,
    pending: Vec<u32>,
    /// An id without text has been reported this turn.
    noted: bool,
}

impl TextStream<'_> {
    fn push(&mut self, id: u32) -> String {
        self.count += 1;
        let tokenizer = &self.opened.tokenizer;
        if !self.noted && tokenizer.id_to_token(id).is_none() {
            self.noted = true;
            crate::note(format_args!(
                "the model generated token id {id}, which its tokenizer does not define \
                 ({} ids; the model's vocabulary has {} rows): it adds no text",
                tokenizer.vocab_size(),
                self.opened.config().vocab_size
            ));
        }
        self.pending.push(id);
        let text = tokenizer.decode_generated(&self.pending, true);
        if text.ends_with('\u{fffd}') {
            return String::new();
        }
        self.pending.clear();
        text
    }
}

/// Generate from `prompt_ids` with `head` driving and `lap` carrying each pass around the rest of
/// the ring. `on_token` sees every token as it is produced; `ControlFlow::Break` cancels the turn
/// between two tokens.
///
/// With `resume`, the turn continues keys the stages hold (a chat's next turn, cached path).
pub fn generate_turn(
    opened: &Opened,
    head: &Stage,
    prompt_ids: &[u32],
    opts: &TurnOptions,
    resume: Option<Resume<'_>>,
    lap: &mut dyn FnMut(Pass) -> Result<Vec<f32>>,
    on_token: &mut dyn FnMut(TokenEvent<'_>) -> ControlFlow<()>,
) -> Result<Generated> {
    opts.check()?;
    let gen_opts = opts.generate_options(opened.eos_token_ids());
    let mut mask = opts
        .json_output
        .then(|| JsonMask::new(opened.token_table()));
    let kept = resume.as_ref().map_or(0, |r| r.kept);
    let prefill_laps = match opts.path {
        ForwardPath::FullWindow => 1,
        ForwardPath::Cached => prefill_chunks(prompt_ids.len().saturating_sub(kept)).len(),
    };
    let t0 = Instant::now();
    let mut prefill_s = 0.0;
    let mut stream = TextStream {
        opened,
        count: 0,
        pending: Vec::new(),
        noted: false,
    };
    let generation = generate_streaming(
        head,
        prompt_ids,
        &gen_opts,
        mask.as_mut(),
        resume,
        &mut |p| {
            let n = p.lap;
            let out = lap(p);
            if n + 1 == prefill_laps {
                prefill_s = t0.elapsed().as_secs_f64();
            }
            out
        },
        &mut |id| {
            let index = stream.count;
            let text = stream.push(id);
            on_token(TokenEvent {
                index,
                id,
                text: &text,
            })
        },
    )?;
    let generate_s = t0.elapsed().as_secs_f64();
    let decode_tokens = generation.ids.len().saturating_sub(1);
    let text = opened.tokenizer.decode_generated(&generation.ids, true);
    Ok(Generated {
        text,
        json_complete: mask.as_ref().map(JsonMask::complete),
        timings: Timings {
            load_s: 0.0,
            generate_s,
            tokens_per_s: generation.ids.len() as f64 / generate_s.max(1e-9),
            prefill_s,
            prefill_tokens_per_s: (prompt_ids.len() - kept) as f64 / prefill_s.max(1e-9),
            decode_s: generate_s - prefill_s,
            decode_tokens_per_s: decode_tokens as f64 / (generate_s - prefill_s).max(1e-9),
        },
        generation,
    })
}

/// Verify's answer: the head's own run of the same request with every layer, compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// The ids are the same.
    #[serde(rename = "match")]
    pub matched: bool,
    /// Kept for readers of the earlier name.
    pub ids_equal: bool,
    /// The unsplit run's ids.
    pub ids: Vec<u32>,
    pub path: &'static str,
    /// The first generated position where the two runs differ, with both ids there (`None` past
    /// the end of the shorter run).
    pub first_difference: Option<Difference>,
    /// The layer boundaries of the first lap both runs have a hop at, whose hashes were compared.
    pub hops_compared: Vec<usize>,
    /// The layer after which a compared hop's hash differs, when one does.
    pub hop_difference: Option<usize>,
}

/// Where two runs first differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub position: usize,
    pub split: Option<u32>,
    pub unsplit: Option<u32>,
}

impl VerifyReport {
    fn compare(
        split: &[u32],
        unsplit: Vec<u32>,
        path: ForwardPath,
        split_hops: &[Hop],
        unsplit_hops: &[Hop],
    ) -> Self {
        let pairs: Vec<(&Hop, &Hop)> = split_hops
            .iter()
            .filter_map(|a| {
                unsplit_hops
                    .iter()
                    .find(|b| b.after_layer == a.after_layer)
                    .map(|b| (a, b))
            })
            .collect();
        let hop_difference = pairs
            .iter()
            .find(|(a, b)| a.sha256 != b.sha256)
            .map(|(a, _)| a.after_layer);
        let first_difference = (0..split.len().max(unsplit.len()))
            .find(|&i| split.get(i) != unsplit.get(i))
            .map(|position| Difference {
                position,
                split: split.get(position).copied(),
                unsplit: unsplit.get(position).copied(),
            });
        let ids_equal = first_difference.is_none();
        Self {
            matched: ids_equal && hop_difference.is_none(),
            ids_equal,
            ids: unsplit,
            path: path.name(),
            first_difference,
            hops_compared: pairs.iter().map(|(a, _)| a.after_layer).collect(),
            hop_difference,
        }
    }

    /// One line for a person: a match, or the first position that differs and both ids.
    pub fn summary(&self) -> String {
        if let (None, Some(layer)) = (&self.first_difference, self.hop_difference) {
            return format!(
                "verify failed: the same ids, but the hidden state after layer {layer} differs \
                 from the unsplit run's"
            );
        }
        match &self.first_difference {
            None => format!(
                "verify: the unsplit run on the head gave the same {} ids{}",
                self.ids.len(),
                match self.hops_compared.as_slice() {
                    [] => String::new(),
                    layers => format!(
                        " and the same hidden state after layer {}",
                        layers
                            .iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            ),
            Some(d) => format!(
                "verify failed: the split and the unsplit run first differ at generated token {} \
                 (split {}, unsplit {})",
                d.position,
                d.split.map_or("none".to_string(), |i| i.to_string()),
                d.unsplit.map_or("none".to_string(), |i| i.to_string()),
            ),
        }
    }
}

/// What the split run Verify checks produced: its generated ids and the hops of its first lap;
/// for a turn that continued a conversation's keys, the passes that rebuild them and how many
/// prompt positions it kept.
#[derive(Clone, Copy, Debug)]
pub struct SplitRun<'a> {
    pub ids: &'a [u32],
    pub hops: &'a [Hop],
    pub history: &'a [(usize, Vec<u32>)],
    pub kept: usize,
}

/// Re-run the request with every layer on the head (the same path and chunks) and compare its ids
/// with `split.ids`, and the hash of each hop of `split.hops` (the split run's first lap) with the unsplit
/// run's at the same layer boundary (the last stage's output, at least). `solo` is the head's
/// unsplit stage when one is loaded already; otherwise the whole model is loaded here, its layers
/// streamed from their shard (two live at a time) when there are more than `max`.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    opened: &Opened,
    solo: Option<&Stage>,
    precision: Precision,
    backend: &Arc<dyn Backend>,
    prompt_ids: &[u32],
    opts: &TurnOptions,
    split: SplitRun<'_>,
    max: MaxResident,
) -> Result<VerifyReport> {
    let single = Plan::single(opened.config().num_layers)?;
    let loaded;
    let stages: &[Stage] = match solo {
        Some(stage) => std::slice::from_ref(stage),
        None => {
            loaded = load_stages(opened, &single, precision, backend, max)?;
            &loaded
        }
    };
    let mut ring = LocalRing::new(&single, stages, 2);
    // A continued turn: the conversation's earlier passes first, from empty caches.
    let mut cache = stages[0].new_cache();
    rebuild(&stages[0], &mut cache, split.history, 1, &mut |p| {
        ring.lap(p)
    })?;
    ring.hops.clear();
    let again = generate_turn(
        opened,
        &stages[0],
        prompt_ids,
        opts,
        (split.kept > 0).then_some(Resume {
            cache: &mut cache,
            kept: split.kept,
        }),
        &mut |p| ring.lap(p),
        &mut |_| ControlFlow::Continue(()),
    )?;
    Ok(VerifyReport::compare(
        split.ids,
        again.generation.ids,
        opts.path,
        split.hops,
        &ring.hops,
    ))
}

/// One hop of the report, its hash in hex.
#[derive(Clone, Debug, Serialize)]
pub struct HopReport {
    pub hop: usize,
    pub after_layer: usize,
    pub sha256: String,
}

impl HopReport {
    pub fn list(hops: &[Hop]) -> Vec<Self> {
        hops.iter()
            .enumerate()
            .map(|(hop, h)| Self {
                hop,
                after_layer: h.after_layer,
                sha256: hex::encode(h.sha256),
            })
            .collect()
    }
}

/// The backend of a run.
#[derive(Clone, Debug, Serialize)]
pub struct BackendReport {
    pub name: String,
    pub adapter: Option<String>,
    /// A device backend's dispatches, waits and copies over the run (GPU only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Everything one turn produced, as `--format json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct TurnReport {
    pub prompt_ids: Vec<u32>,
    /// Generated ids only.
    pub ids: Vec<u32>,
    pub text: String,
    /// Each stage's layers `[start, end)`, head first.
    pub plan: Vec<[usize; 2]>,
    /// Each stage's layer count, head first.
    pub stages: Vec<usize>,
    pub fingerprint: String,
    pub backend: BackendReport,
    pub precision: &'static str,
    pub path: &'static str,
    pub hops: Vec<HopReport>,
    pub laps: usize,
    /// Lookahead: tokens drafted, and how many of them the model chose.
    pub drafted: usize,
    pub accepted: usize,
    pub cancelled: bool,
    pub verify: Option<VerifyReport>,
    pub json_complete: Option<bool>,
    pub timings: Timings,
    pub params: usize,
    /// The process's peak resident memory so far (`VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// The peak when loading had ended (`node run` and the ring's head set it: load and turn are
    /// then told apart).
    pub load_peak_rss_bytes: Option<u64>,
    /// Resident memory when the turn ended (`VmRSS`): the steady state.
    pub rss_bytes: Option<u64>,
}

impl TurnReport {
    /// The report of a finished turn that `head` drove over `plan` on `path`: `hops` are its first
    /// lap's, `verify` Verify's answer when it ran, `adapter` the backend's wgpu adapter.
    #[allow(clippy::too_many_arguments)]
    pub fn of(
        opened: &Opened,
        plan: &Plan,
        head: &Stage,
        adapter: Option<String>,
        path: ForwardPath,
        prompt_ids: Vec<u32>,
        generated: Generated,
        hops: &[Hop],
        verify: Option<VerifyReport>,
    ) -> Self {
        Self {
            prompt_ids,
            ids: generated.generation.ids,
            text: generated.text,
            plan: plan_ranges(plan),
            stages: plan.stages().iter().map(|s| s.len()).collect(),
            fingerprint: hex::encode(head.fingerprint()),
            backend: BackendReport {
                name: head.backend().name().to_string(),
                adapter,
                profile: head.backend().profile(),
            },
            precision: head.precision().name(),
            path: path.name(),
            hops: HopReport::list(hops),
            laps: generated.generation.laps,
            drafted: generated.generation.drafted,
            accepted: generated.generation.accepted,
            cancelled: generated.generation.cancelled,
            verify,
            json_complete: generated.json_complete,
            timings: generated.timings,
            params: opened.config().num_params(),
            peak_rss_bytes: peak_rss_bytes(),
            load_peak_rss_bytes: None,
            rss_bytes: rss_bytes(),
        }
    }
}

/// Each stage's layers `[start, end)`, head first.
pub fn plan_ranges(plan: &Plan) -> Vec<[usize; 2]> {
    plan.stages()
        .iter()
        .map(|s| [s.layers.start, s.layers.end])
        .collect()
}

/// Peak resident set size of this process (`VmHWM`), when the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Resident set size of this process now (`VmRSS`), when the platform reports it.
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A `kB` line of `/proc/self/status`, in bytes.
fn status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(after_layer: usize, byte: u8) -> Hop {
        Hop {
            after_layer,
            sha256: [byte; 32],
        }
    }

    #[test]
    fn verify_compares_the_hops_both_runs_have() {
        let split = [hop(10, 1), hop(20, 2), hop(30, 3)];
        let same = VerifyReport::compare(
            &[5, 6],
            vec![5, 6],
            ForwardPath::Cached,
            &split,
            &[hop(30, 3)],
        );
        assert!(same.matched);
        assert_eq!(
            (same.hops_compared.clone(), same.hop_difference),
            (vec![30], None)
        );
        assert!(
            same.summary()
                .ends_with("the same hidden state after layer 30"),
            "{}",
            same.summary()
        );
        // The mutation: the same ids but another final hidden state is not a match.
        let other = VerifyReport::compare(
            &[5, 6],
            vec![5, 6],
            ForwardPath::Cached,
            &split,
            &[hop(30, 4)],
        );
        assert!(!other.matched && other.ids_equal);
        assert_eq!(other.hop_difference, Some(30));
        assert!(
            other.summary().contains("after layer 30 differs"),
            "{}",
            other.summary()
        );
        let ids = VerifyReport::compare(
            &[5, 6],
            vec![5, 7],
            ForwardPath::Cached,
            &split,
            &[hop(30, 3)],
        );
        assert!(!ids.matched);
        assert_eq!(ids.first_difference.as_ref().map(|d| d.position), Some(1));
    }
}
