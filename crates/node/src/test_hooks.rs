//! Tests only (`--features test-hooks`, which `cargo xtask ci` turns on; a release has none of it):
//!
//! - `DAISY_TEST_CORRUPT_KERNEL=1`: a member's integer GEMM is wrong by one in the last accumulator,
//!   so its probe disagrees with every correct device.
//! - `DAISY_TEST_DUMP_SENT=FILE`: every byte this process sends to a peer (each link frame, each
//!   signaling message) is appended to FILE, so a test can look for a secret in it.
//! - `DAISY_TEST_DROP_LAYER=1`: a member loads its assigned layers but the first, and runs the rest
//!   as if they were all (a stage that silently drops a layer: Verify must catch it).
//! - `DAISY_TEST_VERIFY_FRESH=1`: the head's Verify recomputes a turn that continued a
//!   conversation's keys as a fresh prompt (the conversation's passes not replayed), so it must
//!   report a mismatch: the mutation of the KV-reuse test.
//! - `DAISY_TEST_KILL_AT_FETCHED=PERCENT`: a member kills itself (SIGKILL: no destructor, no
//!   handler runs) once that share of its layers' bytes is fetched — a crash mid-download.
//! - `DAISY_TEST_SLOW_STEPS=MS`: a member's first two steps each take MS milliseconds longer (a
//!   GPU that compiles its shaders on first use), so the link they came on must go on answering.
//! - `DAISY_TEST_ABANDON_LINK=1`: a member gives up the first attempt at each ring link it offers
//!   as soon as its side opens, and offers it again (at once to the head, three seconds later to a
//!   member, which is reading the old one by then): what a member whose side of the handshake
//!   timed out does while the peer's side opened all the same.
//! - `DAISY_TEST_PACE_STEPS=MS`: every step of a member starts MS milliseconds late, so that an
//!   answer streams over time however busy the machine (the page test's streaming check).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use daisy_gemm_int8::{Backend, Error, Quantized, Rhs};

struct Corrupt(Arc<dyn Backend>);

impl Backend for Corrupt {
    fn name(&self) -> String {
        format!("{} (corrupted for a test)", self.0.name())
    }

    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
        self.0.gemm_i32(a, b, out)?;
        if let Some(last) = out.last_mut() {
            *last = last.wrapping_add(1);
        }
        Ok(())
    }
}

/// `backend`, corrupted when `DAISY_TEST_CORRUPT_KERNEL` is set.
pub(crate) fn corrupt(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    if std::env::var_os("DAISY_TEST_CORRUPT_KERNEL").is_some() {
        eprintln!("join: DAISY_TEST_CORRUPT_KERNEL is set: this member's GEMM is wrong on purpose");
        Arc::new(Corrupt(backend))
    } else {
        backend
    }
}

/// Append `bytes` to `$DAISY_TEST_DUMP_SENT` when it is set.
pub(crate) fn dump_sent(bytes: &[u8]) {
    static DUMP: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    let dump = DUMP.get_or_init(|| {
        let path = std::env::var_os("DAISY_TEST_DUMP_SENT")?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()?;
        Some(Mutex::new(file))
    });
    if let Some(file) = dump {
        let _ = file.lock().expect("dump lock").write_all(bytes);
    }
}

/// Whether Verify should ignore a conversation's history (`DAISY_TEST_VERIFY_FRESH`).
pub(crate) fn verify_fresh() -> bool {
    std::env::var_os("DAISY_TEST_VERIFY_FRESH").is_some()
}

/// `layers` without its first when `DAISY_TEST_DROP_LAYER` is set.
pub(crate) fn drop_a_layer(layers: std::ops::Range<usize>) -> std::ops::Range<usize> {
    if std::env::var_os("DAISY_TEST_DROP_LAYER").is_some() && !layers.is_empty() {
        eprintln!(
            "join: DAISY_TEST_DROP_LAYER is set: layer {} is dropped on purpose",
            layers.start
        );
        layers.start + 1..layers.end
    } else {
        layers
    }
}

/// `DAISY_TEST_BAD_FRAME=KIND`: a member sends its third activation of the first turn bad, once —
/// `hash` (one bit of the data flipped, the integrity hash left as it was), `replay` (the bytes of
/// its previous activation again), `stage` (addressed to another stage), `garbage` (bytes that are
/// no message) or `unfinished` (the first frame of a two-frame message, and never the second) — so
/// a test can show the receiver refuses each by name. `turn` sends, as the third activation of
/// the second turn, the bytes of the first activation of the first turn. (A frame over the size limit cannot be sent:
/// the data channel refuses it before it leaves; the wire's frame tests refuse it on receipt.)
pub(crate) struct BadFrame {
    kind: String,
    previous: Option<Vec<u8>>,
    sent: usize,
    done: bool,
    /// `turn`: the first activation sent, and how many of a later turn's were sent since.
    first: Option<(u64, Vec<u8>)>,
}

impl BadFrame {
    /// Once per process: a member's next plan (after the replay) sends nothing bad.
    pub(crate) fn from_env() -> Option<Self> {
        static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let kind = std::env::var("DAISY_TEST_BAD_FRAME").ok()?;
        if TAKEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        eprintln!("join: DAISY_TEST_BAD_FRAME={kind}: one activation will be bad on purpose");
        Some(Self {
            kind,
            previous: None,
            sent: 0,
            done: false,
            first: None,
        })
    }

    /// What goes on the wire in place of `bytes`: the third activation is the bad one (by then a
    /// decode lap has come back, so the head's stall timeout is its short one).
    pub(crate) fn send(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        if self.done {
            return bytes;
        }
        if self.kind == "turn" {
            let turn = daisy_wire::peek_activation_turn(&bytes).expect("an activation");
            match &self.first {
                None => self.first = Some((turn, bytes.clone())),
                Some((first, _)) if *first != turn => self.sent += 1,
                Some(_) => {}
            }
            if self.sent < 3 {
                return bytes;
            }
            self.done = true;
            return self.first.take().expect("kept above").1;
        }
        self.sent += 1;
        let previous = self.previous.replace(bytes.clone());
        let Some(previous) = previous.filter(|_| self.sent == 3) else {
            return bytes;
        };
        self.done = true;
        match self.kind.as_str() {
            "hash" => {
                // The middle of the message is f32 data; its lowest bit keeps the value finite.
                let mut b = bytes;
                let middle = b.len() / 2;
                b[middle] ^= 1;
                b
            }
            "replay" => previous,
            "garbage" => vec![0xA5; bytes.len()],
            "unfinished" => [RAW_MARK, self.kind.as_bytes()].concat(),
            "stage" => {
                let Ok(daisy_wire::Message::Activation(act)) = daisy_wire::decode(&bytes) else {
                    return bytes;
                };
                let fingerprint = *act.fingerprint();
                let (turn, lap, hop, positions, rows, cols) = (
                    act.turn(),
                    act.lap(),
                    act.hop(),
                    act.positions(),
                    act.rows(),
                    act.cols(),
                );
                let moved = daisy_wire::Activation::new(
                    turn,
                    lap,
                    hop.saturating_sub(1),
                    positions,
                    rows,
                    cols,
                    act.into_data(),
                    fingerprint,
                )
                .expect("the same activation, another hop");
                daisy_wire::encode(&daisy_wire::Message::Activation(moved))
            }
            other => {
                panic!(
                    "DAISY_TEST_BAD_FRAME={other}: hash, replay, stage, garbage, unfinished or turn"
                )
            }
        }
    }
}

/// What [`BadFrame`] puts in a message that the link must send as raw frames of its own making.
const RAW_MARK: &[u8] = b"DAISY-TEST-RAW-FRAMES:";

/// The frames a link sends for `message` when [`BadFrame`] marked it: the first of two frames
/// alone.
pub(crate) fn raw_frames(id: u64, message: &[u8]) -> Option<Vec<Vec<u8>>> {
    message.strip_prefix(RAW_MARK)?;
    let frame = daisy_wire::Frame {
        message_id: id,
        index: 0,
        count: 2,
        total_len: 2 * daisy_wire::MAX_FRAME_PAYLOAD as u64,
        payload: vec![0u8; daisy_wire::MAX_FRAME_PAYLOAD],
    };
    Some(vec![frame.to_bytes()])
}

/// SIGKILL this process once `done` of `total` bytes reach `$DAISY_TEST_KILL_AT_FETCHED` percent.
pub(crate) fn kill_at(done: u64, total: u64) {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    let at = AT.get_or_init(|| number("DAISY_TEST_KILL_AT_FETCHED"));
    if let Some(at) = *at
        && done * 100 >= at * total.max(1)
    {
        eprintln!("join: DAISY_TEST_KILL_AT_FETCHED={at}: killed with {done} of {total} bytes");
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: kill(2) on this process's own pid; SIGKILL ends it at once.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort();
    }
}

/// The number an environment variable of these hooks is set to (milliseconds, a percentage).
fn number(var: &str) -> Option<u64> {
    std::env::var(var).ok()?.parse().ok()
}

/// Sleep `$DAISY_TEST_SLOW_STEPS` milliseconds before each of a member's first two steps.
pub(crate) fn slow_step() {
    static STEPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static SLOW: OnceLock<Option<u64>> = OnceLock::new();
    let Some(ms) = *SLOW.get_or_init(|| number("DAISY_TEST_SLOW_STEPS")) else {
        return;
    };
    if STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2 {
        eprintln!("join: DAISY_TEST_SLOW_STEPS={ms}: this step is slow on purpose");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Sleep `$DAISY_TEST_PACE_STEPS` milliseconds before every one of a member's steps: a ring whose
/// answer takes a while to stream, however busy the machine (a page test's browser, starved of the
/// cores by a ring at full speed, could read a whole answer in one piece).
pub(crate) fn pace_step() {
    static PACE: OnceLock<Option<u64>> = OnceLock::new();
    if let Some(ms) = *PACE.get_or_init(|| number("DAISY_TEST_PACE_STEPS")) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Whether this member gives up its first attempt at the ring link it offers `peer`
/// (`DAISY_TEST_ABANDON_LINK`), and how long it then waits before offering it again: at once to
/// the head; three seconds to a member, which by then reads the attempt given up.
pub(crate) fn abandon_link(peer: &str) -> Option<std::time::Duration> {
    std::env::var_os("DAISY_TEST_ABANDON_LINK")?;
    eprintln!(
        "join: DAISY_TEST_ABANDON_LINK is set: a first attempt at a link is given up on purpose"
    );
    Some(if peer == daisy_signal::HEAD {
        std::time::Duration::ZERO
    } else {
        std::time::Duration::from_secs(3)
    })
}
