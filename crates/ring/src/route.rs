//! The pure router: who consumes the activation of each hop of a lap, and `walk_lap`, which walks a
//! lap through a router and checks it visits every stage once, in layer order, and ends.
//!
//! The head is both stage 0 and the ring's terminus. A lap is hops `0..=n` for `n` stages: hop 0
//! starts the lap at the head's own layers (`Next::Stage(0)`), hop `i` goes to stage `i`, and hop `n`
//! is the return leg (`Next::Return`), where the head applies the lm_head. The return has its own
//! address: addressing it as "stage 0" made the head re-run its layers and the lap never closed
//! (GUIDE, "One bug, and what it cost to find").

use std::ops::Range;

use daisy_wire::Plan;

use crate::Error;

/// Who consumes the activation of a hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Next {
    /// Stage `i` runs its layers on it (`Stage(0)` only at the start of a lap).
    Stage(usize),
    /// The lap is over: the head applies the final norm and lm_head.
    Return,
}

/// The consumer of hop `hop` of a lap over `plan`. Refused past the return leg.
pub fn route(plan: &Plan, hop: usize) -> Result<Next, Error> {
    let stages = plan.len();
    match hop {
        h if h < stages => Ok(Next::Stage(h)),
        h if h == stages => Ok(Next::Return),
        _ => Err(Error::HopBeyondLap { hop, stages }),
    }
}

/// One stage visited by a lap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visit {
    pub hop: usize,
    pub stage: usize,
    pub layers: Range<usize>,
}

/// Walks a lap with [`route`]; see [`walk_lap_with`].
pub fn walk_lap(plan: &Plan) -> Result<Vec<Visit>, Error> {
    walk_lap_with(plan, route)
}

/// Walks a lap from hop 0 through `route` until it returns to the head, and checks that every stage
/// is visited exactly once, that the layers run in order `0..n_layers`, and that the lap ends within
/// `stages + 1` hops. The router is a parameter so a broken one can be shown to fail.
pub fn walk_lap_with(
    plan: &Plan,
    route: impl Fn(&Plan, usize) -> Result<Next, Error>,
) -> Result<Vec<Visit>, Error> {
    let stages = plan.len();
    let mut visited = vec![false; stages];
    let mut visits = Vec::with_capacity(stages);
    let mut next_layer = 0;
    for hop in 0..=stages {
        match route(plan, hop)? {
            Next::Stage(stage) => {
                let Some(s) = plan.stages().get(stage) else {
                    return Err(Error::NoSuchStage { hop, stage, stages });
                };
                if visited[stage] {
                    return Err(Error::Revisit { hop, stage });
                }
                if s.layers.start != next_layer {
                    return Err(Error::LayersOutOfOrder {
                        hop,
                        stage,
                        start: s.layers.start,
                        expected: next_layer,
                    });
                }
                visited[stage] = true;
                next_layer = s.layers.end;
                visits.push(Visit {
                    hop,
                    stage,
                    layers: s.layers.clone(),
                });
            }
            Next::Return => {
                let missing: Vec<usize> = (0..stages).filter(|&i| !visited[i]).collect();
                if !missing.is_empty() || next_layer != plan.n_layers() {
                    return Err(Error::ReturnedEarly { hop, missing });
                }
                return Ok(visits);
            }
        }
    }
    Err(Error::LapNeverEnds { hops: stages + 1 })
}
