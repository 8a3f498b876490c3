//! One link of the ring: a WebRTC peer connection carrying one ordered, reliable, DTLS-encrypted data
//! channel, over which whole `wire` messages travel as frames of at most 64 KiB.
//!
//! Signaling is not trickled: each side waits for ICE gathering to complete, so the one session
//! description it hands to the signaling server already lists every candidate (host candidates on the
//! address the signaling connection used, plus server-reflexive ones with `--stun`).
//!
//! Sending waits while more than [`SEND_BUFFER_LIMIT`] bytes are handed to SCTP and not yet
//! acknowledged (webrtc's buffer is unbounded otherwise). Receiving reassembles frames under the
//! wire's bounds; a frame the reassembler refuses ends the link with that refusal. A dead peer is
//! noticed by ICE consent freshness: the connection turns `Failed` about 2.5 s after its last packet.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::BytesMut;
use daisy_wire::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_MESSAGE_BYTES, Reassembler, split};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinHandle;
use webrtc::data_channel::{DataChannel, DataChannelEvent, RTCDataChannelInit};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCConfigurationBuilder,
    RTCIceGatheringState, RTCIceServer, RTCPeerConnectionState, RTCSessionDescription,
    SettingEngineBuilder,
};

/// Bytes handed to SCTP and not yet acknowledged before [`Link::send`] waits.
pub(crate) const SEND_BUFFER_LIMIT: usize = 1 << 20;
/// Whole messages queued on the receiving side before the transport stops draining SCTP.
const RECV_QUEUE: usize = 64;
/// SCTP's packet budget on a loopback link, against webrtc's default of 1191 (the IPv6 minimum MTU
/// through a TURN relay). A packet travels as one DTLS record (37 bytes more) in one UDP datagram,
/// which webrtc receives into 1500 bytes per datagram: 1400 keeps clear of that. A SmolLM2
/// activation (576 f32 and its header, about 2.4 KB) then takes two datagrams instead of three, and
/// every datagram a hop saves is a pass of the sender's and the receiver's transport.
const LOOPBACK_SCTP_MTU: u32 = 1400;
/// Longest wait for ICE gathering; what was gathered by then is sent.
const GATHER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait from the answer to an open channel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a link gathers its candidates.
#[derive(Clone, Debug)]
pub(crate) struct LinkConfig {
    /// The local address host candidates bind to: the one the signaling connection used, so the
    /// peer can reach it the way this device reached the head.
    pub(crate) bind: IpAddr,
    /// An optional STUN server (`stun:host:port`) for server-reflexive candidates.
    pub(crate) stun: Option<String>,
}

/// Create the offering side of a link; returns it and the offer to send (JSON, every candidate).
pub(crate) async fn offer(cfg: &LinkConfig) -> Result<(PendingOffer, String)> {
    let conn = Conn::build(cfg).await?;
    let dc = conn
        .pc
        .create_data_channel(
            "ring",
            Some(RTCDataChannelInit {
                ordered: true,
                ..Default::default()
            }),
        )
        .await
        .context("creating the data channel")?;
    let desc = conn
        .pc
        .create_offer(None)
        .await
        .context("creating the offer")?;
    conn.pc
        .set_local_description(desc)
        .await
        .context("setting the local offer")?;
    let sdp = conn.gathered().await?;
    Ok((PendingOffer { conn, dc }, sdp))
}

/// Create the answering side of a link from the peer's offer; returns it and the answer to send.
pub(crate) async fn answer(cfg: &LinkConfig, offer: &str) -> Result<(PendingAnswer, String)> {
    let remote: RTCSessionDescription =
        serde_json::from_str(offer).context("the offer is not a session description")?;
    let conn = Conn::build(cfg).await?;
    conn.pc
        .set_remote_description(remote)
        .await
        .context("applying the peer's offer")?;
    let desc = conn
        .pc
        .create_answer(None)
        .await
        .context("creating the answer")?;
    conn.pc
        .set_local_description(desc)
        .await
        .context("setting the local answer")?;
    let sdp = conn.gathered().await?;
    Ok((PendingAnswer { conn }, sdp))
}

/// An offer sent, waiting for the peer's answer.
pub(crate) struct PendingOffer {
    conn: Conn,
    dc: Arc<dyn DataChannel>,
}

impl PendingOffer {
    /// Apply the peer's answer and wait for the channel to open.
    pub(crate) async fn accept(self, answer: &str) -> Result<Link> {
        let remote: RTCSessionDescription =
            serde_json::from_str(answer).context("the answer is not a session description")?;
        self.conn
            .pc
            .set_remote_description(remote)
            .await
            .context("applying the peer's answer")?;
        tokio::time::timeout(CONNECT_TIMEOUT, wait_open(&self.conn, &self.dc))
            .await
            .map_err(|_| anyhow!("the data channel did not open within {CONNECT_TIMEOUT:?}"))??;
        Ok(Link::start(self.conn, self.dc))
    }
}

/// An answer sent, waiting for the offerer's channel.
pub(crate) struct PendingAnswer {
    conn: Conn,
}

impl PendingAnswer {
    /// Wait for the offerer's data channel to arrive and open.
    pub(crate) async fn connected(mut self) -> Result<Link> {
        let mut channels = self
            .conn
            .channels
            .take()
            .context("the channel was taken already")?;
        let mut state = self.conn.state.clone();
        let dc = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let dc = tokio::select! {
                dc = channels.recv() => dc.context("the connection closed before its channel came")?,
                s = terminal(&mut state) => bail!("the connection is {s} before its channel came"),
            };
            wait_open(&self.conn, &dc).await?;
            Ok(dc)
        })
        .await
        .map_err(|_| anyhow!("the data channel did not open within {CONNECT_TIMEOUT:?}"))??;
        Ok(Link::start(self.conn, dc))
    }
}

/// An open link: whole messages each way.
/// The sending end of a link for a thread outside the runtime's tasks (a stage's compute thread):
/// a message of at most [`DIRECT_MAX_BYTES`] goes out from the calling thread when nothing waits
/// in the queue — one thread wake-up fewer per hop, which a decode lap pays at every stage; a larger
/// one, or one behind a queued one, goes through a task, so the computing thread never waits on the
/// network for a big (prefill) message. Messages leave in the order they are given.
pub(crate) struct Outbox {
    link: Arc<Link>,
    runtime: tokio::runtime::Handle,
    queue: mpsc::Sender<Vec<u8>>,
    /// Messages handed to the task and not yet sent by it.
    queued: Arc<AtomicUsize>,
    failed: Arc<AtomicBool>,
    on_error: Arc<std::sync::Mutex<Option<OnError>>>,
}

/// What an [`Outbox`] does, once, when a send fails.
type OnError = Box<dyn FnOnce(anyhow::Error) + Send>;

/// The largest message an [`Outbox`] sends from the calling thread (one frame on the wire).
const DIRECT_MAX_BYTES: usize = 64 << 10;

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
            runtime: tokio::runtime::Handle::current(),
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
        if bytes.len() <= DIRECT_MAX_BYTES && self.queued.load(Ordering::Acquire) == 0 {
            if let Err(e) = self.runtime.block_on(self.link.send(&bytes)) {
                fail(&self.failed, &self.on_error, e);
                bail!("the link failed");
            }
            return Ok(());
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

pub(crate) struct Link {
    conn: Conn,
    dc: Arc<dyn DataChannel>,
    inbound: Mutex<mpsc::Receiver<Result<Vec<u8>, String>>>,
    next_id: AtomicU64,
    sent: AtomicU64,
    /// Messages the peer began sending on this link and has not finished (frames reassembling).
    partial: Arc<AtomicU64>,
    pump: JoinHandle<()>,
}

impl Link {
    fn start(conn: Conn, dc: Arc<dyn DataChannel>) -> Self {
        let (tx, rx) = mpsc::channel(RECV_QUEUE);
        let partial = Arc::new(AtomicU64::new(0));
        let pump = tokio::spawn(pump(dc.clone(), conn.state.clone(), tx, partial.clone()));
        Self {
            conn,
            dc,
            inbound: Mutex::new(rx),
            next_id: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            partial,
            pump,
        }
    }

    /// Send one whole message (any size the wire allows), frame by frame, each waiting while the
    /// send buffer is full. Fails once the channel is closed or the connection failed.
    pub(crate) async fn send(&self, message: &[u8]) -> Result<()> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        let raw = crate::test_hooks::raw_frames(id, message);
        #[cfg(not(feature = "test-hooks"))]
        let raw: Option<Vec<Vec<u8>>> = None;
        let frames = match raw {
            Some(raw) => raw,
            None => split(id, message)?.iter().map(|f| f.to_bytes()).collect(),
        };
        let mut state = self.conn.state.clone();
        for bytes in frames {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::dump_sent(&bytes);
            let n = bytes.len() as u64;
            tokio::select! {
                r = self.dc.send(BytesMut::from(&bytes[..])) => r.context("sending on the data channel")?,
                s = terminal(&mut state) => bail!("the connection is {s}"),
            }
            self.sent.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
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

    /// Messages the peer began and has not finished sending on this link.
    pub(crate) fn partial(&self) -> u64 {
        self.partial.load(Ordering::Relaxed)
    }

    /// Bytes sent so far, frame headers included.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Close the channel and the connection (the peer sees the channel close at once).
    pub(crate) async fn close(&self) {
        let _ = self.dc.close().await;
        let _ = self.conn.pc.close().await;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// Move the channel's frames through a reassembler into the inbound queue until it closes.
async fn pump(
    dc: Arc<dyn DataChannel>,
    mut state: watch::Receiver<RTCPeerConnectionState>,
    tx: mpsc::Sender<Result<Vec<u8>, String>>,
    partial: Arc<AtomicU64>,
) {
    let mut frames = Reassembler::new(DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_IN_FLIGHT);
    loop {
        tokio::select! {
            event = dc.poll() => match event {
                Some(DataChannelEvent::OnMessage(msg)) => match frames.push(&msg.data).inspect(|_| {
                    partial.store(frames.in_flight() as u64, Ordering::Relaxed);
                }) {
                    Ok(Some(message)) => {
                        if tx.send(Ok(message)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(Err(format!("refused a frame: {e}"))).await;
                        return;
                    }
                },
                Some(DataChannelEvent::OnClose) | None => return,
                Some(_) => {}
            },
            _ = terminal(&mut state) => return,
        }
    }
}

async fn wait_open(conn: &Conn, dc: &Arc<dyn DataChannel>) -> Result<()> {
    let mut state = conn.state.clone();
    loop {
        tokio::select! {
            event = dc.poll() => match event {
                Some(DataChannelEvent::OnOpen) => return Ok(()),
                Some(DataChannelEvent::OnClose) | None => bail!("the data channel closed before it opened"),
                Some(_) => {}
            },
            s = terminal(&mut state) => bail!("the connection is {s} before its channel opened"),
        }
    }
}

/// Wait for `Failed` or `Closed`.
async fn terminal(state: &mut watch::Receiver<RTCPeerConnectionState>) -> RTCPeerConnectionState {
    match state
        .wait_for(|s| {
            matches!(
                s,
                RTCPeerConnectionState::Failed | RTCPeerConnectionState::Closed
            )
        })
        .await
    {
        Ok(s) => *s,
        Err(_) => RTCPeerConnectionState::Closed,
    }
}

struct Conn {
    pc: Arc<dyn PeerConnection>,
    state: watch::Receiver<RTCPeerConnectionState>,
    gathering: watch::Receiver<RTCIceGatheringState>,
    channels: Option<mpsc::Receiver<Arc<dyn DataChannel>>>,
}

impl Conn {
    async fn build(cfg: &LinkConfig) -> Result<Self> {
        let (state_tx, state) = watch::channel(RTCPeerConnectionState::New);
        let (gathering_tx, gathering) = watch::channel(RTCIceGatheringState::New);
        let (channels_tx, channels) = mpsc::channel(2);
        let handler = Handler {
            state: state_tx,
            gathering: gathering_tx,
            channels: channels_tx,
        };
        let ice_servers = cfg
            .stun
            .iter()
            .map(|url| RTCIceServer {
                urls: vec![url.clone()],
                ..Default::default()
            })
            .collect();
        // Failed 2.5 s after the last packet (the defaults take 29 s): a dead member is replanned
        // around quickly, and a keepalive every 300 ms keeps an idle link from flapping.
        // mDNS off: candidates name the address the signaling connection used, never a `.local`
        // name, and its multicast socket cannot even be made on a host without a multicast route
        // (an isolated LAN with no gateway: building the connection failed with "No such device").
        let mut settings = SettingEngineBuilder::new();
        if cfg.bind.is_loopback() {
            // Both ends on this machine: the path is loopback, whose MTU is far above any
            // datagram here, so SCTP may fill a datagram up to webrtc's receive buffer.
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
        let pc = Box::pin(
            PeerConnectionBuilder::new()
                .with_configuration(
                    RTCConfigurationBuilder::new()
                        .with_ice_servers(ice_servers)
                        .build(),
                )
                .with_setting_engine(settings)
                .with_handler(Arc::new(handler))
                .with_udp_addrs(vec![format!("{}:0", bracket(cfg.bind))])
                .with_data_channel_send_buffer_limit(SEND_BUFFER_LIMIT)
                .build(),
        )
        .await
        .context("setting up a WebRTC peer connection")?;
        Ok(Self {
            pc: Arc::new(pc),
            state,
            gathering,
            channels: Some(channels),
        })
    }

    async fn gathered(&self) -> Result<String> {
        let mut gathering = self.gathering.clone();
        let _ = tokio::time::timeout(
            GATHER_TIMEOUT,
            gathering.wait_for(|s| *s == RTCIceGatheringState::Complete),
        )
        .await;
        let desc = self
            .pc
            .local_description()
            .await
            .context("no local description after setting it")?;
        Ok(serde_json::to_string(&desc)?)
    }
}

fn bracket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

struct Handler {
    state: watch::Sender<RTCPeerConnectionState>,
    gathering: watch::Sender<RTCIceGatheringState>,
    channels: mpsc::Sender<Arc<dyn DataChannel>>,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Handler {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        self.gathering.send_replace(state);
    }

    async fn on_connection_state_change(&self, state: RTCPeerConnectionState) {
        self.state.send_replace(state);
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        let _ = self.channels.try_send(channel);
    }
}
