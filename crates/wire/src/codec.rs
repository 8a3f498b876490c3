//! `encode` and `decode`: postcard bytes to and from [`Message`], with every check on the way in.
//!
//! Decoding first reads the bytes into plain mirror types (this module's `Raw*`, the only types that
//! implement `Deserialize` for validated data), then converts them into the public types through the
//! same constructors senders use, so a decoded message is valid by construction. The round-trip
//! property test keeps the mirrors and the public `Serialize` derives in step.

use std::ops::Range;

use serde::Deserialize;

use crate::message::{activation_hash, check_activation_body};
use crate::{
    Activation, Assignment, Cancel, Commit, DeviceId, Error, ErrorReport, Fingerprint, GemmRate,
    Hash, Heartbeat, Hello, HopRecord, LinkIds, Message, PROTOCOL_VERSION, Placement, Plan,
    Positions, ProbeRequest, ProbeResult, Progress, Ready, RepoId, StageSpan, StageTimes, Text,
    TimesRequest, TurnStart, Weights,
};

/// Encodes a message to its postcard bytes.
pub fn encode(message: &Message) -> Vec<u8> {
    // Serializing these types into a growable buffer cannot fail: every sequence has a known length,
    // there are no maps, and no `Serialize` impl of ours returns an error.
    postcard::to_allocvec(message)
        .expect("postcard serialization into a Vec is infallible for Message")
}

/// Decodes and validates a message: the postcard structure (no trailing bytes), then every field's
/// grammar, the plan rules, and an activation's shape, finiteness and integrity hash.
pub fn decode(bytes: &[u8]) -> Result<Message, Error> {
    let (raw, rest): (RawMessage, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|e| Error::Malformed {
            reason: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(Error::TrailingBytes { count: rest.len() });
    }
    raw.into_message()
}

/// The index of `Message::Activation` among the variants (postcard writes it first).
const ACTIVATION_VARIANT: u32 = 7;

/// The turn of an activation's bytes, read from their first two fields only, to route it before
/// the full check: [`decode`] still checks everything when the activation is run. Refused when the
/// bytes do not start as an activation.
pub fn peek_activation_turn(bytes: &[u8]) -> Result<u64, Error> {
    let ((variant, turn), _): ((u32, u64), &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|e| Error::Malformed {
            reason: e.to_string(),
        })?;
    if variant != ACTIVATION_VARIANT {
        return Err(Error::Malformed {
            reason: format!("expected an activation, got message variant {variant}"),
        });
    }
    Ok(turn)
}

/// [`decode`], then refuses a message that carries a model fingerprint other than `expected` (an
/// activation, assignment or ready from a peer holding another model).
pub fn decode_for(bytes: &[u8], expected: &Fingerprint) -> Result<Message, Error> {
    let message = decode(bytes)?;
    if let Some(got) = message.fingerprint()
        && got != expected
    {
        return Err(Error::Fingerprint {
            expected: *expected,
            got: *got,
        });
    }
    Ok(message)
}

#[derive(Deserialize)]
enum RawMessage {
    Hello(RawHello),
    ProbeRequest(ProbeRequest),
    ProbeResult(RawProbeResult),
    Plan(RawPlacement),
    Assignment(RawAssignment),
    Progress(RawProgress),
    Ready(Ready),
    Activation(RawActivation),
    Cancel(Cancel),
    Error(RawErrorReport),
    Heartbeat(Heartbeat),
    Turn(TurnStart),
    Hop(HopRecord),
    Links(LinkIds),
    TimesRequest(TimesRequest),
    StageTimes(RawStageTimes),
}

#[derive(Deserialize)]
struct RawStageTimes {
    turn: u64,
    hop: usize,
    compute_us: Vec<u32>,
}

#[derive(Deserialize)]
struct RawHello {
    protocol: u32,
    device: String,
    memory_bytes: Option<u64>,
    backend: String,
    gemm_rate: f64,
    probe_hash: Hash,
    software: String,
}

#[derive(Deserialize)]
struct RawProbeResult {
    seed: u64,
    hash: Hash,
    gemm_rate: f64,
}

#[derive(Deserialize)]
struct RawPlan {
    n_layers: usize,
    stages: Vec<StageSpan>,
}

#[derive(Deserialize)]
struct RawPlacement {
    plan: RawPlan,
    devices: Vec<String>,
}

#[derive(Deserialize)]
struct RawAssignment {
    repo: String,
    commit: String,
    fingerprint: Fingerprint,
    stage: usize,
    layers: Range<usize>,
    weights: Weights,
}

#[derive(Deserialize)]
struct RawProgress {
    fetched: u64,
    total: u64,
}

#[derive(Deserialize)]
struct RawActivation {
    turn: u64,
    lap: usize,
    hop: usize,
    positions: Positions,
    rows: usize,
    cols: usize,
    data: Vec<f32>,
    fingerprint: Fingerprint,
    hash: Hash,
}

#[derive(Deserialize)]
struct RawErrorReport {
    turn: Option<u64>,
    message: String,
}

impl RawMessage {
    fn into_message(self) -> Result<Message, Error> {
        Ok(match self {
            Self::Hello(h) => {
                if h.protocol != PROTOCOL_VERSION {
                    return Err(Error::Protocol {
                        got: h.protocol,
                        expected: PROTOCOL_VERSION,
                    });
                }
                Message::Hello(Hello {
                    protocol: h.protocol,
                    device: DeviceId::parse(&h.device)?,
                    memory_bytes: h.memory_bytes,
                    backend: Text::new(&h.backend)?,
                    gemm_rate: GemmRate::new(h.gemm_rate)?,
                    probe_hash: h.probe_hash,
                    software: Text::new(&h.software)?,
                })
            }
            Self::ProbeRequest(p) => Message::ProbeRequest(p),
            Self::ProbeResult(p) => Message::ProbeResult(ProbeResult {
                seed: p.seed,
                hash: p.hash,
                gemm_rate: GemmRate::new(p.gemm_rate)?,
            }),
            Self::Plan(p) => {
                let plan = Plan::new(p.plan.n_layers, p.plan.stages)?;
                let devices = p
                    .devices
                    .iter()
                    .map(|d| DeviceId::parse(d))
                    .collect::<Result<Vec<_>, _>>()?;
                Message::Plan(Placement::new(plan, devices)?)
            }
            Self::Assignment(a) => Message::Assignment(
                Assignment::new(
                    RepoId::parse(&a.repo)?,
                    Commit::parse(&a.commit)?,
                    a.fingerprint,
                    a.stage,
                    a.layers,
                )?
                .with_weights(a.weights),
            ),
            Self::Progress(p) => Message::Progress(Progress::new(p.fetched, p.total)?),
            Self::Ready(r) => Message::Ready(r),
            Self::Activation(a) => {
                check_activation_body(a.positions, a.rows, a.cols, &a.data)?;
                let computed = activation_hash(
                    a.turn,
                    a.lap,
                    a.hop,
                    a.positions,
                    a.rows,
                    a.cols,
                    &a.data,
                    &a.fingerprint,
                );
                if computed != a.hash {
                    return Err(Error::Integrity {
                        carried: a.hash,
                        computed,
                    });
                }
                Message::Activation(Activation::from_checked(
                    a.turn,
                    a.lap,
                    a.hop,
                    a.positions,
                    a.rows,
                    a.cols,
                    a.data,
                    a.fingerprint,
                    a.hash,
                ))
            }
            Self::Cancel(c) => Message::Cancel(c),
            Self::Error(e) => Message::Error(ErrorReport {
                turn: e.turn,
                message: Text::new(&e.message)?,
            }),
            Self::Heartbeat(h) => Message::Heartbeat(h),
            Self::Turn(t) => Message::Turn(t),
            Self::Hop(h) => Message::Hop(h),
            Self::Links(l) => Message::Links(l),
            Self::TimesRequest(t) => Message::TimesRequest(t),
            Self::StageTimes(t) => {
                Message::StageTimes(StageTimes::new(t.turn, t.hop, t.compute_us)?)
            }
        })
    }
}
