//! The pure router: who consumes the activation of each hop of a lap, and `walk_lap`, which walks a
//! lap through a router and checks it visits every stage once, in layer order, and ends.
//!
//! The head is both stage 0 and the ring's terminus. A lap starts at the head, which runs its own
//! layers (possibly none); hop `h` then carries the activation stage `h` produced: to stage `h + 1`
//! (`Next::Stage(h + 1)`), and from the last stage back to the head as the return leg
//! (`Next::Return`), where the head applies the lm_head. The return has its own address: addressing it
//! as "stage 0", the lap start, made the head re-run its layers and the lap never closed (GUIDE, "One
//! bug, and what it cost to find"). A lap of `n` stages has `n` hops, `0..n`; hop `n - 1` is the
//! return.

use std::ops::Range;

use daisy_wire::Plan;

use crate::Error;

/// Who consumes the activation of a hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Next {
    /// Stage `i` runs its layers on it (never 0: the head's layers run at the lap start).
    Stage(usize),
    /// The lap is over: the head applies the final norm and lm_head.
    Return,
}

/// The consumer of hop `hop` (the activation stage `hop` produced) of a lap over `plan`. Refused past
/// the return leg.
pub fn route(plan: &Plan, hop: usize) -> Result<Next, Error> {
    let stages = plan.len();
    match hop.checked_add(1) {
        Some(next) if next < stages => Ok(Next::Stage(next)),
        Some(next) if next == stages => Ok(Next::Return),
        _ => Err(Error::HopBeyondLap { hop, stages }),
    }
}

/// One stage visited by a lap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visit {
    /// The hop that delivered the activation; `None` for the head at the lap start.
    pub hop: Option<usize>,
    pub stage: usize,
    pub layers: Range<usize>,
}

/// Walks a lap with [`route`]; see [`walk_lap_with`].
pub fn walk_lap(plan: &Plan) -> Result<Vec<Visit>, Error> {
    walk_lap_with(plan, route)
}

/// Walks a lap — the head at the start, then hop 0, 1, … through `route` until it returns to the
/// head — and checks that every stage is visited exactly once, that the layers run in order
/// `0..n_layers`, and that the lap ends within `stages` hops. The router is a parameter so a broken
/// one can be shown to fail.
pub fn walk_lap_with(
    plan: &Plan,
    route: impl Fn(&Plan, usize) -> Result<Next, Error>,
) -> Result<Vec<Visit>, Error> {
    let stages = plan.len();
    let mut walk = Walk {
        plan,
        visited: vec![false; stages],
        visits: Vec::new(),
        next_layer: 0,
    };
    walk.enter(None, 0)?;
    for hop in 0..stages {
        match route(plan, hop)? {
            Next::Stage(stage) => walk.enter(Some(hop), stage)?,
            Next::Return => {
                let missing: Vec<usize> = (0..stages).filter(|&i| !walk.visited[i]).collect();
                if !missing.is_empty() || walk.next_layer != plan.n_layers() {
                    return Err(Error::ReturnedEarly { hop, missing });
                }
                return Ok(walk.visits);
            }
        }
    }
    Err(Error::LapNeverEnds { hops: stages })
}

struct Walk<'a> {
    plan: &'a Plan,
    visited: Vec<bool>,
    visits: Vec<Visit>,
    next_layer: usize,
}

impl Walk<'_> {
    fn enter(&mut self, hop: Option<usize>, stage: usize) -> Result<(), Error> {
        let at = hop.unwrap_or(0);
        let stages = self.plan.len();
        let Some(s) = self.plan.stages().get(stage) else {
            return Err(Error::NoSuchStage {
                hop: at,
                stage,
                stages,
            });
        };
        if self.visited[stage] {
            return Err(Error::Revisit { hop: at, stage });
        }
        if s.layers.start != self.next_layer {
            return Err(Error::LayersOutOfOrder {
                hop: at,
                stage,
                start: s.layers.start,
                expected: self.next_layer,
            });
        }
        self.visited[stage] = true;
        self.next_layer = s.layers.end;
        self.visits.push(Visit {
            hop,
            stage,
            layers: s.layers.clone(),
        });
        Ok(())
    }
}
