//! What the head's page shows of the ring, kept up to date by the head as it admits, plans, loads
//! and runs turns, and served as JSON at `/api/ring`. It holds no secret and no token.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// The ring as the page draws it.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct View {
    pub(crate) model: String,
    /// `waiting for members`, `loading`, `ready`, `generating`, `replaying`, or `stopped`.
    pub(crate) state: String,
    /// Every device the head has heard of, the head first.
    pub(crate) devices: Vec<DeviceView>,
    /// The ring's order: the head, then stage 1, 2, ….
    pub(crate) ring: Vec<String>,
    pub(crate) excluded: Vec<String>,
    /// The plan's estimate of one token's compute.
    pub(crate) seconds_per_token: Option<f64>,
    /// Turns replayed without a member that failed.
    pub(crate) replays: u64,
    pub(crate) turns: u64,
    /// Turns waiting for the ring.
    pub(crate) queued: usize,
    /// The last error that stopped a turn or the ring.
    pub(crate) error: Option<String>,
    /// Milliseconds of one hop on the wire (half a heartbeat round trip), when measured.
    pub(crate) hop_ms: Option<f64>,
    /// A Hugging Face token the head needs for its own requests (the page asks for it).
    pub(crate) token_request: Option<super::page::TokenRequest>,
    /// The head holds a token given on the page (never the token itself).
    pub(crate) token_held: bool,
}

/// One device.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct DeviceView {
    pub(crate) name: String,
    pub(crate) head: bool,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) backend: String,
    pub(crate) adapter: Option<String>,
    /// Measured GEMM rate, multiply-accumulates per second.
    pub(crate) gemm_rate: f64,
    /// `passed`, or why it was left out.
    pub(crate) probe: String,
    /// `[first, end)` of the layers it holds.
    pub(crate) layers: Option<[usize; 2]>,
    pub(crate) stage: Option<usize>,
    pub(crate) fetched: u64,
    pub(crate) total: u64,
    /// Bytes per second of its download so far.
    pub(crate) rate: f64,
    pub(crate) ready: bool,
    /// `in the ring`, `waiting`, `left out: …` or `dropped: …`.
    pub(crate) status: String,
    #[serde(skip)]
    pub(crate) fetch_started: Option<Instant>,
}

/// The view, shared between the head's ring and its server.
#[derive(Clone, Default)]
pub(crate) struct SharedView(Arc<Mutex<View>>);

impl SharedView {
    pub(crate) fn update(&self, f: impl FnOnce(&mut View)) {
        f(&mut self.0.lock().expect("view lock"));
    }

    pub(crate) fn snapshot(&self) -> View {
        self.0.lock().expect("view lock").clone()
    }

    /// Change the device named `name` (added when new).
    pub(crate) fn device(&self, name: &str, f: impl FnOnce(&mut DeviceView)) {
        self.update(|v| {
            let at = match v.devices.iter().position(|d| d.name == name) {
                Some(i) => i,
                None => {
                    v.devices.push(DeviceView {
                        name: name.to_string(),
                        status: "waiting".into(),
                        ..DeviceView::default()
                    });
                    v.devices.len() - 1
                }
            };
            f(&mut v.devices[at]);
        });
    }

    pub(crate) fn state(&self, state: &str) {
        self.update(|v| v.state = state.to_string());
    }
}
