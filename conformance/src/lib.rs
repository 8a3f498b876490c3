//! Conformance: replays real model splits against independent goldens, and mutation cases that must fail.
//!
//! This library holds what the `conformance` test binary drives: opening the fixture models and their
//! splits. The in-process ring is `daisy_engine::LocalRing`, the one `node run --stages` plays and
//! the networked ring's members step through, so the suite tests the product's own lap code.

use std::ops::Range;
use std::path::PathBuf;

use anyhow::Context;
use daisy_loader::{Checkpoint, ModelConfig};
use daisy_model::{Precision, Stage};
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

/// A checkpoint and its config.
pub struct Model {
    pub checkpoint: Checkpoint,
    pub config: ModelConfig,
}

impl Model {
    pub fn open(dir: &std::path::Path) -> anyhow::Result<Self> {
        let checkpoint = Checkpoint::open(&dir.to_string_lossy())
            .with_context(|| format!("opening {}", dir.display()))?;
        let config = checkpoint.config().clone();
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

pub use daisy_engine::{Hop, LocalRing as Ring, check_stages, sha256_f32};
