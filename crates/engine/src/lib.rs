//! The synchronous engine the node and the conformance suite share: open a model, choose a backend,
//! load a plan's stages and check them against it, step one lap, and drive a turn — each token
//! reported as it is produced, the turn cancellable between tokens, the result a typed report.
//!
//! Architecture invariant: no async and no networking. The networked ring (in `node`) calls
//! [`Member::step`] on the bytes its data channels deliver and hands [`generate_turn`] a lap that
//! crosses processes; [`LocalRing`] plays the same steps in one process.

mod backend;
mod conversation;
mod error;
mod lap;
mod notes;
mod open;
mod stages;
mod stop;
mod turn;

pub use backend::{ChosenBackend, choose_backend};
pub use conversation::Conversation;
pub use error::{Context, Error, Result};
pub use lap::{
    Hop, LapHeader, LocalRing, Member, Sent, receive_at_head, returned, send, sha256_f32,
};
pub use notes::{name_notes, note};
pub use open::{Encoder, Opened, Prompt, open, tokenizer_of};
pub use stages::{
    MaxResident, check_max_resident, check_stages, load_layers, load_stage, load_stages,
    onto_backend, shard_path, warm_up,
};
pub use stop::{MAX_STOP_STRINGS, StopScan};
pub use turn::{
    BackendReport, Difference, Generated, HopReport, LOOKAHEAD_DRAFTS, PathChoice, SplitRun,
    Timings, TokenEvent, TurnOptions, TurnReport, VerifyReport, generate_turn, peak_rss_bytes,
    plan_ranges, rss_bytes, verify,
};

pub use daisy_model::{ForwardPath, Precision, Resume, Sampling};
pub use daisy_wgsl::BackendChoice;
