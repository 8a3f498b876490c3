//! A turn asked of the head: the prompt's ids, its options, and where its tokens go. Prompts typed
//! on the head's stdin and requests to its API wait in one queue; the ring takes them in order.

use daisy_engine::{TurnOptions, VerifyReport};
use tokio::sync::mpsc;

/// One turn waiting for the ring.
pub(crate) struct Job {
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) opts: TurnOptions,
    /// Stop strings (the answer ends before the first of them).
    pub(crate) stop: Vec<String>,
    /// Re-run the turn with every layer on the head and compare.
    pub(crate) verify: bool,
    pub(crate) sink: Sink,
}

/// Where a turn's tokens and result go.
pub(crate) enum Sink {
    /// `--prompt` and stdin: the text on stdout as it comes; the report (`--format json`) after it.
    Stdout,
    /// A client of the head's server; dropping the receiver cancels the turn between two tokens.
    Client(mpsc::UnboundedSender<Streamed>),
}

impl Sink {
    /// The client went away (a job of stdout never does).
    pub(crate) fn gone(&self) -> bool {
        match self {
            Self::Stdout => false,
            Self::Client(tx) => tx.is_closed(),
        }
    }
}

/// What a client receives, in order: tokens' text, then one end.
pub(crate) enum Streamed {
    /// The turn owns the ring now (it waited behind others until then).
    Started,
    Text(String),
    Done(Box<Finished>),
    /// The turn could not complete; the message names why.
    Failed(String),
}

/// Why a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// An end-of-sequence id, a stop string, or a complete JSON value.
    Stop,
    /// The token limit.
    Length,
}

impl Finish {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// A completed turn as a client sees it.
pub(crate) struct Finished {
    pub(crate) text: String,
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) finish: Finish,
    /// Verify's result, when it was asked for and could run.
    pub(crate) verify: Option<VerifyReport>,
    /// Why Verify was asked for and could not run.
    pub(crate) verify_unavailable: Option<String>,
    pub(crate) decode_tokens_per_s: f64,
    /// The median decode lap (from leaving the head to coming back), milliseconds.
    pub(crate) lap_ms: f64,
    /// One hop on the wire (half a heartbeat round trip), milliseconds, when measured.
    pub(crate) hop_ms: Option<f64>,
    /// Hops per lap (the stages of the ring).
    pub(crate) hops: usize,
    /// Where each decode lap's time went.
    pub(crate) picture: Option<Picture>,
    /// Laps run, and lookahead's drafted and kept tokens.
    pub(crate) laps: usize,
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    /// Prompt positions whose keys the stages kept from the previous turn.
    pub(crate) kept_positions: usize,
}

/// Each decode lap of a turn: every stage's compute and the wire's share, milliseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Picture {
    /// The stages, head first.
    pub(crate) stages: Vec<String>,
    /// Per decode lap, per stage (`None`: the member did not report).
    pub(crate) compute_ms: Vec<Vec<Option<f64>>>,
    /// Per decode lap: its time around the ring less the members' compute.
    pub(crate) wire_ms: Vec<f64>,
}
