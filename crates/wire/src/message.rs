//! The messages that cross between peers, and the activation with its integrity hash.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Commit, DeviceId, Error, Fingerprint, GemmRate, Hash, Plan, RepoId, Text};

/// Version of this protocol; a `Hello` with another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Everything that crosses between peers. The variant order is the wire format: append, never
/// reorder.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Message {
    /// A peer introduces itself and its capabilities.
    Hello(Hello),
    /// The head asks a peer to run the seeded kernel probe.
    ProbeRequest(ProbeRequest),
    /// The probe's output hash and the measured rate.
    ProbeResult(ProbeResult),
    /// The ring: the plan and which device holds each stage.
    Plan(Placement),
    /// What one device must load.
    Assignment(Assignment),
    /// Bytes of its layers a device has fetched so far.
    Progress(Progress),
    /// A device has loaded its layers and computed the fingerprint.
    Ready(Ready),
    /// Hidden states passed to the next stage.
    Activation(Activation),
    /// Stop a turn.
    Cancel(Cancel),
    /// A peer reports a failure.
    Error(ErrorReport),
    /// Liveness.
    Heartbeat(Heartbeat),
    /// The head opens a turn: its number and the path its laps take.
    Turn(TurnStart),
    /// A member reports the hash of the hidden state it sent on the first lap of a turn.
    Hop(HopRecord),
    /// The head names the links (by their signaling ids) a member receives from and sends on.
    Links(LinkIds),
    /// The head asks a member for the compute time of each of its steps in a turn.
    TimesRequest(TimesRequest),
    /// A member's compute time of each step of a turn, in the order it ran them.
    StageTimes(StageTimes),
}

impl Message {
    /// The model fingerprint the message carries, when it carries one.
    pub fn fingerprint(&self) -> Option<&Fingerprint> {
        match self {
            Self::Activation(a) => Some(a.fingerprint()),
            Self::Assignment(a) => Some(&a.fingerprint),
            Self::Ready(r) => Some(&r.fingerprint),
            _ => None,
        }
    }

    /// A short name of the variant, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::ProbeRequest(_) => "probe-request",
            Self::ProbeResult(_) => "probe-result",
            Self::Plan(_) => "plan",
            Self::Assignment(_) => "assignment",
            Self::Progress(_) => "progress",
            Self::Ready(_) => "ready",
            Self::Activation(_) => "activation",
            Self::Cancel(_) => "cancel",
            Self::Error(_) => "error",
            Self::Heartbeat(_) => "heartbeat",
            Self::Turn(_) => "turn",
            Self::Hop(_) => "hop",
            Self::Links(_) => "links",
            Self::TimesRequest(_) => "times-request",
            Self::StageTimes(_) => "stage-times",
        }
    }
}

/// A peer's introduction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hello {
    /// Must be [`PROTOCOL_VERSION`]; first field so any version can read it.
    pub protocol: u32,
    pub device: DeviceId,
    /// Memory available for weights, `None` when the device cannot tell.
    pub memory_bytes: Option<u64>,
    /// Backend name (`cpu`, or the wgpu adapter).
    pub backend: Text,
    pub gemm_rate: GemmRate,
    /// SHA-256 of the default probe's output.
    pub probe_hash: Hash,
    /// Software version.
    pub software: Text,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRequest {
    pub seed: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeResult {
    pub seed: u64,
    pub hash: Hash,
    pub gemm_rate: GemmRate,
}

/// The plan and the device of each stage, head first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    plan: Plan,
    devices: Vec<DeviceId>,
}

impl Placement {
    /// Refused unless there is exactly one device per stage and no device appears twice.
    pub fn new(plan: Plan, devices: Vec<DeviceId>) -> Result<Self, Error> {
        if devices.len() != plan.len() {
            return Err(Error::Placement {
                reason: format!("{} devices for {} stages", devices.len(), plan.len()),
            });
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::Placement {
                    reason: format!("device {d} holds two stages"),
                });
            }
        }
        Ok(Self { plan, devices })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The device of each stage, head first.
    pub fn devices(&self) -> &[DeviceId] {
        &self.devices
    }

    /// The stage index `device` holds.
    pub fn stage_of(&self, device: &DeviceId) -> Option<usize> {
        self.devices.iter().position(|d| d == device)
    }
}

/// How a stage holds its weights and forms its products (DESIGN.md §3): the ring runs one precision.
/// On the wire a byte, 0 and 1 as the boolean "f32" of earlier versions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Weights {
    /// int8, every product through the verified GEMM.
    #[default]
    Int8,
    /// The f32 reference.
    F32,
    /// Two int8 planes per operand (§3.9).
    Int8x2,
}

/// What one device must load: `layers` of the model at `repo`@`commit`, as stage `stage`
/// (0 = the head, which also loads the embedding and lm_head), with its weights held as `weights`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Assignment {
    repo: RepoId,
    commit: Commit,
    fingerprint: Fingerprint,
    stage: usize,
    layers: Range<usize>,
    weights: Weights,
}

impl Assignment {
    /// Refused when the range is reversed, or empty for a stage other than the head.
    pub fn new(
        repo: RepoId,
        commit: Commit,
        fingerprint: Fingerprint,
        stage: usize,
        layers: Range<usize>,
    ) -> Result<Self, Error> {
        if layers.end < layers.start || (stage > 0 && layers.is_empty()) {
            return Err(Error::Assignment { stage, layers });
        }
        Ok(Self {
            repo,
            commit,
            fingerprint,
            stage,
            layers,
            weights: Weights::Int8,
        })
    }

    /// The same assignment with its weights held as `weights`.
    pub fn with_weights(mut self, weights: Weights) -> Self {
        self.weights = weights;
        self
    }

    /// How the stage holds its weights.
    pub fn weights(&self) -> Weights {
        self.weights
    }

    pub fn repo(&self) -> &RepoId {
        &self.repo
    }

    pub fn commit(&self) -> &Commit {
        &self.commit
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    pub fn stage(&self) -> usize {
        self.stage
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }
}

/// Bytes fetched so far out of the total a device must fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Progress {
    fetched: u64,
    total: u64,
}

impl Progress {
    /// Refused when `fetched > total`.
    pub fn new(fetched: u64, total: u64) -> Result<Self, Error> {
        if fetched > total {
            return Err(Error::Progress { fetched, total });
        }
        Ok(Self { fetched, total })
    }

    pub fn fetched(&self) -> u64 {
        self.fetched
    }

    pub fn total(&self) -> u64 {
        self.total
    }
}

/// A device has loaded its assignment; `fingerprint` is the one it computed itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub fingerprint: Fingerprint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub turn: u64,
}

/// A failure a peer reports, with the turn it concerns when there is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorReport {
    pub turn: Option<u64>,
    pub message: Text,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub seq: u64,
}

/// The start of a turn: every activation of turn `turn` runs the cached path (per-stage KV, a lap
/// at position 0 starting a new cache) when `cached`, the full-window path otherwise. With
/// `continues`, the turn keeps the keys that turn wrote (a chat's next turn): a member whose cache
/// is another turn's refuses it; without, a member drops the keys it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    pub turn: u64,
    pub cached: bool,
    pub continues: Option<u64>,
}

/// What a member sent on the first lap of turn `turn` as hop `hop`: the layer after which the state
/// was sent, and SHA-256 over its exact f32 bits (the hop hashes a report and Verify compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HopRecord {
    pub turn: u64,
    pub hop: usize,
    pub after_layer: usize,
    pub sha256: Hash,
}

/// The signaling ids of the two ring links of a member under the current plan: the one from the
/// stage before it (`up`) and the one to the stage after it (`down`). Links of an earlier plan,
/// whatever their state, are not these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkIds {
    pub up: u64,
    pub down: u64,
}

/// The head asks for a member's step times of turn `turn` (after the turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimesRequest {
    pub turn: u64,
}

/// The most steps one [`StageTimes`] reports.
pub const MAX_TIMED_STEPS: usize = 16384;

/// How long each step (one activation through its layers) of turn `turn` took on the member that
/// is hop `hop`, in microseconds, in the order it ran them: the page's picture of compute vs wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageTimes {
    turn: u64,
    hop: usize,
    compute_us: Vec<u32>,
}

impl StageTimes {
    /// Refused beyond [`MAX_TIMED_STEPS`] steps.
    pub fn new(turn: u64, hop: usize, compute_us: Vec<u32>) -> Result<Self, Error> {
        if compute_us.len() > MAX_TIMED_STEPS {
            return Err(Error::Times {
                count: compute_us.len(),
                max: MAX_TIMED_STEPS,
            });
        }
        Ok(Self {
            turn,
            hop,
            compute_us,
        })
    }

    pub fn turn(&self) -> u64 {
        self.turn
    }

    pub fn hop(&self) -> usize {
        self.hop
    }

    pub fn compute_us(&self) -> &[u32] {
        &self.compute_us
    }
}

/// Token positions the rows of an activation stand for: `start..start + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Positions {
    pub start: usize,
    pub count: usize,
}

impl Positions {
    pub fn new(start: usize, count: usize) -> Self {
        Self { start, count }
    }
}

/// Hidden states on their way around the ring: `rows × cols` f32 in row-major order, one row per
/// position, with the model fingerprint and a SHA-256 over every header field and the exact bits of
/// the payload. Valid by construction: the shape matches the payload, every value is finite and the
/// hash is the one [`Activation::new`] computed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Activation {
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

/// Domain tag at the start of every activation hash.
const ACTIVATION_TAG: &[u8] = b"daisy-activation-v1";

/// SHA-256 over the tag, each header field as a little-endian u64, the fingerprint, then each f32's
/// bits little-endian (so `-0.0` and `+0.0`, or two values one ulp apart, hash differently).
#[allow(clippy::too_many_arguments)]
pub(crate) fn activation_hash(
    turn: u64,
    lap: usize,
    hop: usize,
    positions: Positions,
    rows: usize,
    cols: usize,
    data: &[f32],
    fingerprint: &Fingerprint,
) -> Hash {
    let mut h = Sha256::new();
    h.update(ACTIVATION_TAG);
    for field in [
        turn,
        lap as u64,
        hop as u64,
        positions.start as u64,
        positions.count as u64,
        rows as u64,
        cols as u64,
    ] {
        h.update(field.to_le_bytes());
    }
    h.update(fingerprint.0);
    let mut buf = Vec::with_capacity(4096);
    for chunk in data.chunks(1024) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|x| x.to_bits().to_le_bytes()));
        h.update(&buf);
    }
    Hash(h.finalize().into())
}

/// Checks shape, positions and finiteness (everything but the hash).
pub(crate) fn check_activation_body(
    positions: Positions,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> Result<(), Error> {
    if rows.checked_mul(cols) != Some(data.len()) {
        return Err(Error::Shape {
            rows,
            cols,
            len: data.len(),
        });
    }
    if positions.count != rows || positions.start.checked_add(positions.count).is_none() {
        return Err(Error::Positions {
            start: positions.start,
            count: positions.count,
            rows,
        });
    }
    if let Some(index) = data.iter().position(|x| !x.is_finite()) {
        return Err(Error::NonFinite {
            index,
            value: data[index],
        });
    }
    Ok(())
}

impl Activation {
    /// Builds an activation and computes its integrity hash. Refused when `rows × cols` is not
    /// `data.len()`, when `positions.count` is not `rows`, or when a value is not finite.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        turn: u64,
        lap: usize,
        hop: usize,
        positions: Positions,
        rows: usize,
        cols: usize,
        data: Vec<f32>,
        fingerprint: Fingerprint,
    ) -> Result<Self, Error> {
        check_activation_body(positions, rows, cols, &data)?;
        let hash = activation_hash(turn, lap, hop, positions, rows, cols, &data, &fingerprint);
        Ok(Self {
            turn,
            lap,
            hop,
            positions,
            rows,
            cols,
            data,
            fingerprint,
            hash,
        })
    }

    /// Used by decoding after it has checked the body and the hash.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_checked(
        turn: u64,
        lap: usize,
        hop: usize,
        positions: Positions,
        rows: usize,
        cols: usize,
        data: Vec<f32>,
        fingerprint: Fingerprint,
        hash: Hash,
    ) -> Self {
        Self {
            turn,
            lap,
            hop,
            positions,
            rows,
            cols,
            data,
            fingerprint,
            hash,
        }
    }

    /// The turn (one prompt's generation) this activation belongs to.
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The lap within the turn (one forward pass around the ring).
    pub fn lap(&self) -> usize {
        self.lap
    }

    /// The hop within the lap: hop `h` carries what stage `h` produced, and
    /// `daisy_ring::route(plan, hop)` names who consumes it (the next stage, or the head's return).
    pub fn hop(&self) -> usize {
        self.hop
    }

    pub fn positions(&self) -> Positions {
        self.positions
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The payload, `rows × cols` row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Takes the payload out.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The integrity hash (SHA-256 over the header fields and the exact f32 bits).
    pub fn hash(&self) -> Hash {
        self.hash
    }

    /// Refused unless the activation carries `expected` as its model fingerprint.
    pub fn check_fingerprint(&self, expected: &Fingerprint) -> Result<(), Error> {
        if &self.fingerprint != expected {
            return Err(Error::Fingerprint {
                expected: *expected,
                got: self.fingerprint,
            });
        }
        Ok(())
    }
}
