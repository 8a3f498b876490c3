//! One lap step, and the ring of one plan played in one process from it.
//!
//! [`Member::step`] is what a stage of the ring does with one activation — bytes in, decode (the
//! integrity hash and the model fingerprint checked), run its layers, encode, bytes out — with
//! `daisy_ring::route` naming who consumes the result. A networked member calls it on the bytes its
//! data channel delivered; [`LocalRing`] calls it for every stage in turn. Both run the same code, so
//! the conformance suite, `node run --stages` and the ring across processes agree by construction.

use std::ops::Deref;

use daisy_model::{Pass, Stage, StageCache};
use daisy_ring::{Next, route};
use daisy_wire::{Activation, Fingerprint, Message, Plan, Positions, decode_for, encode};
use sha2::{Digest, Sha256};

use crate::error::{Context, Error, Result};

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

/// An activation on its way: who consumes it, its encoded bytes, and (on the first lap of a turn)
/// the hop it records.
#[derive(Debug)]
pub struct Sent {
    pub next: Next,
    pub bytes: Vec<u8>,
    pub hop: Option<Hop>,
}

/// Where a lap is: the turn, the lap within it, the positions its rows stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LapHeader {
    pub turn: u64,
    pub lap: usize,
    pub pos0: usize,
    pub rows: usize,
}

/// Encode what stage `sender` of `plan` produced as hop `hop`, and route it.
pub fn send(
    plan: &Plan,
    sender: &Stage,
    header: LapHeader,
    hop: usize,
    data: Vec<f32>,
) -> Result<Sent> {
    let cols = data.len().checked_div(header.rows).unwrap_or(0);
    let recorded = (header.lap == 0).then(|| Hop {
        after_layer: sender.layers().end,
        sha256: sha256_f32(&data),
    });
    let act = Activation::new(
        header.turn,
        header.lap,
        hop,
        Positions::new(header.pos0, header.rows),
        header.rows,
        cols,
        data,
        Fingerprint(sender.fingerprint()),
    )?;
    Ok(Sent {
        next: route(plan, hop)?,
        bytes: encode(&Message::Activation(act)),
        hop: recorded,
    })
}

/// Decode an activation meant for `stage`: the hash and the fingerprint checked, and refused unless
/// the router sends hop `hop` to `expected`.
fn receive(plan: &Plan, stage: &Stage, expected: Next, bytes: &[u8]) -> Result<Activation> {
    let Message::Activation(act) = decode_for(bytes, &Fingerprint(stage.fingerprint()))? else {
        return Err(Error::Invalid(
            "expected an activation, got another message".to_string(),
        ));
    };
    let next = route(plan, act.hop())?;
    if next != expected {
        return Err(Error::Invalid(format!(
            "hop {} is addressed to {next:?}, not to {expected:?}",
            act.hop()
        )));
    }
    Ok(act)
}

/// The head at the end of a lap: the returning hidden state, checked (integrity hash, fingerprint,
/// route), with the lap it says it is.
pub fn returned(plan: &Plan, head: &Stage, bytes: &[u8]) -> Result<(LapHeader, Vec<f32>)> {
    let act = receive(plan, head, Next::Return, bytes)
        .context(|| "the head refused the return leg".to_string())?;
    let header = LapHeader {
        turn: act.turn(),
        lap: act.lap(),
        pos0: act.positions().start,
        rows: act.rows(),
    };
    Ok((header, act.into_data()))
}

/// [`returned`], refused unless it is lap `expected` (a replayed or misrouted lap is not used).
pub fn receive_at_head(
    plan: &Plan,
    head: &Stage,
    expected: LapHeader,
    bytes: &[u8],
) -> Result<Vec<f32>> {
    let (got, data) = returned(plan, head, bytes)?;
    if got != expected {
        return Err(Error::Invalid(format!(
            "the head expected {expected:?} back and got {got:?}"
        )));
    }
    Ok(data)
}

/// One stage of the ring other than the head: its layers, its place in the plan, its KV cache.
/// The plan and the stage are held through any handle (`&Plan` and `&Stage` in one process,
/// `Arc`s where a member outlives the scope that loaded it and runs on whichever thread a lap
/// arrives on).
pub struct Member<P, S> {
    plan: P,
    index: usize,
    stage: S,
    cache: Option<StageCache>,
    /// The turn whose keys `cache` holds, as [`Member::begin`] was told.
    cache_turn: Option<u64>,
    /// The turn and lap of the last activation this stage ran: laps only go forward (a turn's
    /// laps in order, a later turn's after an earlier's), so a replayed one is refused by name.
    last: Option<(u64, usize)>,
}

impl<P: Deref<Target = Plan>, S: Deref<Target = Stage>> Member<P, S> {
    /// `stage` plays stage `index` (not 0) of `plan`; nothing checks that it holds the layers the
    /// plan says (the caller does, and the conformance mutation cases skip it on purpose).
    pub fn new(plan: P, index: usize, stage: S) -> Self {
        Self {
            plan,
            index,
            stage,
            cache: None,
            cache_turn: None,
            last: None,
        }
    }

    /// Turn `turn` begins: with `continues`, it keeps the keys that turn wrote (refused when this
    /// stage holds another turn's, or none); without, the keys held are dropped.
    pub fn begin(&mut self, turn: u64, continues: Option<u64>) -> Result<()> {
        match continues {
            Some(prev) if self.cache.is_some() && self.cache_turn == Some(prev) => {}
            Some(prev) => {
                return Err(Error::Invalid(format!(
                    "stage {}: turn {turn} continues the keys of turn {prev}, but this stage \
                     holds {}",
                    self.index,
                    match self.cache_turn {
                        Some(t) if self.cache.is_some() => format!("turn {t}'s"),
                        _ => "none".to_string(),
                    }
                )));
            }
            None => self.cache = None,
        }
        self.cache_turn = Some(turn);
        Ok(())
    }

    /// Take one activation's bytes, run this stage's layers on it, and send the result on. On the
    /// cached path the stage continues its own KV cache (a lap at position 0 starts a new one; a lap
    /// at a position the cache has passed first drops the keys from there on).
    pub fn step(&mut self, bytes: &[u8], cached: bool) -> Result<Sent> {
        let i = self.index;
        let act = receive(&self.plan, &self.stage, Next::Stage(i), bytes)
            .context(|| format!("stage {i} refused an activation"))?;
        let header = LapHeader {
            turn: act.turn(),
            lap: act.lap(),
            pos0: act.positions().start,
            rows: act.rows(),
        };
        if let Some((turn, lap)) = self.last
            && (header.turn, header.lap) <= (turn, lap)
        {
            return Err(Error::Invalid(format!(
                "stage {i} refused lap {} of turn {}: it ran lap {lap} of turn {turn} already (a \
                 replayed or reordered activation)",
                header.lap, header.turn
            )));
        }
        self.last = Some((header.turn, header.lap));
        let hop = act.hop();
        let mut data = act.into_data();
        let cache = if cached {
            match self.cache.as_mut() {
                Some(c) if header.pos0 > 0 => {
                    // A lap behind the cache's end drops what follows it (rejected drafts).
                    if header.pos0 < c.len() {
                        c.truncate(header.pos0);
                    }
                }
                _ => self.cache = Some(self.stage.new_cache()),
            }
            self.cache.as_mut()
        } else {
            None
        };
        self.stage
            .forward(&mut data, header.rows, header.pos0, cache)
            .context(|| format!("stage {i}"))?;
        send(&self.plan, &self.stage, header, hop + 1, data)
    }
}

/// The stages of one plan in one process; the head drives and every hop crosses `wire` and `route`.
pub struct LocalRing<'a> {
    plan: &'a Plan,
    head: &'a Stage,
    members: Vec<Member<&'a Plan, &'a Stage>>,
    turn: u64,
    pub hops: Vec<Hop>,
}

impl<'a> LocalRing<'a> {
    /// `stages[i]` plays stage `i` of `plan` (see [`Member::new`]).
    pub fn new(plan: &'a Plan, stages: &'a [Stage], turn: u64) -> Self {
        Self {
            plan,
            head: &stages[0],
            members: (1..stages.len())
                .map(|i| Member::new(plan, i, &stages[i]))
                .collect(),
            turn,
            hops: Vec::new(),
        }
    }

    /// Carry one pass from the head around the ring and back.
    pub fn lap(&mut self, pass: Pass) -> Result<Vec<f32>> {
        let header = LapHeader {
            turn: self.turn,
            lap: pass.lap,
            pos0: pass.pos0,
            rows: pass.rows,
        };
        let mut sent = send(self.plan, self.head, header, 0, pass.hidden)?;
        loop {
            self.hops.extend(sent.hop.take());
            match sent.next {
                Next::Return => {
                    return receive_at_head(self.plan, self.head, header, &sent.bytes);
                }
                Next::Stage(i) => {
                    let Some(member) = i.checked_sub(1).and_then(|j| self.members.get_mut(j))
                    else {
                        return Err(Error::Invalid(format!(
                            "route names stage {i}, which is not loaded"
                        )));
                    };
                    sent = member.step(&sent.bytes, pass.cached)?;
                }
            }
        }
    }
}
