//! The plan (who holds which layers), its validation, the pure router and the turn state machine.
//! No I/O and no async.
//!
//! The plan type and its structural rules live in `daisy-wire` (decoding must refuse a bad plan, and
//! `wire` cannot depend on this crate); they are re-exported here.

mod error;
mod planner;
mod route;
mod turn;

pub use daisy_wire::{Plan, StageSpan, Violation};

pub use error::Error;
pub use planner::{
    DeviceInfo, Excluded, Exclusion, Layout, ModelFacts, PlanDecision, TOKEN_BUDGET_SECONDS,
    plan_layers, seconds_per_token,
};
pub use route::{Next, Visit, route, walk_lap, walk_lap_with};
pub use turn::{
    Admission, Decision, Event, FailReason, Failure, ReplayPolicy, TurnId, TurnState, Turns,
};

/// Checks stages against the plan rules (DESIGN §4) for a model of `n_layers` layers and returns
/// every violation: stages in ring order, stage 0 the head, layers `0..n_layers` covered exactly
/// once, in order, as contiguous ranges, only the head may hold zero layers. A [`Plan`] is valid by
/// construction; this checks a proposal before one is built.
pub fn validate(n_layers: usize, stages: &[StageSpan]) -> Result<(), Vec<Violation>> {
    daisy_wire::validate_stages(n_layers, stages)
}
