//! The turn state machine and the replay-once policy, as pure types.
//!
//! One turn (one prompt's generation) owns the ring at a time; a prompt submitted meanwhile waits in
//! a bounded queue. A dropped peer or a stalled lap is replanned without the device at fault and the
//! turn replayed once from the start; a second failure in the same turn is final.

use std::collections::VecDeque;

use daisy_wire::DeviceId;

use crate::Error;

/// Identifies a turn; assigned by [`Turns::submit`], increasing from 1.
pub type TurnId = u64;

/// A failure during a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A peer's connection dropped.
    PeerDropped(DeviceId),
    /// A lap did not come back in time; `device` held the activation when the timer ran out.
    LapStalled { device: Option<DeviceId> },
}

impl Failure {
    /// The device to leave out of the new plan.
    pub fn culprit(&self) -> Option<&DeviceId> {
        match self {
            Self::PeerDropped(d) => Some(d),
            Self::LapStalled { device } => device.as_ref(),
        }
    }
}

/// What to do about a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Replan without `without` and replay the turn from its first lap.
    ReplanAndReplay { without: Option<DeviceId> },
    /// The turn has failed for good.
    GiveUp,
}

/// Replay once: the first failure of a turn is replayed, the second is final.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayPolicy {
    replayed: bool,
}

impl ReplayPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides, and remembers that the replay has been spent.
    pub fn on_failure(&mut self, failure: &Failure) -> Decision {
        if self.replayed {
            return Decision::GiveUp;
        }
        self.replayed = true;
        Decision::ReplanAndReplay {
            without: failure.culprit().cloned(),
        }
    }

    pub fn has_replayed(&self) -> bool {
        self.replayed
    }
}

/// Why a turn failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// The replay failed too; the last failure.
    Failed(Failure),
    Cancelled,
}

/// Where the ring is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnState {
    /// No turn.
    Idle,
    /// Planning and loading for `turn`.
    Preparing {
        turn: TurnId,
    },
    /// Laps of `turn` are running; `lap` laps have completed.
    Running {
        turn: TurnId,
        lap: usize,
        replayed: bool,
    },
    /// Replanning without `without` after a failure, before replaying `turn` from the start.
    Replaying {
        turn: TurnId,
        without: Option<DeviceId>,
    },
    Done {
        turn: TurnId,
    },
    Failed {
        turn: TurnId,
        reason: FailReason,
    },
}

impl TurnState {
    /// The turn that owns the ring (or last owned it), if any.
    pub fn turn(&self) -> Option<TurnId> {
        match self {
            Self::Idle => None,
            Self::Preparing { turn }
            | Self::Running { turn, .. }
            | Self::Replaying { turn, .. }
            | Self::Done { turn }
            | Self::Failed { turn, .. } => Some(*turn),
        }
    }

    /// True while a turn owns the ring.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Self::Preparing { .. } | Self::Running { .. } | Self::Replaying { .. }
        )
    }
}

/// What happened to the turn that owns the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Plan made and weights loaded (after Preparing or Replaying): the laps may start.
    Ready,
    /// One lap came back to the head.
    LapDone,
    /// The turn produced its last token.
    Finished,
    Failure(Failure),
    Cancel,
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::LapDone => "lap-done",
            Self::Finished => "finished",
            Self::Failure(_) => "failure",
            Self::Cancel => "cancel",
        }
    }
}

/// Answer to [`Turns::submit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The turn owns the ring now (state `Preparing`).
    Started(TurnId),
    /// The turn waits; `ahead` turns are before it in the queue.
    Queued { turn: TurnId, ahead: usize },
}

/// The turn state machine: one turn owns the ring, the others wait in order.
#[derive(Clone, Debug)]
pub struct Turns {
    state: TurnState,
    queue: VecDeque<TurnId>,
    max_queue: usize,
    next_id: TurnId,
    policy: ReplayPolicy,
}

impl Turns {
    /// A machine whose queue holds at most `max_queue` waiting prompts.
    pub fn new(max_queue: usize) -> Self {
        Self {
            state: TurnState::Idle,
            queue: VecDeque::new(),
            max_queue,
            next_id: 1,
            policy: ReplayPolicy::new(),
        }
    }

    pub fn state(&self) -> &TurnState {
        &self.state
    }

    /// Turns waiting, in order.
    pub fn waiting(&self) -> impl Iterator<Item = TurnId> + '_ {
        self.queue.iter().copied()
    }

    /// A new prompt: it takes the ring if nothing owns it and nothing waits, else it waits.
    pub fn submit(&mut self) -> Result<Admission, Error> {
        if !self.state.is_busy() && self.queue.is_empty() {
            let turn = self.take_id();
            self.start(turn);
            return Ok(Admission::Started(turn));
        }
        if self.queue.len() >= self.max_queue {
            return Err(Error::QueueFull {
                limit: self.max_queue,
            });
        }
        let turn = self.take_id();
        self.queue.push_back(turn);
        Ok(Admission::Queued {
            turn,
            ahead: self.queue.len() - 1,
        })
    }

    /// After `Done` or `Failed` (or in `Idle`): the next waiting turn takes the ring, or the machine
    /// goes idle. Returns the turn started, if any.
    pub fn advance(&mut self) -> Result<Option<TurnId>, Error> {
        if self.state.is_busy() {
            return Err(Error::Transition {
                state: self.state.clone(),
                event: "advance",
            });
        }
        match self.queue.pop_front() {
            Some(turn) => {
                self.start(turn);
                Ok(Some(turn))
            }
            None => {
                self.state = TurnState::Idle;
                Ok(None)
            }
        }
    }

    /// Applies an event to the turn that owns the ring. An event that does not fit the state is
    /// refused and changes nothing. A failure's decision (replay or give up) is returned.
    pub fn on(&mut self, event: Event) -> Result<Option<Decision>, Error> {
        use TurnState as S;
        let refuse = |state: &TurnState, event: &Event| Error::Transition {
            state: state.clone(),
            event: event.name(),
        };
        let (next, decision) = match (&self.state, &event) {
            (S::Preparing { turn }, Event::Ready) => (
                S::Running {
                    turn: *turn,
                    lap: 0,
                    replayed: false,
                },
                None,
            ),
            (S::Replaying { turn, .. }, Event::Ready) => (
                S::Running {
                    turn: *turn,
                    lap: 0,
                    replayed: true,
                },
                None,
            ),
            (
                S::Running {
                    turn,
                    lap,
                    replayed,
                },
                Event::LapDone,
            ) => (
                S::Running {
                    turn: *turn,
                    lap: lap + 1,
                    replayed: *replayed,
                },
                None,
            ),
            (S::Running { turn, .. }, Event::Finished) => (S::Done { turn: *turn }, None),
            (
                S::Preparing { turn } | S::Running { turn, .. } | S::Replaying { turn, .. },
                Event::Failure(f),
            ) => {
                let decision = self.policy.on_failure(f);
                let next = match &decision {
                    Decision::ReplanAndReplay { without } => S::Replaying {
                        turn: *turn,
                        without: without.clone(),
                    },
                    Decision::GiveUp => S::Failed {
                        turn: *turn,
                        reason: FailReason::Failed(f.clone()),
                    },
                };
                (next, Some(decision))
            }
            (
                S::Preparing { turn } | S::Running { turn, .. } | S::Replaying { turn, .. },
                Event::Cancel,
            ) => (
                S::Failed {
                    turn: *turn,
                    reason: FailReason::Cancelled,
                },
                None,
            ),
            (state, event) => return Err(refuse(state, event)),
        };
        self.state = next;
        Ok(decision)
    }

    fn take_id(&mut self) -> TurnId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn start(&mut self, turn: TurnId) {
        self.state = TurnState::Preparing { turn };
        self.policy = ReplayPolicy::new();
    }
}
