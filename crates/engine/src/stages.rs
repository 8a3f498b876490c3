//! Stages of a plan: loaded with one backend, and checked against the plan they are to play.

use std::sync::Arc;

use daisy_gemm_int8::Backend;
use std::ops::Range;
use std::path::PathBuf;

use daisy_loader::ModelConfig;
use daisy_model::{MAX_LIVE_LAYERS, Precision, Source, Stage};
use daisy_wire::Plan;

use crate::error::{Context, Error, Result};
use crate::open::Opened;

/// How many of a stage's layers may be resident (`--max-resident-layers`): `None` holds them all;
/// a stage with more layers than `Some(n)` streams them from its flat shard, two live at a time.
pub type MaxResident = Option<usize>;

/// Refused below the two layers a streamed stage holds live.
pub fn check_max_resident(max: MaxResident) -> Result<()> {
    match max {
        Some(n) if n < MAX_LIVE_LAYERS => Err(Error::Invalid(format!(
            "--max-resident-layers {n}: a stage that streams its layers holds {MAX_LIVE_LAYERS} \
             live (the one running and the next), so at least {MAX_LIVE_LAYERS}"
        ))),
        _ => Ok(()),
    }
}

/// Where the flat shard of `layers` of the model `fingerprint` at `precision` is kept:
/// `$XDG_CACHE_HOME/daisychain-infer/shards/<fingerprint>/<start>-<end>-<precision>.shard`.
pub fn shard_path(
    fingerprint: &[u8; 32],
    layers: &Range<usize>,
    precision: Precision,
) -> Result<PathBuf> {
    let base = dirs::cache_dir().ok_or_else(|| {
        Error::Invalid("no cache folder for the layer shard (set XDG_CACHE_HOME)".to_string())
    })?;
    Ok(base
        .join("daisychain-infer/shards")
        .join(hex::encode(fingerprint))
        .join(format!(
            "{}-{}-{}.shard",
            layers.start,
            layers.end,
            precision.name()
        )))
}

/// Load layers `layers` (the head's tensors too when `head`) from `source`, streamed from the
/// layers' shard when there are more than `max` of them. With `keep`, resident int8 layers (two or
/// more) are read from their shard when one is there, and written to it after loading otherwise,
/// so the next start is ready without fetching or quantizing them again.
pub fn load_layers(
    source: &dyn Source,
    cfg: &ModelConfig,
    layers: Range<usize>,
    head: bool,
    precision: Precision,
    max: MaxResident,
    keep: bool,
) -> Result<Stage> {
    check_max_resident(max)?;
    let path = || shard_path(&source.fingerprint(), &layers, precision);
    let stage = match max {
        Some(n) if layers.len() > n => {
            let path = path()?;
            let (stage, reused) =
                Stage::load_streamed(source, cfg, layers.clone(), head, precision, &path)?;
            crate::note(format_args!(
                "layers {layers:?} stream from {} ({}), {MAX_LIVE_LAYERS} live at a time",
                path.display(),
                if reused {
                    "the shard was there already"
                } else {
                    "written now"
                }
            ));
            stage
        }
        _ if keep && precision.is_int8() && layers.len() >= 2 => {
            let path = path()?;
            let t0 = std::time::Instant::now();
            if let Some(stage) =
                Stage::load_mapped(source, cfg, layers.clone(), head, precision, &path)?
            {
                crate::note(format_args!(
                    "layers {layers:?} read from {} in {:.3}s (the shard was there already)",
                    path.display(),
                    t0.elapsed().as_secs_f64()
                ));
                return Ok(stage);
            }
            let stage = Stage::load(source, cfg, layers.clone(), head, precision)?;
            let t0 = std::time::Instant::now();
            match stage.write_shard(&path) {
                Ok(()) => crate::note(format_args!(
                    "layers {layers:?} written to {} in {:.2}s, for the next start",
                    path.display(),
                    t0.elapsed().as_secs_f64()
                )),
                // The stage runs as it is; only the next start is slower.
                Err(e) => crate::note(format_args!(
                    "layers {layers:?} not kept for the next start: {e}"
                )),
            }
            stage
        }
        _ => Stage::load(source, cfg, layers, head, precision)?,
    };
    Ok(stage)
}

/// Load stage `index` of `plan` (the head's tensors too when it is 0) onto `backend`. The caller
/// warms a GPU up ([`warm_up`]) once its stages are loaded.
pub fn load_stage(
    opened: &Opened,
    plan: &Plan,
    index: usize,
    precision: Precision,
    backend: &Arc<dyn Backend>,
    max: MaxResident,
    keep: bool,
) -> Result<Stage> {
    let span = plan
        .stages()
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("stage {index} of a plan of {}", plan.len())))?;
    let mut stage = load_layers(
        &opened.checkpoint,
        opened.config(),
        span.layers.clone(),
        index == 0,
        precision,
        max,
        keep,
    )
    .context(|| format!("loading stage {index} (layers {:?})", span.layers))?;
    onto_backend(&mut stage, backend, &format!("stage {index}"))?;
    Ok(stage)
}

/// Puts a loaded stage on `backend`: its int8 weights resident there and its layers whole on the
/// device where they can run there ([`run_layers_on_device`]). `what` names the stage in errors
/// ("stage 0", "layers 4..8").
pub fn onto_backend(stage: &mut Stage, backend: &Arc<dyn Backend>, what: &str) -> Result<()> {
    stage.set_backend(backend.clone());
    stage
        .keep_resident()
        .context(|| format!("{what}: weights onto {}", backend.name()))?;
    run_layers_on_device(stage, backend)
        .context(|| format!("{what}: layers onto {}", backend.name()))
}

/// Raises a GPU's clock once its stages are loaded, so that the first prompt does not find the
/// card idle (`daisy_wgsl::warm_up`; nothing for another backend). `what` names the stages in
/// errors and in the log.
pub fn warm_up(backend: &Arc<dyn Backend>, what: &str) -> Result<()> {
    let warmed = daisy_wgsl::warm_up(&**backend)
        .context(|| format!("{what}: warming up {}", backend.name()))?;
    if !warmed.is_zero() {
        crate::note(format_args!(
            "{what}: kept {} busy for {} ms to raise its clock",
            backend.name(),
            warmed.as_millis()
        ));
    }
    Ok(())
}

/// A stage whose products run on a GPU runs its layers whole there (residual stream and KV cache
/// in device memory, the CPU's bits) where it can: Llama-family layers at int8, resident, on a
/// device with 64-bit floats in shaders. `DAISY_GPU_LAYERS=0` keeps one round trip per product.
fn run_layers_on_device(stage: &mut Stage, backend: &Arc<dyn Backend>) -> Result<()> {
    let wanted = std::env::var("DAISY_GPU_LAYERS").map_or(true, |v| v != "0");
    let fits = stage.precision() == Precision::Int8
        && stage.config().arch == daisy_loader::Arch::Llama
        && !stage.is_streamed()
        && !stage.layers().is_empty();
    if !wanted || !fits {
        return Ok(());
    }
    match daisy_wgsl::GpuLayers::new(backend.clone()) {
        Ok(Some(layers)) => stage.set_device(Arc::new(layers))?,
        Ok(None) => {}
        // The device's float arithmetic is not the CPU's: its products (integers, audited) are
        // still used, the steps between them stay on the CPU.
        Err(daisy_wgsl::Error::FloatGate(m)) => crate::note(format_args!(
            "{m}: the stage's layers stay on the CPU, its products on the GPU"
        )),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Load every stage of `plan` with `backend`, then warm a GPU up once.
pub fn load_stages(
    opened: &Opened,
    plan: &Plan,
    precision: Precision,
    backend: &Arc<dyn Backend>,
    max: MaxResident,
) -> Result<Vec<Stage>> {
    let stages = (0..plan.len())
        .map(|i| load_stage(opened, plan, i, precision, backend, max, false))
        .collect::<Result<Vec<_>>>()?;
    // Once, after the last stage: a card warmed before a later stage's load would idle again.
    warm_up(backend, &format!("{} stage(s)", stages.len()))?;
    Ok(stages)
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
