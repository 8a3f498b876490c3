//! Conformance: replays real model splits against independent goldens, and mutation cases that must fail.
//!
//! This library holds what the `conformance` test binary drives: opening the fixture models, an
//! in-process ring that sends every hop through `wire` encode/decode and `ring::route` (the same
//! route `node run --stages` takes), and the comparison rules of DESIGN.md §6.

use std::ops::Range;
use std::path::PathBuf;

use anyhow::{Context, bail};
use daisy_loader::Checkpoint;
use daisy_model::{Config, Precision, Stage};
use daisy_wire::Plan;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The tiny fixture models, by folder name under `fixtures/tiny/`.
pub const TINY: [&str; 4] = ["gpt2", "qwen2", "mistral", "llama"];

/// Where `cargo xtask fixtures` puts SmolLM2.
pub fn smollm2_dir() -> PathBuf {
    root().join("target/fixtures/SmolLM2-135M-Instruct")
}

/// A checkpoint and its resolved config.
pub struct Model {
    pub checkpoint: Checkpoint,
    pub config: Config,
}

impl Model {
    pub fn open(dir: &std::path::Path) -> anyhow::Result<Self> {
        let checkpoint = Checkpoint::open(&dir.to_string_lossy())
            .with_context(|| format!("opening {}", dir.display()))?;
        let config = Config::from_loader(checkpoint.config())?;
        Ok(Self { checkpoint, config })
    }

    pub fn tiny(name: &str) -> anyhow::Result<Self> {
        Self::open(&root().join("fixtures/tiny").join(name))
    }

    /// Load stage `layers` (with the head's tensors when `head`).
    pub fn stage(
        &self,
        layers: Range<usize>,
        head: bool,
        precision: Precision,
    ) -> anyhow::Result<Stage> {
        Ok(Stage::load(
            &self.checkpoint,
            &self.config,
            layers,
            head,
            precision,
        )?)
    }

    /// The stages of a split given as layer counts, head first.
    pub fn split(
        &self,
        counts: &[usize],
        precision: Precision,
    ) -> anyhow::Result<(Plan, Vec<Stage>)> {
        let plan = Plan::from_counts(counts, self.config.num_layers)?;
        let stages = plan
            .stages()
            .iter()
            .enumerate()
            .map(|(i, s)| self.stage(s.layers.clone(), i == 0, precision))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((plan, stages))
    }
}

/// The golden JSON of a tiny model.
pub fn golden(name: &str) -> anyhow::Result<serde_json::Value> {
    let path = root().join("fixtures/goldens").join(format!("{name}.json"));
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_slice(&bytes)?)
}

pub use node::lap::{Hop, LocalRing as Ring, sha256_f32};

/// Refuse stages that do not hold what the plan assigns them, or that come from another model.
pub fn check_stages(plan: &Plan, stages: &[Stage]) -> anyhow::Result<()> {
    if plan.len() != stages.len() {
        bail!(
            "{} stages loaded for a plan of {}",
            stages.len(),
            plan.len()
        );
    }
    for (i, (p, s)) in plan.stages().iter().zip(stages).enumerate() {
        if p.layers != s.layers() || (i == 0) != s.is_head() {
            bail!(
                "stage {i} holds layers {:?}, the plan assigns {:?}",
                s.layers(),
                p.layers
            );
        }
        if s.fingerprint() != stages[0].fingerprint() {
            bail!("stage {i} was loaded from another model (fingerprint differs from the head's)");
        }
    }
    Ok(())
}
