//! The ring of one plan played in one process: the head drives, and every hop crosses the real `wire`
//! encoding (integrity hash, fingerprint check on decode) and `daisy_ring::route`. `node run` and the
//! conformance suite both drive laps through this one piece, so the suite tests the product's path.

use anyhow::{Context, bail};
use daisy_model::{Pass, Stage, StageCache};
use daisy_ring::{Next, route};
use daisy_wire::{Activation, Fingerprint, Message, Plan, Positions, decode_for, encode};
use sha2::{Digest, Sha256};

/// One hop of the first lap: the layer after which the state was sent, and SHA-256 of its f32 bits.
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

/// The stages of one plan in one process; the head drives and every hop crosses `wire` and `route`.
pub struct LocalRing<'a> {
    plan: &'a Plan,
    stages: &'a [Stage],
    caches: Vec<Option<StageCache>>,
    turn: u64,
    pub hops: Vec<Hop>,
}

impl<'a> LocalRing<'a> {
    /// `stages[i]` plays stage `i` of `plan`; nothing checks that it holds the layers the plan says
    /// (the caller does, and the conformance mutation cases skip it on purpose).
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
        let (mut hop, mut sender) = (0, 0);
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
            let Message::Activation(act) = decode_for(&bytes, &Fingerprint(stage.fingerprint()))
                .with_context(|| format!("stage {receiver} refused hop {hop}"))?
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
                    stage
                        .forward(&mut data, rows, pos0, cache)
                        .with_context(|| format!("stage {i}"))?;
                    after_layer = self.plan.stages()[i].layers.end;
                    sender = i;
                    hop += 1;
                }
            }
        }
    }
}
