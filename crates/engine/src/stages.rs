//! Stages of a plan: loaded with one backend, and checked against the plan they are to play.

use std::sync::Arc;

use daisy_gemm_int8::Backend;
use daisy_model::{Precision, Stage};
use daisy_wire::Plan;

use crate::error::{Context, Error, Result};
use crate::open::Opened;

/// Load stage `index` of `plan` (the head's tensors too when it is 0) with `backend`.
pub fn load_stage(
    opened: &Opened,
    plan: &Plan,
    index: usize,
    precision: Precision,
    backend: &Arc<dyn Backend>,
) -> Result<Stage> {
    let span = plan
        .stages()
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("stage {index} of a plan of {}", plan.len())))?;
    let mut stage = Stage::load(
        &opened.checkpoint,
        opened.config(),
        span.layers.clone(),
        index == 0,
        precision,
    )
    .context(|| format!("loading stage {index} (layers {:?})", span.layers))?;
    stage.set_backend(backend.clone());
    Ok(stage)
}

/// Load every stage of `plan` with `backend`.
pub fn load_stages(
    opened: &Opened,
    plan: &Plan,
    precision: Precision,
    backend: &Arc<dyn Backend>,
) -> Result<Vec<Stage>> {
    (0..plan.len())
        .map(|i| load_stage(opened, plan, i, precision, backend))
        .collect()
}

/// Refuse stages that do not hold what the plan assigns them, or that come from another model.
pub fn check_stages(plan: &Plan, stages: &[Stage]) -> Result<()> {
    if plan.len() != stages.len() {
        return Err(Error::Invalid(format!(
            "{} stages loaded for a plan of {}",
            stages.len(),
            plan.len()
        )));
    }
    for (i, (p, s)) in plan.stages().iter().zip(stages).enumerate() {
        if p.layers != s.layers() || (i == 0) != s.is_head() {
            return Err(Error::Invalid(format!(
                "stage {i} holds layers {:?}, the plan assigns {:?}",
                s.layers(),
                p.layers
            )));
        }
        if s.fingerprint() != stages[0].fingerprint() {
            return Err(Error::Invalid(format!(
                "stage {i} was loaded from another model (fingerprint differs from the head's)"
            )));
        }
    }
    Ok(())
}
