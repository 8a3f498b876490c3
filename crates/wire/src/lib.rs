//! Every message that crosses between peers: postcard-encoded, framed, and validated on decode.
//!
//! Architecture invariant: no I/O and no async. Decoding refuses anything that could make the ring
//! produce fluent, wrong text: a plan that does not cover each layer exactly once, a malformed repo
//! id, an activation whose bits differ from what its sender hashed, or one from another model.

mod codec;
mod error;
mod frame;
mod ids;
mod message;
mod plan;

pub use codec::{decode, decode_for, encode, peek_activation_turn};
pub use error::Error;
pub use frame::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_MESSAGE_BYTES, FRAME_HEADER_BYTES, Frame, MAX_FRAME_BYTES,
    MAX_FRAME_PAYLOAD, Reassembler, encode_frames, split,
};
pub use ids::{
    Commit, DeviceId, Fingerprint, GemmRate, Hash, MAX_DEVICE_ID, MAX_REPO_PART, MAX_REVISION,
    MAX_TEXT, ModelRef, RepoId, Revision, Text,
};
pub use message::{
    Activation, Assignment, Cancel, ErrorReport, Heartbeat, Hello, HopRecord, LinkIds,
    MAX_TIMED_STEPS, Message, PROTOCOL_VERSION, Placement, Positions, ProbeRequest, ProbeResult,
    Progress, Ready, StageTimes, TimesRequest, TurnStart, Weights,
};
pub use plan::{Plan, StageSpan, Violation, Violations, validate_stages};
