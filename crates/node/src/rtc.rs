//! One link of the ring: a WebRTC peer connection carrying one ordered, reliable, DTLS-encrypted data
//! channel, over which whole `wire` messages travel as frames of at most 64 KiB.
//!
//! The protocol is webrtc-rs's sans-I/O core (`rtc`: ICE, DTLS, SCTP, data channels); the I/O is
//! this module's. Each link owns one UDP socket and one thread that reads it, feeds the core, and
//! delivers whole messages the moment their last packet is read — straight into the consumer's
//! queue, or its own callback ([`Link::forward`], a stage's compute thread); a sender hands its
//! message to the core and puts the packets on the wire from its own thread. A decode hop thus costs
//! one thread wake-up (the receiver's), where webrtc's async driver cost a pass of its event loop and
//! several task hand-offs at both ends (docs/performance.md measures both).
//!
//! Signaling is not trickled: each side lists every candidate in the one session description it hands
//! to the signaling server (a host candidate on the address the signaling connection used, plus a
//! server-reflexive one with `--stun`).
//!
//! Sending waits while more than [`SEND_BUFFER_LIMIT`] bytes are handed to SCTP and not yet
//! acknowledged. Receiving reassembles frames under the wire's bounds; a frame the reassembler
//! refuses ends the link with that refusal. A dead peer is noticed by ICE consent freshness: the
//! connection turns `Failed` about 2.5 s after its last packet.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::BytesMut;
use daisy_wire::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_MESSAGE_BYTES, MAX_FRAME_BYTES, Reassembler, split,
};
use rtc::data_channel::{RTCDataChannelId, RTCDataChannelInit};
use rtc::peer_connection::configuration::RTCConfigurationBuilder;
use rtc::peer_connection::configuration::setting_engine::SettingEngineBuilder;
use rtc::peer_connection::event::{RTCDataChannelEvent, RTCPeerConnectionEvent};
use rtc::peer_connection::message::{RTCMessage, TaggedRTCMessage};
use rtc::peer_connection::sdp::RTCSessionDescription;
use rtc::peer_connection::state::RTCPeerConnectionState;
use rtc::peer_connection::transport::{
    CandidateConfig, CandidateHostConfig, CandidateServerReflexiveConfig, RTCIceCandidate,
    RTCIceCandidateInit,
};
use rtc::peer_connection::{RTCPeerConnection, RTCPeerConnectionBuilder};
use rtc::sansio::Protocol;
use rtc::shared::{TaggedBytesMut, TransportContext, TransportProtocol};
use tokio::sync::{Mutex, mpsc, oneshot, watch};

use crate::cmd::options::failure;

/// Bytes handed to SCTP and not yet acknowledged before [`Link::send`] waits.
pub(crate) const SEND_BUFFER_LIMIT: usize = 1 << 20;
/// Whole messages queued on the receiving side before the link stops draining SCTP (the peer's
/// sends then wait on SCTP's receive window).
const RECV_QUEUE: usize = 64;
/// SCTP's packet budget on a loopback link, against the core's default of 1191 (the IPv6 minimum MTU
/// through a TURN relay). A packet travels as one DTLS record in one UDP datagram; loopback carries
/// 64 KiB datagrams and this module reads into [`RECV_BUFFER`] bytes, so the activation of any model
/// up to a hidden size of about 4,000 (SmolLM2's 576 f32 and header, 2.4 KB; a 1 B model's 2,048,
/// 8.3 KB) is one datagram, and every datagram a hop saves is a pass of the sender's and the
/// receiver's transport (hidden size 2,048: the wire 0.38 → 0.34 ms a lap against 8 KiB packets). It
/// is DTLS's largest record (2^14 bytes of plaintext), which the kernel also charges to the
/// receiver's buffer at about its size, where an 8 KiB one costs twice that.
const LOOPBACK_SCTP_MTU: u32 = 16_384;
/// Bytes one datagram is read into (the largest UDP payload).
const RECV_BUFFER: usize = 65_536;
/// The longest a link's thread sleeps in a read before it looks at the core's timers again, and
/// how often it looks while a consumer has taken its reads (keepalives to answer during a long
/// step). Other threads that may arm an earlier timer (applying the peer's answer) or stop the
/// link wake it at once ([`Shared::poke`]); a send arms only SCTP's retransmission timer, at least
/// a second out. Every wake-up of an idle link is a thread that takes a core from a stage
/// computing on this machine (with 20 ms here, a member's compute thread was preempted twice a
/// token; 250 ms halved that).
const MAX_SLEEP: Duration = Duration::from_millis(250);
/// The smallest datagram that runs a link's arrival hook ([`Link::on_arrival`]): larger than an
/// acknowledgement or a keepalive (under 200 bytes), so in practice one carrying data.
const ARRIVAL_MIN: usize = 256;
/// Longest wait for a STUN server's answer while gathering.
const STUN_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait from the answer to an open channel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for the answer to an offer, relayed by the head's signaling: after it the attempt
/// has failed (head and members alike).
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries at opening a link its offerer makes (head and members alike) before it gives up: a lost
/// handshake packet can fail one attempt, and a network that loses one packet in fifty stays usable.
pub(crate) const LINK_ATTEMPTS: u32 = 3;
/// How often a sender waiting for room in SCTP's buffer looks again if no acknowledgement woke it.
const SPACE_POLL: Duration = Duration::from_millis(50);

/// The answers this device awaits for the links it offered: its signaling loop hands each one in
/// ([`deliver`](Self::deliver)), the link's offering task ([`offer_until_open`]) takes it.
#[derive(Clone, Default)]
pub(crate) struct Answers(Arc<std::sync::Mutex<HashMap<u64, Awaited>>>);

/// The attempt at a link whose answer is awaited, and where it goes.
type Awaited = (u32, oneshot::Sender<String>);

/// What became of an answer handed to [`Answers::deliver`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// Its attempt awaited it.
    Taken,
    /// Its attempt was given up; a later one, or none, awaits its own answer.
    Late,
    /// This device made no such attempt at that link.
    NotOffered,
}

impl Answers {
    /// Await the answer to attempt `attempt` at `link` (an earlier attempt's no longer counts).
    fn expect(&self, link: u64, attempt: u32) -> oneshot::Receiver<String> {
        let (tx, rx) = oneshot::channel();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(link, (attempt, tx));
        rx
    }

    /// Hand in the answer to attempt `attempt` at `link`.
    pub(crate) fn deliver(&self, link: u64, attempt: u32, sdp: String) -> Delivered {
        let mut waiting = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match waiting.get(&link).map(|w| w.0) {
            Some(current) if current == attempt => {
                let (_, tx) = waiting.remove(&link).expect("looked up");
                // Its attempt may have been given up this instant: then it is late all the same.
                match tx.send(sdp) {
                    Ok(()) => Delivered::Taken,
                    Err(_) => Delivered::Late,
                }
            }
            Some(current) if (1..current).contains(&attempt) => Delivered::Late,
            _ => Delivered::NotOffered,
        }
    }
}

/// Offer `link` to `peer` until its channel opens, at most [`LINK_ATTEMPTS`] times (head and
/// members alike): each attempt a fresh offer handed to `send` with its number (signaling, through
/// the head), its answer awaited in `answers` for [`ANSWER_TIMEOUT`]; an answer to an attempt given
/// up is dropped ([`Delivered::Late`]).
pub(crate) async fn offer_until_open<F>(
    cfg: &LinkConfig,
    answers: &Answers,
    link: u64,
    peer: &str,
    mut send: impl FnMut(String, u32) -> F,
) -> Result<Link>
where
    F: std::future::Future<Output = Result<()>>,
{
    let mut attempt = 1;
    loop {
        let once = async {
            let answer = answers.expect(link, attempt);
            let (pending, sdp) = offer(cfg).await?;
            send(sdp, attempt).await?;
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, answer)
                .await
                .map_err(|_| {
                    anyhow!(
                        "{peer} did not answer the offer within {} s",
                        ANSWER_TIMEOUT.as_secs()
                    )
                })?
                .map_err(|_| anyhow!("{peer} left before answering"))?;
            let opened = pending.accept(&answer).await?;
            #[cfg(feature = "test-hooks")]
            if attempt == 1
                && let Some(wait) = crate::test_hooks::abandon_link(peer)
            {
                drop(opened);
                tokio::time::sleep(wait).await;
                bail!("given up on purpose (a test hook)");
            }
            Ok::<_, anyhow::Error>(opened)
        };
        match once.await {
            Ok(opened) => return Ok(opened),
            Err(e) if attempt < LINK_ATTEMPTS => {
                daisy_engine::note(format_args!(
                    "link {link} to {peer}: {}; offering it again",
                    failure(&e)
                ));
                attempt += 1;
            }
            Err(e) => {
                return Err(e.context(format!(
                    "link {link} to {peer} did not open in {attempt} attempts"
                )));
            }
        }
    }
}

/// Where a link gathers its candidates.
#[derive(Clone, Debug)]
pub(crate) struct LinkConfig {
    /// The local address host candidates bind to: the one the signaling connection used, so the
    /// peer can reach it the way this device reached the head.
    pub(crate) bind: IpAddr,
    /// An optional STUN server (`stun:host:port`) for server-reflexive candidates.
    pub(crate) stun: Option<String>,
    /// The receive buffer to ask of the system for the link's socket, in bytes (it caps the
    /// request; [`RECV_SOCKET_BUFFER`] unless a test models a smaller one).
    pub(crate) recv_buffer: usize,
}

/// Create the offering side of a link; returns it and the offer to send (JSON, every candidate).
pub(crate) async fn offer(cfg: &LinkConfig) -> Result<(PendingOffer, String)> {
    let (conn, sdp) = set_up(cfg, |pc| {
        pc.create_data_channel(
            "ring",
            Some(RTCDataChannelInit {
                ordered: true,
                ..Default::default()
            }),
        )
        .context("creating the data channel")?;
        pc.create_offer(None).context("creating the offer")
    })
    .await?;
    Ok((PendingOffer { conn }, sdp))
}

/// Create the answering side of a link from the peer's offer; returns it and the answer to send.
pub(crate) async fn answer(cfg: &LinkConfig, offer: &str) -> Result<(PendingAnswer, String)> {
    let remote: RTCSessionDescription =
        serde_json::from_str(offer).context("the offer is not a session description")?;
    let (conn, sdp) = set_up(cfg, move |pc| {
        pc.set_remote_description(Instant::now(), remote)
            .context("applying the peer's offer")?;
        pc.create_answer(None).context("creating the answer")
    })
    .await?;
    Ok((PendingAnswer { conn }, sdp))
}

/// Build a peer connection, let `describe` make its local description (an offer or an answer),
/// set it, and start the link's thread; returns the link and its description with every
/// candidate (JSON). Off the async runtime: binding and gathering may block.
async fn set_up(
    cfg: &LinkConfig,
    describe: impl FnOnce(&mut RTCPeerConnection) -> Result<RTCSessionDescription> + Send + 'static,
) -> Result<(Conn, String)> {
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || -> Result<(Conn, String)> {
        let (mut pc, socket) = build(&cfg)?;
        let desc = describe(&mut pc)?;
        pc.set_local_description(Instant::now(), desc)
            .context("setting the local description")?;
        let sdp = described(&pc)?;
        Ok((Conn::start(pc, socket)?, sdp))
    })
    .await
    .context("the link's setup stopped")?
}

/// An offer sent, waiting for the peer's answer.
pub(crate) struct PendingOffer {
    conn: Conn,
}

impl PendingOffer {
    /// Apply the peer's answer and wait for the channel to open.
    pub(crate) async fn accept(self, answer: &str) -> Result<Link> {
        let remote: RTCSessionDescription =
            serde_json::from_str(answer).context("the answer is not a session description")?;
        {
            let mut core = self.conn.shared.lock();
            core.pc
                .set_remote_description(Instant::now(), remote)
                .context("applying the peer's answer")?;
            self.conn.shared.flush(&mut core);
        }
        // ICE's checks are due now; the link's thread may be asleep for `MAX_SLEEP`.
        self.conn.shared.poke();
        self.conn.opened().await?;
        Ok(Link::start(self.conn))
    }
}

/// An answer sent, waiting for the offerer's channel.
pub(crate) struct PendingAnswer {
    conn: Conn,
}

impl PendingAnswer {
    /// Wait for the offerer's data channel to arrive and open.
    pub(crate) async fn connected(self) -> Result<Link> {
        self.conn.opened().await?;
        Ok(Link::start(self.conn))
    }
}

/// The sending end of a link for a thread outside the runtime's tasks (a stage's compute thread):
/// a message that fits in SCTP's buffer goes out from the calling thread when nothing waits in the
/// queue — no thread wake-up at all on this side of a hop; one that does not, or one behind a queued
/// one, goes through a task, so the computing thread never waits on the network for a big (prefill)
/// message. Messages leave in the order they are given.
pub(crate) struct Outbox {
    link: Arc<Link>,
    queue: mpsc::Sender<Vec<u8>>,
    /// Messages handed to the task and not yet sent by it.
    queued: Arc<AtomicUsize>,
    failed: Arc<AtomicBool>,
    on_error: Arc<std::sync::Mutex<Option<OnError>>>,
}

/// What an [`Outbox`] does, once, when a send fails.
type OnError = Box<dyn FnOnce(anyhow::Error) + Send>;

/// Messages an [`Outbox`]'s task holds before the sender waits.
const OUTBOX_QUEUE: usize = 4;

impl Outbox {
    /// An outbox on `link`, its task spawned on the current runtime; `on_error` runs once, with the
    /// first failed send's error, after which nothing more is sent.
    pub(crate) fn new(
        link: Arc<Link>,
        on_error: impl FnOnce(anyhow::Error) + Send + 'static,
    ) -> Self {
        let (queue, mut rx) = mpsc::channel::<Vec<u8>>(OUTBOX_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let on_error: Arc<std::sync::Mutex<Option<OnError>>> =
            Arc::new(std::sync::Mutex::new(Some(Box::new(on_error))));
        let task = {
            let (link, queued, failed, on_error) = (
                link.clone(),
                queued.clone(),
                failed.clone(),
                on_error.clone(),
            );
            async move {
                while let Some(bytes) = rx.recv().await {
                    let sent = link.send(&bytes).await;
                    queued.fetch_sub(1, Ordering::AcqRel);
                    if let Err(e) = sent {
                        fail(&failed, &on_error, e);
                        break;
                    }
                }
            }
        };
        tokio::spawn(task);
        Self {
            link,
            queue,
            queued,
            failed,
            on_error,
        }
    }

    /// Send `bytes` after every message given before it, from a thread that may block (not a
    /// runtime task, unless inside `block_in_place`). Fails once a send has failed (`on_error` has
    /// the reason) or the task has stopped.
    pub(crate) fn send_blocking(&self, bytes: Vec<u8>) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            bail!("the link failed");
        }
        // Only this thread adds to the queue, so an empty queue stays empty while it sends.
        if self.queued.load(Ordering::Acquire) == 0 {
            match self.link.send_now(&bytes) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    let why = failure(&e);
                    fail(&self.failed, &self.on_error, e);
                    bail!("the link failed: {why}");
                }
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.blocking_send(bytes).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            bail!("the link's sender stopped");
        }
        Ok(())
    }
}

/// Mark an outbox failed and run its error handler, the first time only.
fn fail(failed: &AtomicBool, on_error: &std::sync::Mutex<Option<OnError>>, e: anyhow::Error) {
    failed.store(true, Ordering::Release);
    let handler = on_error.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(handler) = handler {
        handler(e);
    }
}

/// An open link: whole messages each way.
pub(crate) struct Link {
    conn: Conn,
    inbound: Mutex<mpsc::Receiver<Result<Vec<u8>, String>>>,
    next_id: AtomicU64,
}

impl Link {
    fn start(conn: Conn) -> Self {
        let (tx, rx) = mpsc::channel(RECV_QUEUE);
        {
            let mut core = conn.shared.lock();
            if let Sink::Held(kept) = std::mem::replace(&mut core.sink, Sink::Closed) {
                // At most `RECV_QUEUE` are held: they fit.
                for m in kept {
                    let _ = tx.try_send(m);
                }
            }
            // The channel may have closed, or a frame been refused, before the link was handed
            // over: then the queue ends after what it holds.
            if !core.ended {
                core.sink = Sink::Queue(tx);
            }
            conn.shared.flush(&mut core);
        }
        Self {
            conn,
            inbound: Mutex::new(rx),
            next_id: AtomicU64::new(0),
        }
    }

    /// The frames of one message, in order.
    fn frames(&self, message: &[u8]) -> Result<Vec<Vec<u8>>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        if let Some(raw) = crate::test_hooks::raw_frames(id, message) {
            return Ok(raw);
        }
        Ok(split(id, message)?.iter().map(|f| f.to_bytes()).collect())
    }

    /// Send one whole message (any size the wire allows), frame by frame, each waiting while the
    /// send buffer is full. Fails once the channel is closed or the connection failed.
    pub(crate) async fn send(&self, message: &[u8]) -> Result<()> {
        let shared = &self.conn.shared;
        for bytes in self.frames(message)? {
            let mut acked = shared.acked.subscribe();
            loop {
                {
                    let mut core = shared.lock();
                    if shared.room(&mut core, bytes.len())? {
                        shared.write(&mut core, &bytes)?;
                        break;
                    }
                }
                let _ = tokio::time::timeout(SPACE_POLL, acked.changed()).await;
            }
        }
        Ok(())
    }

    /// Send one whole message from the calling thread if all of it fits in SCTP's buffer now;
    /// `false` (nothing sent) if it does not.
    fn send_now(&self, message: &[u8]) -> Result<bool> {
        let shared = &self.conn.shared;
        let frames = self.frames(message)?;
        let total: usize = frames.iter().map(Vec::len).sum();
        let mut core = shared.lock();
        if !shared.room(&mut core, total)? {
            // The id was taken; the message goes out under the next one, which the peer accepts
            // (ids only have to differ between messages in flight).
            return Ok(false);
        }
        for bytes in &frames {
            shared.write(&mut core, bytes)?;
        }
        Ok(true)
    }

    /// The next whole message; `None` once the channel closed or the connection failed, an error
    /// naming the refusal when a frame was refused (the link is dead after it).
    pub(crate) async fn recv(&self) -> Option<Result<Vec<u8>>> {
        self.inbound
            .lock()
            .await
            .recv()
            .await
            .map(|r| r.map_err(|e| anyhow!(e)))
    }

    /// Hand every message from now on to `deliver`, on the link's own thread, as it completes
    /// (messages already queued for [`recv`](Self::recv) first); `recv` then returns `None`. For a
    /// consumer that is a thread of its own: one wake-up per message, none of the runtime's, or for
    /// one that does its work right here (a member's decode step). While `deliver` runs, this
    /// link reads nothing (datagrams wait in the socket's buffer) and its timers wait: it must
    /// not wait on this link, and should return within milliseconds. After an `Err` nothing more
    /// comes.
    pub(crate) fn forward(&self, deliver: impl FnMut(Result<Vec<u8>, String>) + Send + 'static) {
        let mut deliver: Box<dyn FnMut(Result<Vec<u8>, String>) + Send> = Box::new(deliver);
        let mut core = self.conn.shared.lock();
        // Holding the core, nothing new reaches the queue; what is in it goes first.
        if let Ok(mut rx) = self.inbound.try_lock() {
            while let Ok(m) = rx.try_recv() {
                deliver(m);
            }
        }
        if !core.ended {
            core.sink = Sink::Direct(deliver);
        }
        self.conn.shared.flush(&mut core);
    }

    /// Read this link on the calling thread, from now until the returned guard is dropped, when it
    /// waits for a message ([`Reads::pump`]): the datagram then wakes the thread that consumes
    /// it, not the link's thread, which would wake the consumer in turn (one thread wake-up fewer
    /// a message; for the head, 25-150 µs a lap). Meanwhile the link's thread keeps the timers
    /// and reads what arrives while the consumer is busy, every [`MAX_SLEEP`]. Messages go to the
    /// sink as before ([`forward`](Self::forward)'s, on whichever thread read them).
    pub(crate) fn take_reads(&self) -> Reads<'_> {
        let shared = &*self.conn.shared;
        shared.taken.store(true, Ordering::Release);
        // The link's thread may be in a read of up to `MAX_SLEEP`: it gives the socket up at once.
        shared.poke();
        Reads {
            shared,
            buf: vec![0u8; RECV_BUFFER],
        }
    }

    /// Run `hook` on the reading thread whenever a datagram that likely carries data arrives,
    /// before it is decrypted and reassembled (tens of microseconds on a cold cache): a member
    /// wakes its GEMM workers there, so that they are up when its step begins (one thread
    /// wake-up taken off the step; ring decode +2.7 % in twelve ABBA rounds). Set once.
    pub(crate) fn on_arrival(&self, hook: fn()) {
        let _ = self.conn.shared.arrival.set(hook);
    }

    /// Messages the peer began and has not finished sending on this link.
    pub(crate) fn partial(&self) -> u64 {
        self.conn.shared.partial.load(Ordering::Relaxed)
    }

    /// Bytes sent so far, frame headers included.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.conn.shared.sent.load(Ordering::Relaxed)
    }

    /// Close the channel and the connection (the peer sees the channel close at once).
    pub(crate) async fn close(&self) {
        self.conn.close();
    }
}

/// A link's reads, taken by the thread that consumes its messages ([`Link::take_reads`]); given
/// back to the link's thread when dropped.
pub(crate) struct Reads<'a> {
    shared: &'a Shared,
    buf: Vec<u8>,
}

impl Reads<'_> {
    /// Read and handle this link's datagrams until a whole message has been delivered to the
    /// sink or `wait` has passed; `false` once the link has stopped or its connection ended.
    pub(crate) fn pump(&mut self, wait: Duration) -> bool {
        let shared = self.shared;
        let deadline = Instant::now() + wait;
        let delivered = shared.delivered.load(Ordering::Relaxed);
        let _reading = shared.reader.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // The link's thread may have delivered one while this thread waited for the socket.
            if shared.delivered.load(Ordering::Relaxed) != delivered {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            if matches!(shared.pass(&mut self.buf, Some(left)), Pass::Stop) {
                return false;
            }
        }
    }
}

impl Drop for Reads<'_> {
    fn drop(&mut self) {
        let shared = self.shared;
        shared.taken.store(false, Ordering::Release);
        let _guard = shared.handed.0.lock().unwrap_or_else(|p| p.into_inner());
        shared.handed.1.notify_all();
    }
}

/// A peer connection and the thread that drives it; stopped when dropped.
struct Conn {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Conn {
    fn start(pc: RTCPeerConnection, socket: UdpSocket) -> Result<Self> {
        let local = socket.local_addr().context("the link's socket")?;
        let (state, _) = watch::channel(RTCPeerConnectionState::New);
        let (acked, _) = watch::channel(());
        let shared = Arc::new(Shared {
            core: std::sync::Mutex::new(Core {
                pc,
                channel: None,
                open: false,
                sink: Sink::Held(Vec::new()),
                ended: false,
                held: None,
                frames: Reassembler::new(DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_IN_FLIGHT),
            }),
            socket,
            local,
            stop: AtomicBool::new(false),
            state,
            acked,
            partial: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            reader: std::sync::Mutex::new(()),
            taken: AtomicBool::new(false),
            handed: (std::sync::Mutex::new(()), std::sync::Condvar::new()),
            delivered: AtomicU64::new(0),
            arrival: OnceLock::new(),
        });
        let thread = std::thread::Builder::new()
            .name("rtc-link".into())
            .spawn({
                let shared = shared.clone();
                move || shared.drive()
            })
            .context("starting the link's thread")?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Wait until the data channel is open (either side's: there is one).
    async fn opened(&self) -> Result<()> {
        let mut state = self.shared.state.subscribe();
        let wait = async {
            loop {
                {
                    let core = self.shared.lock();
                    if core.open {
                        return Ok(());
                    }
                    if core.ended {
                        bail!("the data channel closed before it opened");
                    }
                }
                let s = *state.borrow_and_update();
                if is_terminal(s) {
                    bail!("the connection is {s} before its channel opened");
                }
                if state.changed().await.is_err() {
                    bail!("the connection stopped before its channel opened");
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, wait)
            .await
            .map_err(|_| anyhow!("the data channel did not open within {CONNECT_TIMEOUT:?}"))?
    }

    fn close(&self) {
        let mut core = self.shared.lock();
        if let Some(id) = core.channel
            && let Some(mut dc) = core.pc.data_channel(id)
        {
            let _ = dc.close();
        }
        let _ = core.pc.close();
        self.shared.flush(&mut core);
        end(&mut core);
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_thread();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // The thread sees the flag at once; it is not joined here (a drop may run on a runtime
        // thread, which must not wait).
        self.shared.wake_thread();
        drop(self.thread.take());
    }
}

/// What a link's thread and its senders share.
struct Shared {
    core: std::sync::Mutex<Core>,
    socket: UdpSocket,
    local: SocketAddr,
    stop: AtomicBool,
    /// The connection's state, as the core last reported it.
    state: watch::Sender<RTCPeerConnectionState>,
    /// Bumped when the peer acknowledged data (room in SCTP's buffer) or the connection changed.
    acked: watch::Sender<()>,
    /// Messages the peer began sending on this link and has not finished (frames reassembling).
    partial: AtomicU64,
    sent: AtomicU64,
    /// Held by whichever thread reads the socket: the link's own, or a consumer that took the
    /// reads ([`Link::take_reads`]).
    reader: std::sync::Mutex<()>,
    /// A consumer has taken the reads: the link's thread only keeps the timers and any datagram
    /// that arrives while the consumer is not reading.
    taken: AtomicBool,
    /// Where the link's thread waits while the reads are taken.
    handed: (std::sync::Mutex<()>, std::sync::Condvar),
    /// Whole messages delivered so far.
    delivered: AtomicU64,
    /// Run as a datagram of at least [`ARRIVAL_MIN`] bytes is read, before it is handled.
    arrival: OnceLock<fn()>,
}

/// What one pass over the socket came to.
enum Pass {
    Continue,
    /// The link was stopped, or its connection ended.
    Stop,
}

/// The sans-I/O connection and what this link keeps beside it.
struct Core {
    pc: RTCPeerConnection,
    channel: Option<RTCDataChannelId>,
    open: bool,
    sink: Sink,
    /// The channel closed, the connection ended, or a frame was refused: nothing more is read.
    ended: bool,
    /// A message the queue had no room for: SCTP is not drained until it is delivered.
    held: Option<Result<Vec<u8>, String>>,
    frames: Reassembler,
}

/// Where whole messages go.
enum Sink {
    /// Before the link is handed over (messages kept in order, at most `RECV_QUEUE`).
    Held(Vec<Result<Vec<u8>, String>>),
    Queue(mpsc::Sender<Result<Vec<u8>, String>>),
    Direct(Box<dyn FnMut(Result<Vec<u8>, String>) + Send>),
    /// Nothing more is delivered (a `recv` returns `None` once the queue is empty).
    Closed,
}

/// Read nothing more; the consumer sees the end after what it was given (held messages stay for
/// the hand-over).
fn end(core: &mut Core) {
    core.ended = true;
    if !matches!(core.sink, Sink::Held(_)) {
        core.sink = Sink::Closed;
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake the link's thread from its read: an empty datagram to its own socket, which it takes
    /// for a wake-up (an empty datagram carries nothing for WebRTC). If it is lost, the thread
    /// looks again within `MAX_SLEEP`.
    fn poke(&self) {
        let _ = self.socket.send_to(&[], self.local);
    }

    /// Wake the link's thread wherever it waits: in its read, or while a consumer has the reads.
    fn wake_thread(&self) {
        self.poke();
        let _guard = self.handed.0.lock().unwrap_or_else(|p| p.into_inner());
        self.handed.1.notify_all();
    }

    /// Whether `bytes` more fit in SCTP's buffer; an error once the link cannot send.
    fn room(&self, core: &mut Core, bytes: usize) -> Result<bool> {
        let s = *self.state.borrow();
        if is_terminal(s) {
            bail!("the connection is {s}");
        }
        let id = match core.channel {
            Some(id) if core.open => id,
            _ => bail!("the data channel is closed"),
        };
        let dc = core
            .pc
            .data_channel(id)
            .context("the data channel is closed")?;
        let outstanding = dc.outstanding_bytes();
        Ok(outstanding == 0 || outstanding + bytes <= SEND_BUFFER_LIMIT)
    }

    /// Hand one frame to the channel and put what the core has to send on the wire.
    fn write(&self, core: &mut Core, bytes: &[u8]) -> Result<()> {
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::dump_sent(bytes);
        let id = core.channel.context("the data channel is closed")?;
        core.pc
            .data_channel(id)
            .context("the data channel is closed")?
            .send(Instant::now(), BytesMut::from(bytes))
            .context("sending on the data channel")?;
        self.sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.flush(core);
        Ok(())
    }

    /// Everything the core has for the outside: events, whole messages, packets to send — in that
    /// order, so that a message is with its consumer before this thread spends its time on the
    /// acknowledgement (encrypting it, and the send, which on loopback runs the peer's receive).
    fn flush(&self, core: &mut Core) {
        self.events(core);
        self.deliver(core);
        while let Some(out) = core.pc.poll_write() {
            // A datagram the socket refuses is a lost packet to SCTP, which resends it.
            let _ = self.socket.send_to(&out.message, out.transport.peer_addr);
        }
        self.events(core);
    }

    /// The core's events: the connection's state, the channel opening or closing.
    fn events(&self, core: &mut Core) {
        let mut changed = false;
        while let Some(event) = core.pc.poll_event() {
            match event {
                RTCPeerConnectionEvent::OnConnectionStateChangeEvent(s) => {
                    self.state.send_replace(s);
                    if is_terminal(s) {
                        end(core);
                    }
                    changed = true;
                }
                RTCPeerConnectionEvent::OnDataChannel(RTCDataChannelEvent::OnOpen(id))
                    if core.channel.is_none() || core.channel == Some(id) =>
                {
                    core.channel = Some(id);
                    core.open = true;
                    changed = true;
                }
                RTCPeerConnectionEvent::OnDataChannel(RTCDataChannelEvent::OnClose(id))
                    if core.channel == Some(id) =>
                {
                    core.open = false;
                    end(core);
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            // Waiters on the state re-check the channel too.
            self.state.send_modify(|_| {});
        }
    }

    /// Move whole messages from the core to the sink, while it takes them.
    fn deliver(&self, core: &mut Core) {
        loop {
            if core.ended {
                return;
            }
            let next = match core.held.take() {
                Some(m) => m,
                None => match core.pc.poll_read() {
                    None => return,
                    Some(TaggedRTCMessage {
                        message: RTCMessage::DataChannelMessage(id, msg),
                        ..
                    }) if Some(id) == core.channel || core.channel.is_none() => {
                        let pushed = core.frames.push(&msg.data);
                        self.partial
                            .store(core.frames.in_flight() as u64, Ordering::Relaxed);
                        match pushed {
                            Ok(Some(message)) => Ok(message),
                            Ok(None) => continue,
                            Err(e) => Err(format!("refused a frame: {e}")),
                        }
                    }
                    Some(_) => continue,
                },
            };
            let refused = next.is_err();
            match &mut core.sink {
                Sink::Closed => {}
                Sink::Held(kept) if kept.len() >= RECV_QUEUE => {
                    core.held = Some(next);
                    return;
                }
                Sink::Held(kept) => kept.push(next),
                Sink::Direct(deliver) => deliver(next),
                Sink::Queue(tx) => match tx.try_send(next) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(m)) => {
                        core.held = Some(m);
                        return;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => end(core),
                },
            }
            // Handed on (a message kept for a full queue returned above, and counts when it goes).
            self.delivered.fetch_add(1, Ordering::Relaxed);
            if refused {
                end(core);
            }
        }
    }

    /// The link's thread: read the socket, feed the core, until the link is closed or the
    /// connection ends. While a consumer has taken the reads it waits, and now and then (every
    /// [`MAX_SLEEP`]) looks at the timers and at what arrived while the consumer was busy.
    fn drive(self: Arc<Self>) {
        let mut buf = vec![0u8; RECV_BUFFER];
        loop {
            if self.taken.load(Ordering::Acquire) {
                {
                    let guard = self.handed.0.lock().unwrap_or_else(|p| p.into_inner());
                    if self.taken.load(Ordering::Acquire) && !self.stop.load(Ordering::Acquire) {
                        let _ = self.handed.1.wait_timeout(guard, MAX_SLEEP);
                    }
                }
                if self.taken.load(Ordering::Acquire) {
                    // A consumer that is reading now has the timers too.
                    let pass = match self.reader.try_lock() {
                        Ok(_reading) => self.pass(&mut buf, None),
                        Err(_) => Pass::Continue,
                    };
                    if matches!(pass, Pass::Stop) || self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    continue;
                }
            }
            let _reading = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            if self.taken.load(Ordering::Acquire) {
                continue;
            }
            if matches!(self.pass(&mut buf, Some(MAX_SLEEP)), Pass::Stop) {
                return;
            }
        }
    }

    /// Deliver what is ready, then read one datagram (waiting up to `wait`, and no longer than
    /// the core's next timer; `None`: only what has already arrived) and feed it to the core, or
    /// run the core's timers. The caller holds `reader`.
    fn pass(&self, buf: &mut [u8], wait: Option<Duration>) -> Pass {
        let wait = {
            let mut core = self.lock();
            self.flush(&mut core);
            if is_terminal(*self.state.borrow()) || self.stop.load(Ordering::Acquire) {
                return Pass::Stop;
            }
            let now = Instant::now();
            let due = core
                .pc
                .poll_timeout()
                .map(|t| t.saturating_duration_since(now));
            if due.is_some_and(|d| d.is_zero()) {
                let _ = core.pc.handle_timeout(now);
                return Pass::Continue;
            }
            wait.map(|w| {
                let mut w = due.map_or(w, |d| d.min(w));
                if core.held.is_some() {
                    // The consumer is behind: look again soon.
                    w = w.min(Duration::from_millis(1));
                }
                w
            })
        };
        let received = match wait {
            Some(wait) => {
                let _ = self.socket.set_read_timeout(Some(wait));
                self.socket.recv_from(buf)
            }
            None => {
                // Only this pass reads (it holds `reader`), so the socket's mode is its own.
                let _ = self.socket.set_nonblocking(true);
                let r = self.socket.recv_from(buf);
                let _ = self.socket.set_nonblocking(false);
                r
            }
        };
        let mut core = self.lock();
        let queued_before = outstanding(&mut core);
        match received {
            // A wake-up (`poke`): the next pass looks at the timers and the stop flag.
            Ok((0, _)) => {}
            Ok((n, peer_addr)) => {
                if n >= ARRIVAL_MIN
                    && let Some(arrival) = self.arrival.get()
                {
                    arrival();
                }
                let _ = core.pc.handle_read(TaggedBytesMut {
                    now: Instant::now(),
                    transport: TransportContext {
                        local_addr: self.local,
                        peer_addr,
                        ecn: None,
                        transport_protocol: TransportProtocol::UDP,
                    },
                    message: BytesMut::from(&buf[..n]),
                });
                // What it completes goes to the consumer now; what the core has to send (the
                // acknowledgement) waits for the next pass, so that a consumer reading here
                // (`Reads::pump`) goes back to its work first.
                self.events(&mut core);
                self.deliver(&mut core);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let _ = core.pc.handle_timeout(Instant::now());
            }
            // ICMP unreachable and the like: ICE consent decides whether the peer is gone.
            Err(_) => {}
        }
        if outstanding(&mut core) < queued_before {
            self.acked.send_replace(());
        }
        Pass::Continue
    }
}

/// Bytes handed to the channel and not yet acknowledged.
fn outstanding(core: &mut Core) -> usize {
    match core.channel {
        Some(id) => core
            .pc
            .data_channel(id)
            .map_or(0, |dc| dc.outstanding_bytes()),
        None => 0,
    }
}

fn is_terminal(s: RTCPeerConnectionState) -> bool {
    matches!(
        s,
        RTCPeerConnectionState::Failed | RTCPeerConnectionState::Closed
    )
}

/// The receive buffer a link asks for its socket: what a burst of frames needs, where the system
/// allows it (Linux caps the request at `net.core.rmem_max`, 208 KiB on most systems).
pub(crate) const RECV_SOCKET_BUFFER: usize = 4 << 20;
/// SCTP's receive window at most: the core's default.
const MAX_RECEIVE_WINDOW: usize = 1 << 20;

/// Widen `socket`'s receive buffer to `asked` bytes as far as the system allows, and return the
/// SCTP receive window to advertise on it: no more than the buffer holds. The kernel drops a
/// datagram that finds the buffer full, and SCTP resends it only after its retransmission timeout
/// (a second at least), so a window larger than the buffer turns every burst a busy receiver
/// cannot read at once into seconds of nothing: a 1.1 B model's prefill chunks (128 KiB) took 1.7 s
/// each around a loopback ring with the core's 1 MiB window and a 208 KiB buffer. The kernel
/// charges a datagram up to twice its bytes (an 8.3 KB one, 16.6 KB), so the window is a third of
/// the buffer, and never below one whole frame (which SCTP must be able to hold to deliver it).
fn receive_window(socket: &UdpSocket, asked: usize) -> u32 {
    let socket = socket2::SockRef::from(socket);
    // Best effort: a smaller buffer only means a smaller window.
    let _ = socket.set_recv_buffer_size(asked);
    let held = socket.recv_buffer_size().unwrap_or(0);
    let window = (held / 3).clamp(MAX_FRAME_BYTES + 4096, MAX_RECEIVE_WINDOW);
    u32::try_from(window).unwrap_or(u32::MAX)
}

/// A peer connection with its candidates gathered: a host candidate on `cfg.bind` and, with a STUN
/// server, the server-reflexive address it reports.
fn build(cfg: &LinkConfig) -> Result<(RTCPeerConnection, UdpSocket)> {
    // Failed 2.5 s after the last packet (the defaults take 29 s): a dead member is replanned
    // around quickly, and a keepalive every 300 ms keeps an idle link from flapping. mDNS off:
    // candidates name the address the signaling connection used, never a `.local` name.
    let socket = UdpSocket::bind(SocketAddr::new(cfg.bind, 0))
        .with_context(|| format!("binding a UDP socket on {}", cfg.bind))?;
    let window = receive_window(&socket, cfg.recv_buffer);
    let mut settings = SettingEngineBuilder::new().with_sctp_max_receive_buffer_size(window);
    if cfg.bind.is_loopback() {
        // Both ends on this machine: the path is loopback, whose MTU is far above any datagram
        // here.
        settings = settings.with_sctp_mtu(LOOPBACK_SCTP_MTU);
    }
    let settings = settings
        .with_ice_timeouts(
            Some(Duration::from_millis(1500)),
            Some(Duration::from_millis(1000)),
            Some(Duration::from_millis(300)),
        )
        .with_multicast_dns_mode(rtc::ice::mdns::MulticastDnsMode::Disabled)
        .build();
    let mut pc = RTCPeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().build())
        .with_setting_engine(settings)
        .build(Instant::now())
        .context("setting up a WebRTC peer connection")?;
    let local = socket.local_addr()?;
    let host = CandidateHostConfig {
        base_config: CandidateConfig {
            network: "udp".to_owned(),
            address: local.ip().to_string(),
            port: local.port(),
            component: 1,
            ..Default::default()
        },
        ..Default::default()
    }
    .new_candidate_host()
    .context("making the host candidate")?;
    pc.add_local_candidate(RTCIceCandidate::from(&host).to_json()?)
        .context("adding the host candidate")?;
    if let Some(url) = &cfg.stun {
        let reflexive = server_reflexive(&socket, url)?;
        let candidate = CandidateServerReflexiveConfig {
            base_config: CandidateConfig {
                network: "udp".to_owned(),
                address: reflexive.ip().to_string(),
                port: reflexive.port(),
                component: 1,
                ..Default::default()
            },
            rel_addr: local.ip().to_string(),
            rel_port: local.port(),
            url: Some(url.clone()),
        }
        .new_candidate_server_reflexive()
        .context("making the server-reflexive candidate")?;
        pc.add_local_candidate(RTCIceCandidate::from(&candidate).to_json()?)
            .context("adding the server-reflexive candidate")?;
    }
    // The end of gathering: every candidate is in the description from here on.
    pc.add_local_candidate(RTCIceCandidateInit::default())
        .context("ending ICE gathering")?;
    Ok((pc, socket))
}

/// The session description with every candidate, as JSON for the signaling server.
fn described(pc: &RTCPeerConnection) -> Result<String> {
    let desc = pc
        .local_description()
        .context("no local description after setting it")?;
    Ok(serde_json::to_string(&desc)?)
}

/// This socket's address as the STUN server at `url` (`stun:host[:port]`) sees it.
fn server_reflexive(socket: &UdpSocket, url: &str) -> Result<SocketAddr> {
    use rtc::stun::message::{BINDING_REQUEST, Getter, Message, TransactionId};
    use rtc::stun::xoraddr::XorMappedAddress;

    let hostport = url
        .strip_prefix("stun:")
        .with_context(|| format!("the STUN server {url:?} is not a stun: URL"))?;
    let with_port = if hostport
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !hostport.ends_with(']')
    {
        hostport.to_string()
    } else {
        format!("{hostport}:3478")
    };
    let local = socket.local_addr()?;
    let server = with_port
        .to_socket_addrs()
        .with_context(|| format!("resolving the STUN server {url:?}"))?
        .find(|a| a.is_ipv4() == local.is_ipv4())
        .with_context(|| format!("the STUN server {url:?} has no address of this link's family"))?;
    let mut request = Message::new();
    let id = TransactionId::new();
    request
        .build(&[Box::new(id), Box::new(BINDING_REQUEST)])
        .map_err(|e| anyhow!("building a STUN request: {e}"))?;
    let deadline = Instant::now() + STUN_TIMEOUT;
    let mut buf = vec![0u8; RECV_BUFFER];
    let mut next_send = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!("the STUN server {url:?} did not answer within {STUN_TIMEOUT:?}");
        }
        if now >= next_send {
            socket
                .send_to(&request.raw, server)
                .with_context(|| format!("sending to the STUN server {url:?}"))?;
            next_send = now + Duration::from_millis(500);
        }
        socket.set_read_timeout(Some(
            next_send
                .min(deadline)
                .saturating_duration_since(now)
                .max(Duration::from_millis(1)),
        ))?;
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if from != server {
            continue;
        }
        let mut response = Message::new();
        if response.unmarshal_binary(&buf[..n]).is_err() || response.transaction_id != id {
            continue;
        }
        let mut mapped = XorMappedAddress::default();
        mapped
            .get_from(&response)
            .map_err(|e| anyhow!("the STUN server {url:?} answered without an address: {e}"))?;
        return Ok(SocketAddr::new(mapped.ip, mapped.port));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends of a link on loopback, set up the way the ring sets them up.
    async fn pair() -> (Link, Link) {
        pair_with(RECV_SOCKET_BUFFER).await
    }

    /// [`pair`], each socket asking for `recv_buffer` bytes.
    async fn pair_with(recv_buffer: usize) -> (Link, Link) {
        let cfg = LinkConfig {
            bind: IpAddr::from([127, 0, 0, 1]),
            stun: None,
            recv_buffer,
        };
        let (offering, offer) = super::offer(&cfg).await.expect("offer");
        let (answering, answer) = super::answer(&cfg, &offer).await.expect("answer");
        let (a, b) = tokio::join!(offering.accept(&answer), answering.connected());
        (a.expect("offering side"), b.expect("answering side"))
    }

    /// The offer loop head and members share: an attempt whose offer cannot be sent, then one whose
    /// answer is a stale one (it opens nothing), then one answered by a real peer, which opens — an
    /// answer to an attempt given up, coming meanwhile, is dropped rather than taken for its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_is_offered_afresh_until_it_opens_and_no_more_than_it_may() {
        let cfg = LinkConfig {
            bind: IpAddr::from([127, 0, 0, 1]),
            stun: None,
            recv_buffer: RECV_SOCKET_BUFFER,
        };
        let answers = Answers::default();
        let answered = Arc::new(std::sync::Mutex::new(None::<PendingAnswer>));
        let stale = {
            let (_, offer) = super::offer(&cfg).await.expect("an offer");
            let (_, answer) = super::answer(&cfg, &offer).await.expect("an answer");
            answer
        };
        let mut attempts = 0;
        let opened = offer_until_open(&cfg, &answers, 7, "peer", |sdp, attempt| {
            attempts += 1;
            assert_eq!(attempt, attempts);
            let (cfg, answers, answered, stale) = (
                cfg.clone(),
                answers.clone(),
                answered.clone(),
                stale.clone(),
            );
            async move {
                match attempt {
                    1 => bail!("the signaling connection closed"),
                    2 => {
                        assert_eq!(answers.deliver(7, 2, stale), Delivered::Taken);
                        Ok(())
                    }
                    _ => {
                        let (answering, answer) = super::answer(&cfg, &sdp).await?;
                        *answered.lock().expect("answered") = Some(answering);
                        // The first attempt's answer, late: not this attempt's.
                        assert_eq!(answers.deliver(7, 1, stale), Delivered::Late);
                        assert_eq!(answers.deliver(7, 4, String::new()), Delivered::NotOffered);
                        assert_eq!(answers.deliver(7, 3, answer), Delivered::Taken);
                        Ok(())
                    }
                }
            }
        })
        .await
        .expect("opened on the third attempt");
        assert_eq!(attempts, 3);
        let answering = answered.lock().expect("answered").take().expect("answered");
        let other = answering.connected().await.expect("the answering side");
        opened.send(b"hello").await.expect("sent");
        assert_eq!(
            other.recv().await.expect("a message").expect("whole"),
            b"hello"
        );
        // An answer to a link never offered is refused; every attempt failing gives up, saying so.
        assert_eq!(answers.deliver(8, 1, String::new()), Delivered::NotOffered);
        let mut tries = 0;
        let e = offer_until_open(&cfg, &answers, 9, "peer", |_, _| {
            tries += 1;
            async { bail!("the signaling connection closed") }
        })
        .await
        .map(|_| ())
        .expect_err("never sent");
        assert_eq!(tries, LINK_ATTEMPTS);
        assert_eq!(
            failure(&e),
            format!(
                "link 9 to peer did not open in {LINK_ATTEMPTS} attempts: the signaling \
                 connection closed"
            )
        );
    }

    /// Message `i`: its own length and bytes (the last spans several 64 KiB frames).
    fn message(i: usize) -> Vec<u8> {
        let len = if i == 7 { 200_000 } else { 100 + 997 * i };
        (0..len).map(|j| (i * 31 + j) as u8).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_that_takes_the_reads_gets_every_message_in_order_and_hands_them_back() {
        let (a, b) = pair().await;
        let (tx, rx) = std::sync::mpsc::channel();
        b.forward(move |m| {
            let _ = tx.send((std::thread::current().id(), m));
        });
        let me = std::thread::current().id();
        tokio::task::block_in_place(|| {
            let mut reads = b.take_reads();
            for i in 0..8 {
                assert!(a.send_now(&message(i)).expect("send"), "no room for {i}");
                let deadline = Instant::now() + Duration::from_secs(10);
                let (on, got) = loop {
                    match rx.try_recv() {
                        Ok(m) => break m,
                        Err(_) => {
                            assert!(Instant::now() < deadline, "message {i} never came");
                            assert!(reads.pump(Duration::from_secs(1)), "the link ended");
                        }
                    }
                };
                assert_eq!(got.expect("a message"), message(i), "message {i}");
                assert_eq!(on, me, "message {i} was read on the link's thread");
            }
            drop(reads);
            // Given back: the link's own thread reads again, with nobody pumping.
            assert!(a.send_now(&message(8)).expect("send"), "no room");
            let (on, got) = rx
                .recv_timeout(Duration::from_secs(5))
                .expect("handed back");
            assert_eq!(got.expect("a message"), message(8));
            assert_ne!(on, me);
        });
    }

    /// Datagrams the kernel dropped at `port`'s UDP socket on 127.0.0.1 because its receive buffer
    /// was full (the last column of `/proc/net/udp`).
    fn drops(port: u16) -> u64 {
        let table = std::fs::read_to_string("/proc/net/udp").expect("/proc/net/udp");
        let local = format!("0100007F:{port:04X}");
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(local.as_str()))
            .unwrap_or_else(|| panic!("no UDP socket at 127.0.0.1:{port}"));
        let last = line.split_whitespace().last().expect("columns");
        last.parse().expect("the drops column")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_the_receiver_is_slow_to_read_loses_no_datagram() {
        // What a node gets on most systems, whatever this machine allows: its request capped at
        // Linux's usual `net.core.rmem_max` of 208 KiB, which the kernel doubles to 416 KiB.
        let (a, b) = pair_with(212_992).await;
        let port = b.conn.shared.local.port();
        let before = drops(port);
        // Two megabytes in 128 KiB messages (a 1.1 B model's prefill chunk), sent while the
        // receiving consumer is busy elsewhere and reads nothing for 400 ms.
        let burst: Vec<Vec<u8>> = (0..16)
            .map(|i| (0..128 * 1024).map(|j| (i * 7 + j / 3) as u8).collect())
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        b.forward(move |m| {
            let _ = tx.send(m);
        });
        let a = Arc::new(a);
        tokio::task::block_in_place(|| {
            let mut reads = b.take_reads();
            let sender = {
                let (a, burst) = (a.clone(), burst.clone());
                tokio::spawn(async move {
                    for m in &burst {
                        a.send(m).await.expect("send");
                    }
                })
            };
            std::thread::sleep(Duration::from_millis(400));
            let deadline = Instant::now() + Duration::from_secs(60);
            for (i, m) in burst.iter().enumerate() {
                let got = loop {
                    match rx.try_recv() {
                        Ok(got) => break got,
                        Err(_) => {
                            assert!(Instant::now() < deadline, "message {i} never came");
                            assert!(reads.pump(Duration::from_millis(100)), "the link ended");
                        }
                    }
                };
                assert_eq!(&got.expect("a message"), m, "message {i}");
            }
            drop(reads);
            tokio::runtime::Handle::current()
                .block_on(sender)
                .expect("the sender");
        });
        assert_eq!(
            drops(port) - before,
            0,
            "the kernel dropped datagrams at the receiver: the sender had more in flight than its \
             buffer holds"
        );
    }
}
