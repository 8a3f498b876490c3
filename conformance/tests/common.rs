//! Shared helpers of the conformance tests: running a split and reading goldens.

use daisy_conformance::{Hop, Model, Ring, check_stages};
use daisy_model::{
    ForwardPath, GenerateOptions, Precision, Sampling, Scored, Stage, generate, score,
};
use daisy_wire::Plan;

/// Margin below which a greedy step is a near-tie (DESIGN.md §6).
pub(crate) const NEAR_TIE: f64 = 1e-3;

/// What one run of a split produced.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) ids: Vec<u32>,
    pub(crate) hops: Vec<Hop>,
    pub(crate) first_logits: Vec<f32>,
    /// Lookahead's drafted tokens, and how many were kept.
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
}

pub(crate) fn options(new_tokens: usize, path: ForwardPath, sampling: Sampling) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: new_tokens,
        eos_token_ids: Vec::new(),
        ignore_eos: true,
        sampling,
        path,
        lookahead: 0,
    }
}

/// Generate through `stages` playing `plan` (no check that they fit it).
pub(crate) fn run_stages(
    plan: &Plan,
    stages: &[Stage],
    prompt: &[u32],
    opts: &GenerateOptions,
) -> anyhow::Result<Run> {
    let mut ring = Ring::new(plan, stages, 1);
    let generation = generate(&stages[0], prompt, opts, &mut |p| ring.lap(p))?;
    Ok(Run {
        ids: generation.ids,
        hops: ring.hops,
        first_logits: generation.first_logits,
        drafted: generation.drafted,
        accepted: generation.accepted,
    })
}

/// Load and check a split, then generate through it.
pub(crate) fn run_split(
    model: &Model,
    counts: &[usize],
    precision: Precision,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> anyhow::Result<Run> {
    let (plan, stages) = model.split(counts, precision)?;
    check_stages(&plan, &stages)?;
    run_stages(&plan, &stages, prompt, opts)
}

/// Teacher-forced pass over `ids` through a split.
pub(crate) fn score_split(
    model: &Model,
    counts: &[usize],
    precision: Precision,
    ids: &[u32],
) -> anyhow::Result<Scored> {
    let (plan, stages) = model.split(counts, precision)?;
    check_stages(&plan, &stages)?;
    let mut ring = Ring::new(&plan, &stages, 1);
    score(&stages[0], ids, &mut |p| Ok(ring.lap(p)?))
}

/// Compare a split's run with a reference run of finer (or equal) granularity: identical ids, and at
/// every hop the state after the same layer has the same bits.
pub(crate) fn same_run(reference: &Run, run: &Run) -> Result<(), String> {
    if reference.ids != run.ids {
        return Err(format!("ids {:?}, reference {:?}", run.ids, reference.ids));
    }
    for hop in &run.hops {
        let Some(r) = reference
            .hops
            .iter()
            .find(|r| r.after_layer == hop.after_layer)
        else {
            return Err(format!(
                "reference has no hop after layer {}",
                hop.after_layer
            ));
        };
        if r.sha256 != hop.sha256 {
            return Err(format!(
                "hidden state after layer {} differs from the reference",
                hop.after_layer
            ));
        }
    }
    Ok(())
}

/// The unsplit layer counts of a model, and a split where every layer is its own stage (the head
/// holding none), whose hops cover every layer boundary.
pub(crate) fn per_layer(n: usize) -> Vec<usize> {
    std::iter::once(0)
        .chain(std::iter::repeat_n(1, n))
        .collect()
}

pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub(crate) fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}
