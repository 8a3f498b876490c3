//! The one error type of `daisy-ring`: why a plan cannot be made, a route is wrong, or a turn event
//! does not fit the turn's state.

use daisy_wire::DeviceId;

use crate::TurnState;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("no devices, expected at least the head")]
    NoDevices,
    #[error("device {0} is listed twice")]
    DuplicateDevice(DeviceId),
    #[error("the model has 0 layers, expected at least 1")]
    NoLayers,
    #[error(
        "the head has {memory} bytes, less than the {needed} bytes of its embedding and lm_head"
    )]
    HeadTooSmall { memory: u64, needed: u64 },
    #[error("the ring can hold {capacity} of the model's {n_layers} layers, expected all of them")]
    NotEnoughMemory { capacity: usize, n_layers: usize },
    #[error(
        "estimated {seconds:.1} s per token exceeds the {budget:.0} s budget; nothing was downloaded"
    )]
    TooSlow { seconds: f64, budget: f64 },
    #[error(transparent)]
    Wire(#[from] daisy_wire::Error),
    #[error("hop {hop} is past the end of a lap of {stages} stages, whose last hop (the return) is {}", stages.saturating_sub(1))]
    HopBeyondLap { hop: usize, stages: usize },
    #[error("route sent hop {hop} to stage {stage}, but the plan has {stages} stages")]
    NoSuchStage {
        hop: usize,
        stage: usize,
        stages: usize,
    },
    #[error("route sent hop {hop} to stage {stage} a second time in one lap")]
    Revisit { hop: usize, stage: usize },
    #[error(
        "route sent hop {hop} to stage {stage}, which starts at layer {start}, expected layer {expected}"
    )]
    LayersOutOfOrder {
        hop: usize,
        stage: usize,
        start: usize,
        expected: usize,
    },
    #[error("route returned to the head at hop {hop} with stages {missing:?} never visited")]
    ReturnedEarly { hop: usize, missing: Vec<usize> },
    #[error("lap did not return to the head within {hops} hops")]
    LapNeverEnds { hops: usize },
    #[error("turn event {event} does not apply in state {state:?}")]
    Transition {
        state: TurnState,
        event: &'static str,
    },
    #[error("the prompt queue is full ({limit} waiting)")]
    QueueFull { limit: usize },
}
