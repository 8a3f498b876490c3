//! The one error type of `daisy-wire`: every reason a message, a frame or a field is refused.

use std::ops::Range;

use crate::{Fingerprint, Hash, Violations};

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("malformed message: {reason}")]
    Malformed { reason: String },
    #[error("{count} bytes left over after the message, expected none")]
    TrailingBytes { count: usize },
    #[error("protocol version {got}, expected {expected}")]
    Protocol { got: u32, expected: u32 },
    #[error("repo id {id:?} refused: {reason}")]
    RepoId { id: String, reason: String },
    #[error("revision {revision:?} refused: {reason}")]
    Revision { revision: String, reason: String },
    #[error("commit {commit:?} refused, expected 40 or 64 lowercase hex digits")]
    Commit { commit: String },
    #[error("device id {id:?} refused, expected 1 to 64 characters of A-Z a-z 0-9 _ - .")]
    DeviceId { id: String },
    #[error("text of {len} bytes refused: {reason}")]
    Text { len: usize, reason: &'static str },
    #[error("digest {value:?} refused, expected 64 hex digits")]
    Digest { value: String },
    #[error("gemm rate {rate} refused, expected a finite positive number")]
    GemmRate { rate: f64 },
    #[error("plan refused: {0}")]
    Plan(Violations),
    #[error("placement refused: {reason}")]
    Placement { reason: String },
    #[error(
        "assignment of layers {layers:?} to stage {stage} refused, expected a non-empty range (empty only for the head)"
    )]
    Assignment { stage: usize, layers: Range<usize> },
    #[error("progress {fetched} of {total} bytes refused, expected fetched <= total")]
    Progress { fetched: u64, total: u64 },
    #[error("stage times of {count} steps refused, at most {max}")]
    Times { count: usize, max: usize },
    #[error("activation shape {rows}x{cols} does not match its {len} values")]
    Shape {
        rows: usize,
        cols: usize,
        len: usize,
    },
    #[error("activation positions {start}+{count} do not match its {rows} rows")]
    Positions {
        start: usize,
        count: usize,
        rows: usize,
    },
    #[error("activation value {value} at index {index} is not finite")]
    NonFinite { index: usize, value: f32 },
    #[error("activation integrity hash {carried} does not match the recomputed {computed}")]
    Integrity { carried: Hash, computed: Hash },
    #[error("model fingerprint {got} is not this model's {expected}")]
    Fingerprint {
        expected: Fingerprint,
        got: Fingerprint,
    },
    #[error("frame of {len} bytes is truncated, expected {expected}")]
    FrameTruncated { len: usize, expected: usize },
    #[error("frame of {len} bytes is larger than the {limit}-byte limit")]
    FrameTooLarge { len: usize, limit: usize },
    #[error("frame of message {message_id} refused: {reason}")]
    FrameInconsistent { message_id: u64, reason: String },
    #[error("message of {len} bytes is larger than the {limit}-byte limit")]
    Oversized { len: u64, limit: u64 },
    #[error("too many messages in flight, at most {limit}")]
    TooManyInFlight { limit: usize },
}
