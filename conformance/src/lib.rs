//! Conformance: replays real model splits against independent goldens, and mutation cases that must fail.
//!
//! This library holds what the `conformance` test binary drives: opening the fixture models, an
//! in-process ring that sends every hop through `wire` encode/decode and `ring::route` (the same
//! route `node run --stages` takes), and the comparison rules of DESIGN.md §6.

use std::ops::Range;
use std::path::PathBuf;

use anyhow::{Context, bail};
use daisy_loader::Checkpoint;
use daisy_model::{Config, Pass, Precision, Stage, StageCache};
use daisy_ring::{Next, route};
use daisy_wire::{Activation, Fingerprint, Message, Plan, Positions, decode_for, encode};
use sha2::{Digest, Sha256};

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

/// One hop of the first lap: the layer after which the state was sent and SHA-256 of its f32 bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    pub after_layer: usize,
    pub sha256: [u8; 32],
}

/// SHA-256 over the exact little-endian bits of `data`.
pub fn sha256_f32(data: &[f32]) -> [u8; 32] {
    let mut h = Sha256::new();
    for v in data {
        h.update(v.to_bits().to_le_bytes());
    }
    h.finalize().into()
}

/// The stages of one plan in one process: the head drives, every hop crosses `wire` and `ring::route`.
pub struct Ring<'a> {
    plan: &'a Plan,
    stages: &'a [Stage],
    caches: Vec<Option<StageCache>>,
    turn: u64,
    /// The first lap's hops, in order (the last one is the return leg to the head).
    pub hops: Vec<Hop>,
}

impl<'a> Ring<'a> {
    /// `stages[i]` plays stage `i` of `plan` (no check that it holds the layers the plan says: see
    /// [`check_stages`]; the mutation cases skip it on purpose).
    pub fn new(plan: &'a Plan, stages: &'a [Stage], turn: u64) -> Self {
        Self {
            plan,
            stages,
            caches: vec![None; stages.len()],
            turn,
            hops: Vec::new(),
        }
    }

    /// Carry one pass from the head around the ring and back.
    pub fn lap(&mut self, pass: Pass) -> anyhow::Result<Vec<f32>> {
        let Pass {
            hidden,
            rows,
            pos0,
            cached,
            lap,
        } = pass;
        let cols = hidden.len().checked_div(rows).unwrap_or(0);
        if cached && pos0 == 0 {
            for (c, s) in self.caches.iter_mut().zip(self.stages) {
                *c = Some(s.new_cache());
            }
        }
        let mut data = hidden;
        let mut hop = 0;
        let mut sender = 0;
        let mut after_layer = self.plan.stages()[0].layers.end;
        loop {
            let fp = Fingerprint(self.stages[sender].fingerprint());
            let act = Activation::new(
                self.turn,
                lap,
                hop,
                Positions::new(pos0, rows),
                rows,
                cols,
                data,
                fp,
            )?;
            let bytes = encode(&Message::Activation(act));
            let next = route(self.plan, hop)?;
            let receiver = match next {
                Next::Stage(i) => i,
                Next::Return => 0,
            };
            let Some(stage) = self.stages.get(receiver) else {
                bail!("route names stage {receiver}, which is not loaded")
            };
            let Message::Activation(act) = decode_for(&bytes, &Fingerprint(stage.fingerprint()))?
            else {
                bail!("hop {hop} did not decode to an activation");
            };
            data = act.into_data();
            if lap == 0 {
                self.hops.push(Hop {
                    after_layer,
                    sha256: sha256_f32(&data),
                });
            }
            match next {
                Next::Return => return Ok(data),
                Next::Stage(i) => {
                    let cache = if cached {
                        self.caches[i].as_mut()
                    } else {
                        None
                    };
                    stage.forward(&mut data, rows, pos0, cache)?;
                    after_layer = self.plan.stages()[i].layers.end;
                    sender = i;
                    hop += 1;
                }
            }
        }
    }
}

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
