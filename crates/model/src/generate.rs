//! Driving a turn from the head: the full-window and cached paths (DESIGN.md §3 "Paths"), greedy or
//! seeded decoding, and scoring. The rest of the ring is a callback, so this module knows nothing
//! about how a hidden state reaches the other stages.

use std::ops::ControlFlow;

use crate::block::StageCache;
use crate::json::{JSON_TOP_K, JsonMask, top_k};
use crate::sample::{Sampling, argmax, pick, prefill_chunks, top2_margin};
use crate::stage::Stage;
use crate::{Error, Result};

/// Which forward path a turn takes (DESIGN §3 Paths). Both are split-invariant; they are not equal
/// to each other, because V's scales cover every key present in a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ForwardPath {
    /// Every token re-runs the whole window; no KV cache.
    FullWindow,
    /// Chunked prefill (by prompt length only), per-stage KV, then one token per pass.
    Cached,
}

impl ForwardPath {
    pub fn name(self) -> &'static str {
        match self {
            Self::FullWindow => "full-window",
            Self::Cached => "cached",
        }
    }
}

/// One pass handed to the rest of the ring: the head's output for `rows` rows at `pos0..`.
#[derive(Debug)]
pub struct Pass {
    pub hidden: Vec<f32>,
    pub rows: usize,
    pub pos0: usize,
    /// On the cached path each stage continues its own KV cache; `pos0 == 0` starts a new one.
    pub cached: bool,
    /// Index of this lap within the turn (0 is the first).
    pub lap: usize,
    /// Whether the head uses what this lap returns. A prefill chunk other than the last is run for
    /// the stages' KV only: its lap may return nothing, so a ring can send the next chunk before
    /// this one is back.
    pub wanted: bool,
}

/// What a turn needs besides the prompt.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub eos_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub sampling: Sampling,
    pub path: ForwardPath,
    /// Lookahead (prompt lookup): at most this many drafted tokens scored with each next token
    /// (0 is off; see [`drafts`]).
    pub lookahead: usize,
}

/// A finished turn.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The turn stopped because `on_token` asked it to, between two tokens.
    pub cancelled: bool,
    /// Generated ids only (an end-of-sequence id that stopped the turn included).
    pub ids: Vec<u32>,
    /// Laps run.
    pub laps: usize,
    /// Top-1/top-2 logit margin at each generated step.
    pub margins: Vec<f32>,
    /// The logits of the first generated step.
    pub first_logits: Vec<f32>,
    /// Lookahead: drafted tokens sent with a next token, and how many of them the model chose.
    pub drafted: usize,
    pub accepted: usize,
    /// The cached path's passes, in order: each one's first position and the ids it carried
    /// (drafts included). Replaying them from empty caches rebuilds the keys every stage holds.
    pub passes: Vec<(usize, Vec<u32>)>,
}

/// Where a cached-path turn starts when it continues keys the stages hold already (a chat's next
/// turn): the head stage's own cache, and how many leading prompt positions it keeps.
pub struct Resume<'a> {
    pub cache: &'a mut StageCache,
    pub kept: usize,
}

/// The longest and shortest context suffix lookahead looks up. One token alone is not looked up:
/// on plain chat text such drafts were rejected 278 times in 283 and cost a 9-row pass each.
const DRAFT_MAX_NGRAM: usize = 3;
const DRAFT_MIN_NGRAM: usize = 2;

/// Lookahead's drafts after `ids` (DESIGN §3 Paths): for n = 3, then 2, when the last n ids occurred
/// earlier, the `k` ids that followed their latest earlier occurrence, read on through the drafts
/// themselves where they pass the end of `ids` (so a repeating pattern drafts its next `k`); none
/// when no such n-gram repeats.
pub fn drafts(ids: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let len = ids.len();
    for n in (DRAFT_MIN_NGRAM..=DRAFT_MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let suffix = &ids[len - n..];
        if let Some(i) = (0..len - n).rev().find(|&i| &ids[i..i + n] == suffix) {
            let from = i + n;
            let mut out: Vec<u32> = Vec::with_capacity(k);
            for j in 0..k {
                let at = from + j;
                out.push(if at < len { ids[at] } else { out[at - len] });
            }
            return out;
        }
    }
    Vec::new()
}

/// Run one turn from the head. `lap` carries each pass through the other stages and back.
pub fn generate<E: From<Error>>(
    head: &Stage,
    prompt: &[u32],
    opts: &GenerateOptions,
    lap: &mut dyn FnMut(Pass) -> Result<Vec<f32>, E>,
) -> Result<Generation, E> {
    generate_streaming(head, prompt, opts, None, None, lap, &mut |_| {
        ControlFlow::Continue(())
    })
}

/// The next token from one row of logits at sequence position `position`, under the JSON mask
/// when there is one (the mask then accepts it).
fn choose(
    logits: &[f32],
    sampling: Sampling,
    position: usize,
    generated: usize,
    mask: Option<&mut JsonMask>,
) -> Result<u32> {
    let Some(m) = mask else {
        return Ok(pick(logits, sampling, position));
    };
    let allowed: Vec<u32> = top_k(logits, JSON_TOP_K)
        .into_iter()
        .filter(|&id| m.allows(id))
        .collect();
    let Some(&best) = allowed.first() else {
        return Err(Error::Invalid(format!(
            "JSON output: none of the {JSON_TOP_K} most likely tokens continues a JSON \
             object or array at generated token {} (ask for JSON in the prompt)",
            generated + 1
        )));
    };
    let next = if sampling.temperature > 0.0 {
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        for &id in &allowed {
            masked[id as usize] = logits[id as usize];
        }
        pick(&masked, sampling, position)
    } else {
        best
    };
    m.accept(next);
    Ok(next)
}

/// [`generate`], reporting each token to `on_token` as it is produced; `ControlFlow::Break` stops
/// the turn there (between two tokens). With `mask`, the JSON mask: each token is chosen among the
/// [`JSON_TOP_K`] most likely that keep the completion a prefix of one JSON value (greedy: the most
/// likely of them; sampled: drawn from them alone), and the turn ends when the value is complete.
/// The logits are masked after the lm_head, so no hidden state changes.
///
/// With lookahead, each decode pass carries the next token's row and the rows of its drafts; the
/// tokens chosen at those rows are kept while each equals the draft that follows it, plus the first
/// that does not (a choice at a row depends only on that row's logits and position, so the JSON
/// mask and the position-seeded draw apply row after row). On the cached path the keys of the
/// rejected drafts are dropped: the next pass starts at the first position not kept.
///
/// With `resume` (cached path only), the stages hold the keys of the first `kept` prompt positions
/// already; the rest of the prompt is prefilled from there, in chunks by its own length.
pub fn generate_streaming<E: From<Error>>(
    head: &Stage,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut mask: Option<&mut JsonMask>,
    resume: Option<Resume<'_>>,
    lap: &mut dyn FnMut(Pass) -> Result<Vec<f32>, E>,
    on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
) -> Result<Generation, E> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt has no tokens".to_string()).into());
    }
    let kept = resume.as_ref().map_or(0, |r| r.kept);
    if kept >= prompt.len() || (resume.is_some() && opts.path != ForwardPath::Cached) {
        return Err(Error::Invalid(format!(
            "a turn continues {kept} cached positions of a {}-token prompt on the {} path: only \
             the cached path continues keys, and at least one prompt position must be new",
            prompt.len(),
            opts.path.name()
        ))
        .into());
    }
    let h = head.config().hidden_size;
    let max_pos = head.config().max_position_embeddings;
    let mut ids = prompt.to_vec();
    let mut out = Generation {
        cancelled: false,
        ids: Vec::new(),
        laps: 0,
        margins: Vec::new(),
        first_logits: Vec::new(),
        drafted: 0,
        accepted: 0,
        passes: Vec::new(),
    };
    let mut own;
    let mut cache: Option<&mut StageCache> = None;
    // (pos0, rows) of the next passes over `ids`; on the full-window path pos0 is always 0.
    let mut pending: Vec<(usize, usize)> = match opts.path {
        ForwardPath::FullWindow => vec![(0, ids.len())],
        ForwardPath::Cached => {
            cache = Some(match resume {
                Some(r) => r.cache,
                None => {
                    own = head.new_cache();
                    &mut own
                }
            });
            let mut pos = kept;
            prefill_chunks(ids.len() - kept)
                .into_iter()
                .map(|c| {
                    pos += c;
                    (pos - c, c)
                })
                .collect()
        }
    };
    // The drafts the last pending pass carries after its rows.
    let mut drafted: Vec<u32> = Vec::new();
    'turn: while out.ids.len() < opts.max_new_tokens {
        let mut last = Vec::new();
        let count = pending.len();
        // A head whose layers run on a device runs the prompt's chunks in one submission: the
        // same bits as chunk by chunk (DeviceLayers::forward), sent on around the ring chunk by
        // chunk as before.
        let mut batched: Option<(usize, Vec<f32>)> = None;
        if let Some(c) = cache.as_deref_mut()
            && count > 1
            && drafted.is_empty()
            && head.device().is_some()
        {
            let first = pending[0].0;
            let sizes: Vec<usize> = pending.iter().map(|p| p.1).collect();
            let end = first + sizes.iter().sum::<usize>();
            c.truncate(first);
            let mut x = head.embed(&ids[first..end], first)?;
            head.forward_chunks(&mut x, &sizes, first, c)?;
            batched = Some((first, x));
        }
        for (i, (pos0, rows)) in pending.drain(..).enumerate() {
            let wanted = i + 1 == count;
            let extra = if wanted { drafted.len() } else { 0 };
            let mut tokens = ids[pos0..pos0 + rows].to_vec();
            tokens.extend_from_slice(&drafted[..extra]);
            let rows = rows + extra;
            if let Some(c) = cache.as_deref_mut() {
                if batched.is_none() {
                    c.truncate(pos0);
                }
                out.passes.push((pos0, tokens.clone()));
            }
            let x = match &batched {
                Some((first, all)) => all[(pos0 - first) * h..(pos0 - first + rows) * h].to_vec(),
                None => {
                    let mut x = head.embed(&tokens, pos0)?;
                    head.forward(&mut x, rows, pos0, cache.as_deref_mut())?;
                    x
                }
            };
            let back = lap(Pass {
                hidden: x,
                rows,
                pos0,
                cached: cache.is_some(),
                lap: out.laps,
                wanted,
            })?;
            out.laps += 1;
            if !wanted {
                continue;
            }
            if back.len() != rows * h {
                return Err(Error::Activation {
                    got: back.len() / rows.max(1),
                    pos: pos0,
                    expected: h,
                    want_pos: pos0,
                }
                .into());
            }
            last = back[(rows - 1 - extra) * h..].to_vec();
        }
        let scored = drafted.len() + 1;
        let logits = head.logits(&last, scored)?;
        let v = logits.len() / scored;
        out.drafted += drafted.len();
        for (r, row) in logits.chunks_exact(v).enumerate() {
            let next = choose(
                row,
                opts.sampling,
                ids.len(),
                out.ids.len(),
                mask.as_deref_mut(),
            )?;
            out.margins.push(top2_margin(row));
            if out.first_logits.is_empty() {
                out.first_logits = row.to_vec();
            }
            ids.push(next);
            out.ids.push(next);
            if on_token(next).is_break() {
                out.cancelled = true;
                break 'turn;
            }
            if !opts.ignore_eos && opts.eos_token_ids.contains(&next) {
                break 'turn;
            }
            if mask.as_deref().is_some_and(JsonMask::complete) {
                break 'turn;
            }
            if out.ids.len() >= opts.max_new_tokens {
                break 'turn;
            }
            if drafted.get(r) != Some(&next) {
                break;
            }
            out.accepted += 1;
        }
        // Drafts beyond what the turn may still produce, or past the model's positions, are not sent.
        let room = (opts.max_new_tokens - out.ids.len() - 1).min(max_pos.saturating_sub(ids.len()));
        drafted = drafts(&ids, opts.lookahead.min(room));
        pending.push(match opts.path {
            ForwardPath::FullWindow => (0, ids.len()),
            ForwardPath::Cached => (ids.len() - 1, 1),
        });
    }
    Ok(out)
}

/// Replay recorded cached-path passes (see [`Generation::passes`]) into `cache` and the stages
/// behind `lap`, from empty caches: the keys they rebuild are exactly those the passes wrote. Their
/// laps are numbered from `first_lap` and return nothing the head uses.
pub fn rebuild<E: From<Error>>(
    head: &Stage,
    cache: &mut StageCache,
    passes: &[(usize, Vec<u32>)],
    first_lap: usize,
    lap: &mut dyn FnMut(Pass) -> Result<Vec<f32>, E>,
) -> Result<(), E> {
    for (i, (pos0, tokens)) in passes.iter().enumerate() {
        cache.truncate(*pos0);
        let mut x = head.embed(tokens, *pos0)?;
        head.forward(&mut x, tokens.len(), *pos0, Some(&mut *cache))?;
        lap(Pass {
            hidden: x,
            rows: tokens.len(),
            pos0: *pos0,
            cached: true,
            lap: first_lap + i,
            wanted: false,
        })?;
    }
    Ok(())
}

/// A teacher-forced pass over given ids.
#[derive(Clone, Debug)]
pub struct Scored {
    /// `argmax[j]`: the top next-token id after position j (length n).
    pub argmax: Vec<u32>,
    /// Top-1/top-2 logit margin after each position (length n).
    pub margins: Vec<f32>,
    /// Log-probability of each next given token (length n−1).
    pub logprobs: Vec<f32>,
    /// `exp(−mean(logprobs))`; NaN for fewer than two ids.
    pub perplexity: f64,
}

/// Rows of logits computed at once while scoring (bounds memory; rows are independent).
const SCORE_ROWS: usize = 32;

/// One full-window pass over `ids`; `lap` as in [`generate`].
pub fn score<E: From<Error>>(
    head: &Stage,
    ids: &[u32],
    lap: &mut dyn FnMut(Pass) -> Result<Vec<f32>, E>,
) -> Result<Scored, E> {
    if ids.is_empty() {
        return Err(Error::Invalid("nothing to score: no ids".to_string()).into());
    }
    let h = head.config().hidden_size;
    let n = ids.len();
    let mut x = head.embed(ids, 0)?;
    head.forward(&mut x, n, 0, None)?;
    let back = lap(Pass {
        hidden: x,
        rows: n,
        pos0: 0,
        cached: false,
        lap: 0,
        wanted: true,
    })?;
    if back.len() != n * h {
        return Err(Error::Activation {
            got: back.len() / n,
            pos: 0,
            expected: h,
            want_pos: 0,
        }
        .into());
    }
    let v = head.config().vocab_size;
    let mut out = Scored {
        argmax: Vec::with_capacity(n),
        margins: Vec::with_capacity(n),
        logprobs: Vec::new(),
        perplexity: f64::NAN,
    };
    for r0 in (0..n).step_by(SCORE_ROWS) {
        let rows = SCORE_ROWS.min(n - r0);
        let logits = head.logits(&back[r0 * h..(r0 + rows) * h], rows)?;
        for (i, row) in logits.chunks_exact(v).enumerate() {
            let j = r0 + i;
            out.argmax.push(argmax(row));
            out.margins.push(top2_margin(row));
            if j + 1 < n {
                out.logprobs.push(log_softmax_at(row, ids[j + 1] as usize));
            }
        }
    }
    if !out.logprobs.is_empty() {
        let mean = out.logprobs.iter().map(|&l| l as f64).sum::<f64>() / out.logprobs.len() as f64;
        out.perplexity = libm::exp(-mean);
    }
    Ok(out)
}

/// `log softmax(row)[i]` in f32: `row[i] − max − ln Σ exp(row − max)`.
fn log_softmax_at(row: &[f32], i: usize) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for &l in row {
        sum += crate::ops::exp(l - max);
    }
    row.get(i)
        .map_or(f32::NEG_INFINITY, |&l| l - max - libm::logf(sum))
}

/// The head alone: the lap returns the hidden state as it is.
pub fn alone(pass: Pass) -> Result<Vec<f32>> {
    Ok(pass.hidden)
}

#[cfg(test)]
mod tests {
    use super::drafts;

    #[test]
    fn drafts_follow_the_latest_earlier_ngram_through_themselves() {
        // "1 2 3 4 1 2 3": the trigram "1 2 3" occurred at 0; what followed is 4, then the
        // context itself (1 2 3), then the drafts (4 …).
        assert_eq!(drafts(&[1, 2, 3, 4, 1, 2, 3], 6), vec![4, 1, 2, 3, 4, 1]);
        // The latest earlier occurrence wins, and a longer n-gram before a shorter one.
        assert_eq!(drafts(&[9, 8, 1, 9, 8, 2, 9, 8], 1), vec![2]);
        assert_eq!(drafts(&[4, 9, 8, 1, 5, 9, 8, 4, 9, 8], 1), vec![1]);
        assert_eq!(drafts(&[1, 9, 8, 2, 5, 9, 8], 2), vec![2, 5]);
        // A single repeated token is not looked up; nothing repeats, no drafts; k = 0 is off.
        assert_eq!(drafts(&[1, 2, 3, 1], 4), Vec::<u32>::new());
        assert_eq!(drafts(&[1, 2, 3, 4], 4), Vec::<u32>::new());
        assert_eq!(drafts(&[1, 2, 1, 2], 0), Vec::<u32>::new());
        assert_eq!(drafts(&[], 3), Vec::<u32>::new());
    }
}
