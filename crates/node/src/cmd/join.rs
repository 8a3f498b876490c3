//! `node join URL`: offer this device to a head's ring. It proves the ring secret to the head's
//! signaling server, says Hello (memory, backend, measured rate, probe), runs the head's probe,
//! fetches only the layers it is assigned (from the Hub, or from the head serving its folder),
//! connects to its neighbours peer to peer, and then runs its layers on every activation that comes
//! around the ring, checking each (integrity hash, fingerprint, route, finite values) before it
//! computes and forwarding the result to the next stage. It stops when the head closes the ring.

use std::collections::HashMap;
use std::io::{BufRead, IsTerminal};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use daisy_engine::Member;
use daisy_loader::Checkpoint;
use daisy_model::Stage;
use daisy_wire::{
    Assignment, DeviceId, ErrorReport, Fingerprint, GemmRate, Hello, HopRecord, Message,
    PROTOCOL_VERSION, Placement, ProbeResult, Progress, Ready, StageTimes, Text, TurnStart,
};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::options::{ComputeArgs, KeepArgs, ResidencyArgs, failure, failure_of};
use crate::control;
use crate::rtc::{self, Link, LinkConfig};
use daisy_signal::{JoinUrl, Role, Secret, Signal};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The join URL the head printed (`http://host:port/join#secret`). Without it the URL is read
    /// from the first line of stdin, which keeps the secret off the command line.
    url: Option<String>,
    /// Read the ring secret from this file when the URL carries none.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// This device's name in the ring (default: the host name and the process id).
    #[arg(long)]
    name: Option<String>,
    /// A STUN server (`stun:host:port`) for devices behind NAT.
    #[arg(long)]
    stun: Option<String>,
    /// Bytes of memory this device announces for weights (default: what the system has available).
    #[arg(long)]
    memory_limit: Option<u64>,
    /// Read the assigned layers from this local copy of the model (a Hugging Face-layout folder)
    /// instead of fetching them. The head checks the fingerprint: another model's copy is refused.
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    residency: ResidencyArgs,
    #[command(flatten)]
    keep: KeepArgs,
}

/// What the compute thread receives.
enum Input {
    Turn(TurnStart),
    Activation(Vec<u8>),
}

fn read_join(args: &Args) -> Result<JoinUrl> {
    let stdin = std::io::stdin();
    let mut url = match &args.url {
        Some(u) => JoinUrl::parse(u)?,
        None => {
            if stdin.is_terminal() {
                let line = rpassword::prompt_password("join URL (input hidden): ")?;
                JoinUrl::parse(&line)?
            } else {
                let mut line = String::new();
                stdin.lock().read_line(&mut line)?;
                JoinUrl::parse(&line).context("the join URL on stdin")?
            }
        }
    };
    if url.secret.is_none() {
        url.secret = Some(match &args.secret_file {
            Some(path) => Secret::parse(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("--secret-file {}", path.display()))?,
            )?,
            None if stdin.is_terminal() => {
                Secret::parse(&rpassword::prompt_password("ring secret (input hidden): ")?)?
            }
            None => {
                let mut line = String::new();
                stdin.lock().read_line(&mut line)?;
                Secret::parse(&line).context("the ring secret on stdin")?
            }
        });
    }
    Ok(url)
}

pub(crate) fn run(args: Args) -> Result<()> {
    daisy_engine::name_notes("join");
    daisy_engine::check_max_resident(args.residency.max_resident_layers)?;
    let join = read_join(&args)?;
    let device = args
        .name
        .clone()
        .unwrap_or_else(control::default_device_name);
    DeviceId::parse(&device).with_context(|| format!("--name {device}"))?;
    #[allow(unused_mut)]
    let mut chosen = super::backend(args.compute.backend)?;
    #[cfg(feature = "test-hooks")]
    {
        chosen.backend = crate::test_hooks::corrupt(chosen.backend);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(member(args, join, device, chosen));
    crate::memory::print_peak("join");
    result
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_signal(ws: &mut Ws) -> Result<Option<Signal>> {
    loop {
        match ws.next().await {
            None | Some(Ok(WsMessage::Close(_))) => return Ok(None),
            Some(Err(e)) => return Err(anyhow!("signaling connection failed: {e}")),
            Some(Ok(WsMessage::Text(t))) => return Ok(Some(Signal::parse(&t)?)),
            Some(Ok(WsMessage::Binary(_))) => bail!("binary signaling message refused"),
            Some(Ok(_)) => {}
        }
    }
}

async fn member(
    args: Args,
    join: JoinUrl,
    device: String,
    chosen: daisy_engine::ChosenBackend,
) -> Result<()> {
    let secret = join.secret.clone().expect("read_join sets it");
    let backend = chosen.backend.clone();
    let hello_probe = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || control::probe(&backend, control::HELLO_PROBE_SEED))
            .await??
    };
    let (mut ws, _) = tokio_tungstenite::connect_async(&join.signal)
        .await
        .with_context(|| format!("could not reach the head at {}", join.base))?;
    // Links gather candidates on the address this device reached the head from.
    let bind: IpAddr = match ws.get_ref() {
        tokio_tungstenite::MaybeTlsStream::Plain(tcp) => tcp.local_addr()?.ip(),
        _ => IpAddr::from([0, 0, 0, 0]),
    };
    let Some(Signal::Challenge { nonce }) = next_signal(&mut ws).await? else {
        bail!("the head did not open with a challenge");
    };
    let auth = Signal::Auth {
        device: device.clone(),
        proof: secret.prove(&nonce, &device)?,
    };
    drop(secret);
    ws.send(WsMessage::Text(auth.to_json().into())).await?;
    match next_signal(&mut ws).await? {
        Some(Signal::Welcome { .. }) => {}
        Some(Signal::Refused { reason }) => bail!("the head refused this device: {reason}"),
        _ => bail!("the head closed the connection without admitting this device"),
    }
    eprintln!("join: admitted to the ring at {} as {device}", join.base);
    let cfg = LinkConfig {
        bind,
        stun: args.stun.clone(),
        recv_buffer: rtc::RECV_SOCKET_BUFFER,
    };

    // Signaling runs on its own task: offers become links, handed over by role.
    let (ws_tx, mut ws_rx) = mpsc::channel::<Signal>(16);
    let (control_tx, control_rx) = oneshot::channel::<Link>();
    // Ring links, both directions, with their signaling ids (the head says which are whose); a link
    // this device offered and could not open in rtc::LINK_ATTEMPTS tries comes as its error.
    let (ring_tx, mut ring_rx) = mpsc::channel::<RingLink>(4);
    let (mut sink, mut stream) = ws.split();
    let writer = tokio::spawn(async move {
        while let Some(s) = ws_rx.recv().await {
            if sink
                .send(WsMessage::Text(s.to_json().into()))
                .await
                .is_err()
            {
                break;
            }
        }
        // Every sender is gone: leave with a closing handshake.
        let _ = sink.close().await;
    });
    let signaling = {
        let ws_tx = ws_tx.clone();
        tokio::spawn(async move {
            let mut control_tx = Some(control_tx);
            let answers = rtc::Answers::default();
            loop {
                let signal = match stream.next().await {
                    None | Some(Ok(WsMessage::Close(_))) | Some(Err(_)) => break,
                    Some(Ok(WsMessage::Text(t))) => match Signal::parse(&t) {
                        Ok(s) => s,
                        Err(e) => {
                            eprintln!("join: {}", failure_of(&e));
                            break;
                        }
                    },
                    Some(Ok(_)) => continue,
                };
                match signal {
                    Signal::Offer {
                        link,
                        attempt,
                        peer,
                        role,
                        sdp,
                    } => {
                        let (answering, answer) = match rtc::answer(&cfg, &sdp).await {
                            Ok(a) => a,
                            Err(e) => {
                                eprintln!("join: answering link {link}: {}", failure(&e));
                                continue;
                            }
                        };
                        let from = peer.clone();
                        let _ = ws_tx
                            .send(Signal::Answer {
                                link,
                                attempt,
                                peer,
                                sdp: answer,
                            })
                            .await;
                        let control = match role {
                            Role::Control => control_tx.take(),
                            Role::Ring => None,
                        };
                        let ring = ring_tx.clone();
                        tokio::spawn(async move {
                            match answering.connected().await {
                                Ok(l) => match control {
                                    Some(tx) => {
                                        let _ = tx.send(l);
                                    }
                                    None => {
                                        let _ = ring.send((link, from, Ok(l))).await;
                                    }
                                },
                                // The offerer tries again (or gives up and says so).
                                Err(e) => eprintln!("join: link {link}: {}", failure(&e)),
                            }
                        });
                    }
                    Signal::Connect { link, peer } => {
                        let (cfg, answers, ws, ring) =
                            (cfg.clone(), answers.clone(), ws_tx.clone(), ring_tx.clone());
                        tokio::spawn(async move {
                            let opened = rtc::offer_until_open(
                                &cfg,
                                &answers,
                                link,
                                &peer,
                                |sdp, attempt| {
                                    let offer = Signal::Offer {
                                        link,
                                        attempt,
                                        peer: peer.clone(),
                                        role: Role::Ring,
                                        sdp,
                                    };
                                    let ws = ws.clone();
                                    async move {
                                        ws.send(offer)
                                            .await
                                            .map_err(|_| anyhow!("the signaling connection closed"))
                                    }
                                },
                            )
                            .await;
                            let _ = ring
                                .send((link, peer, opened.map_err(|e| failure(&e))))
                                .await;
                        });
                    }
                    Signal::Answer {
                        link, attempt, sdp, ..
                    } => match answers.deliver(link, attempt, sdp) {
                        rtc::Delivered::Taken => {}
                        rtc::Delivered::Late => eprintln!(
                            "join: an answer to attempt {attempt} at link {link}, given up: dropped"
                        ),
                        rtc::Delivered::NotOffered => eprintln!(
                            "join: an answer to attempt {attempt} at link {link}, which this \
                             device did not offer"
                        ),
                    },
                    other => eprintln!("join: unexpected signal {other:?}"),
                }
            }
        })
    };

    let control = Arc::new(
        tokio::time::timeout(Duration::from_secs(30), control_rx)
            .await
            .map_err(|_| anyhow!("the head opened no control link within 30 s"))?
            .map_err(|_| anyhow!("the head closed the connection before the control link"))?,
    );
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        device: DeviceId::parse(&device)?,
        memory_bytes: control::memory_bytes(args.memory_limit),
        backend: Text::new(&match &chosen.adapter {
            Some(a) => format!("{}: {a}", backend.name()),
            None => backend.name().to_string(),
        })?,
        gemm_rate: GemmRate::new(hello_probe.1)?,
        probe_hash: hello_probe.0,
        software: Text::new(env!("CARGO_PKG_VERSION"))?,
    };
    control::send(&control, &Message::Hello(hello)).await?;

    let source = Source {
        join: &join,
        device: &device,
        local: args.model.as_deref(),
        residency: Residency {
            max: args.residency.max_resident_layers,
            keep: args.keep.on(),
        },
    };
    let result = serve_ring(&control, &backend, &source, &mut ring_rx).await;
    if let Err(e) = &result {
        let report = Message::Error(error_report(None, &failure(e)));
        if control::send(&control, &report).await.is_ok() {
            // A sent message is only queued: closing at once could lose it, and the head would
            // hear only that the link closed. The head closes its end once it has read it.
            let read_until_closed =
                async { while let Ok(Some(_)) = control::recv(&control).await {} };
            let _ = tokio::time::timeout(REPORT_GRACE, read_until_closed).await;
        }
    }
    control.close().await;
    signaling.abort();
    let _ = signaling.await;
    drop(ws_tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    result
}

/// How long a member that failed waits for the head to read its report before it closes.
const REPORT_GRACE: Duration = Duration::from_secs(3);

/// A ring link by its signaling id, with the device at its other end: the link, or why it did not
/// open.
type RingLink = (u64, String, Result<Link, String>);

fn truncate(s: &str, n: usize) -> String {
    let clean: String = s.chars().filter(|c| !c.is_control()).collect();
    clean.chars().take(n).collect()
}

/// One plan's worth of the ring on this device: the compute thread and the links that feed it.
struct Epoch {
    input: std::sync::mpsc::Sender<Input>,
    worker: std::thread::JoinHandle<()>,
    /// The link from the previous stage, its signaling id, the device that offered it, and what it
    /// feeds.
    up: Arc<Link>,
    up_id: u64,
    up_from: String,
    feed: Feed,
    down: Arc<Link>,
}

impl Epoch {
    async fn stop(self) {
        drop(self.input);
        drop(self.feed);
        self.up.close().await;
        self.down.close().await;
        let worker = self.worker;
        let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    }

    /// The previous stage offered the link from it again: it gave up its side of the one this
    /// epoch reads (which may have opened here all the same), so the new one feeds the stage.
    async fn replace_up(&mut self, link: Link) {
        let link = Arc::new(link);
        self.feed.attach(&link);
        let old = std::mem::replace(&mut self.up, link);
        eprintln!(
            "join: link {} from the previous stage was offered again; the new one replaces it",
            self.up_id
        );
        old.close().await;
    }
}

/// A failure of the compute thread or a link, with the epoch it happened in.
type Failed = (u64, String);

/// The largest activation the link's thread runs itself (see [`start_epoch`]): one frame.
const INLINE_MAX_BYTES: usize = 64 << 10;

/// A step runs on the link's thread only if the one before it took at most this long: while a
/// step runs there the link reads nothing and answers no connectivity check, and a peer that
/// hears nothing for 2.5 s takes the connection for dead. A first step (a GPU's shaders compiled
/// on first use: seconds on a software rasterizer), or a stage that is slow on its device, runs
/// on the compute thread, with the link answering meanwhile.
const INLINE_MAX_STEP: std::time::Duration = std::time::Duration::from_millis(100);

#[allow(clippy::too_many_arguments)]
fn start_epoch(
    epoch: u64,
    plan: daisy_wire::Plan,
    index: usize,
    stage: Arc<Stage>,
    (up_id, up_from, up): (u64, String, Link),
    down: Link,
    hops: mpsc::Sender<HopRecord>,
    fail: mpsc::Sender<Failed>,
    times: StepTimes,
) -> Result<Epoch> {
    let (input_tx, input_rx) = std::sync::mpsc::channel::<Input>();
    let (up, down) = (Arc::new(up), Arc::new(down));
    // A neighbour that dies is the head's to replan around: this member waits for the new plan
    // instead of failing.
    let out = rtc::Outbox::new(down.clone(), |e| {
        eprintln!(
            "join: the link to the next stage: {}; waiting for a new plan",
            failure(&e)
        )
    });
    let runner = Arc::new(std::sync::Mutex::new(Runner::new(
        epoch,
        plan,
        index,
        stage,
        out,
        hops,
        fail.clone(),
        times,
    )));
    // Activations the link's thread queued for the compute thread and it has not run yet.
    let pending = Arc::new(AtomicUsize::new(0));
    let worker = std::thread::Builder::new()
        .name(format!("stage-{index}"))
        .spawn({
            let (runner, pending) = (runner.clone(), pending.clone());
            move || compute(runner, pending, input_rx)
        })?;
    let feed = Feed {
        epoch,
        runner,
        pending,
        input: input_tx.clone(),
        fail,
    };
    feed.attach(&up);
    Ok(Epoch {
        input: input_tx,
        worker,
        up,
        up_id,
        up_from,
        feed,
        down,
    })
}

/// What the link from the previous stage feeds: the stage's runner, directly or through the
/// compute thread.
struct Feed {
    epoch: u64,
    runner: Arc<std::sync::Mutex<Runner>>,
    /// Activations the link's thread queued for the compute thread and it has not run yet.
    pending: Arc<AtomicUsize>,
    input: std::sync::mpsc::Sender<Input>,
    fail: mpsc::Sender<Failed>,
}

impl Feed {
    /// Deliver what `up` receives to the stage.
    ///
    /// A decode-sized activation runs on the link's thread the moment it is whole, when nothing
    /// is queued before it and the last step was quick (`INLINE_MAX_STEP`): handing it to the
    /// compute thread cost a thread wake-up, about 50 µs a hop on this kind of host (the compute
    /// thread sleeps on a halted virtual CPU). A larger one (a prefill chunk), the first, and any
    /// after a slow step go to the compute thread, so the link keeps reading and answering while
    /// it runs. A closed link ends quietly (the head notices the lap that does not come back); a
    /// refused frame ends the member with the refusal.
    fn attach(&self, up: &Link) {
        let (runner, pending) = (self.runner.clone(), self.pending.clone());
        let (input, fail, epoch) = (self.input.clone(), self.fail.clone(), self.epoch);
        // The GEMM workers, parked since the last step, get up while the activation is decrypted.
        up.on_arrival(daisy_gemm_int8::wake);
        up.forward(move |msg| match msg {
            Ok(bytes) => {
                if bytes.len() <= INLINE_MAX_BYTES
                    && pending.load(Ordering::Acquire) == 0
                    && let Ok(mut runner) = runner.try_lock()
                    && runner.quick()
                {
                    runner.input(Input::Activation(bytes));
                    return;
                }
                pending.fetch_add(1, Ordering::AcqRel);
                if input.send(Input::Activation(bytes)).is_err() {
                    pending.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) => {
                let why = format!("the link from the previous stage: {e}");
                let _ = fail.try_send((epoch, why));
            }
        });
    }
}

/// Where this member's layers come from.
struct Source<'a> {
    join: &'a JoinUrl,
    device: &'a str,
    /// `--model`: a local copy to read instead of fetching.
    local: Option<&'a std::path::Path>,
    residency: Residency,
}

/// Where the stage's layers live: `--max-resident-layers` and `--keep-layers`.
#[derive(Clone, Copy)]
struct Residency {
    max: daisy_engine::MaxResident,
    keep: bool,
}

/// Load the assignment's layers (or keep the ones held when they are the same), reporting progress.
async fn take_assignment(
    control: &Arc<Link>,
    backend: &Arc<dyn daisy_gemm_int8::Backend>,
    source: &Source<'_>,
    assignment: &Assignment,
    held: Option<Arc<Stage>>,
) -> Result<Arc<Stage>> {
    if let Some(stage) = held.filter(|s| s.layers() == assignment.layers()) {
        eprintln!("join: keeping layers {:?}", stage.layers());
        return Ok(stage);
    }
    let (progress_tx, mut progress_rx) = mpsc::channel::<(u64, u64)>(8);
    let mut load = {
        let backend = backend.clone();
        let assignment = assignment.clone();
        let base = source.join.base.clone();
        let device = source.device.to_string();
        let local = source.local.map(std::path::Path::to_path_buf);
        let residency = source.residency;
        tokio::task::spawn_blocking(move || {
            load(
                &base,
                &device,
                local.as_deref(),
                &assignment,
                &backend,
                progress_tx,
                residency,
            )
        })
    };
    loop {
        tokio::select! {
            Some((fetched, total)) = progress_rx.recv() => {
                if let Ok(p) = Progress::new(fetched.min(total), total) {
                    control::send(control, &Message::Progress(p)).await?;
                }
            }
            done = &mut load => break Ok(Arc::new(done??)),
        }
    }
}

async fn serve_ring(
    control: &Arc<Link>,
    backend: &Arc<dyn daisy_gemm_int8::Backend>,
    source: &Source<'_>,
    links: &mut mpsc::Receiver<RingLink>,
) -> Result<()> {
    let me = DeviceId::parse(source.device)?;
    let mut placement: Option<Placement> = None;
    let mut held: Option<Arc<Stage>> = None;
    let mut current: Option<Epoch> = None;
    let mut epoch = 0u64;
    // Assigned and loaded, waiting for its links: the plan, the stage index, the stage.
    let mut pending: Option<(daisy_wire::Plan, usize, Arc<Stage>, Fingerprint)> = None;
    let mut expect: Option<daisy_wire::LinkIds> = None;
    // Open links by id, with the device at the other end.
    let mut arrived: HashMap<u64, (String, Link)> = HashMap::new();
    let (hop_tx, mut hop_rx) = mpsc::channel::<HopRecord>(16);
    let times = StepTimes::default();
    let (fail_tx, mut fail_rx) = mpsc::channel::<Failed>(4);
    let outcome = loop {
        tokio::select! {
            msg = control::recv(control) => match msg {
                Ok(None) => {
                    eprintln!("join: the head closed the ring");
                    break Ok(());
                }
                Err(e) => break Err(e.context("the control link")),
                Ok(Some(Message::ProbeRequest(p))) => {
                    let backend = backend.clone();
                    let probed =
                        tokio::task::spawn_blocking(move || control::probe(&backend, p.seed)).await?;
                    let reply = match probed {
                        Ok((hash, rate)) => Message::ProbeResult(ProbeResult {
                            seed: p.seed,
                            hash,
                            gemm_rate: GemmRate::new(rate)?,
                        }),
                        Err(e) => Message::Error(error_report(None, &failure(&e))),
                    };
                    control::send(control, &reply).await?;
                }
                Ok(Some(Message::Heartbeat(h))) => {
                    control::send(control, &Message::Heartbeat(h)).await?;
                }
                Ok(Some(Message::Plan(p))) => placement = Some(p),
                Ok(Some(Message::Assignment(a))) => {
                    // A new plan: the old links and thread go, the layers stay when they are the same.
                    if let Some(e) = current.take() {
                        e.stop().await;
                    }
                    epoch += 1;
                    let Some(p) = placement.as_ref() else {
                        break Err(anyhow!("the head assigned layers before sending the plan"));
                    };
                    let index = a.stage();
                    if p.stage_of(&me) != Some(index) || index == 0 {
                        break Err(anyhow!(
                            "the assignment names stage {index}, which the plan does not give this device"
                        ));
                    }
                    let plan = p.plan().clone();
                    if plan.stages()[index].layers != a.layers() {
                        break Err(anyhow!("the assignment's layers differ from the plan's for stage {index}"));
                    }
                    eprintln!(
                        "join: stage {index} of {}: layers {}..{} of {}@{}",
                        plan.len(),
                        a.layers().start,
                        a.layers().end,
                        a.repo(),
                        &a.commit().as_str()[..12]
                    );
                    let stage = take_assignment(control, backend, source, &a, held.take()).await?;
                    let fingerprint = Fingerprint(stage.fingerprint());
                    if fingerprint != *a.fingerprint() {
                        eprintln!(
                            "join: the slice fetched is of another model (fingerprint {} where the \
                             head expects {}); the head will refuse it",
                            hex::encode(&fingerprint.0[..8]),
                            hex::encode(&a.fingerprint().0[..8])
                        );
                    }
                    held = Some(stage.clone());
                    pending = Some((plan, index, stage, fingerprint));
                    expect = None;
                }
                Ok(Some(Message::Links(ids))) => {
                    expect = Some(ids);
                    // Links of an earlier plan are not this one's.
                    let oldest = ids.up.min(ids.down);
                    arrived.retain(|id, _| *id >= oldest);
                }
                Ok(Some(Message::Turn(t))) => {
                    if let Some(e) = &current {
                        let _ = e.input.send(Input::Turn(t));
                    }
                }
                Ok(Some(Message::Cancel(_))) => {}
                Ok(Some(Message::TimesRequest(r))) => {
                    let (hop, us) = times.take(r.turn);
                    let reply = StageTimes::new(r.turn, hop, us)?;
                    control::send(control, &Message::StageTimes(reply)).await?;
                }
                Ok(Some(other)) => eprintln!("join: ignored {}", other.kind()),
            },
            Some((id, from, link)) = links.recv() => match link {
                Ok(link) => match current.as_mut() {
                    // Only the device at the other end of the link in use may replace it.
                    Some(e) if e.up_id == id && e.up_from == from => e.replace_up(link).await,
                    Some(e) if e.up_id == id => eprintln!(
                        "join: {from} offered link {id}, which {} opened; refused",
                        e.up_from
                    ),
                    // A later attempt replaces an earlier one that opened here too.
                    _ => {
                        arrived.insert(id, (from, link));
                    }
                },
                // This plan's link could not be opened: the head hears why and plans around it.
                Err(why) if expect.is_none_or(|ids| ids.up == id || ids.down == id) => {
                    break Err(anyhow!(why));
                }
                Err(why) => eprintln!("join: {why} (a link of an earlier plan)"),
            },
            Some(hop) = hop_rx.recv() => {
                control::send(control, &Message::Hop(hop)).await?;
            }
            Some((at, why)) = fail_rx.recv() => {
                // A failure of an epoch already replaced is the old plan's, not this one's.
                if at == epoch {
                    break Err(anyhow!(why));
                }
            }
        }
        // Assigned, told its links, and both open: ready.
        let both =
            expect.filter(|ids| arrived.contains_key(&ids.up) && arrived.contains_key(&ids.down));
        if let (Some(ids), Some(_)) = (both, pending.as_ref()) {
            let (plan, index, stage, fingerprint) = pending.take().expect("checked");
            let up = arrived.remove(&ids.up).expect("checked");
            let (_, down) = arrived.remove(&ids.down).expect("checked");
            expect = None;
            control::send(control, &Message::Ready(Ready { fingerprint })).await?;
            eprintln!("join: ready; waiting for activations");
            current = Some(start_epoch(
                epoch,
                plan,
                index,
                stage,
                (ids.up, up.0, up.1),
                down,
                hop_tx.clone(),
                fail_tx.clone(),
                times.clone(),
            )?);
        }
    };
    if let Some(e) = current.take() {
        e.stop().await;
    }
    outcome
}

fn error_report(turn: Option<u64>, message: &str) -> ErrorReport {
    ErrorReport {
        turn,
        message: Text::new(&truncate(message, 200))
            .unwrap_or_else(|_| Text::new("failed").expect("plain text")),
    }
}

/// Fetch and build this device's stage (from `local` when given).
fn load(
    base: &str,
    device: &str,
    local: Option<&std::path::Path>,
    assignment: &Assignment,
    backend: &Arc<dyn daisy_gemm_int8::Backend>,
    progress: mpsc::Sender<(u64, u64)>,
    Residency { max, keep }: Residency,
) -> Result<Stage> {
    // A repo id comes from `$HF_ENDPOINT` (the Hub); a local folder of the head's from the head.
    let endpoint = if assignment.repo().org() == "local" {
        base.to_string()
    } else {
        std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".to_string())
    };
    let client = Arc::new(
        daisy_loader::hub::HubClient::new(&endpoint)?
            .with_client_id(device)
            .with_token_provider(Arc::new(super::TerminalToken)),
    );
    let model = format!("{}@{}", assignment.repo(), assignment.commit());
    let checkpoint = match local {
        // The local copy stands for the assigned repo and commit; whether it is the same model
        // shows in the fingerprint, which the head compares.
        Some(dir) => Checkpoint::from_repo(
            Box::new(daisy_loader::LocalDir::new(dir)),
            assignment.repo().as_str(),
            assignment.commit().as_str(),
        )
        .with_context(|| format!("opening --model {}", dir.display()))?,
        None => Checkpoint::open_with(&model, Some(client.clone()))
            .with_context(|| format!("opening {model} from {endpoint}"))?,
    };
    let config = checkpoint.config().clone();
    let layers = assignment.layers();
    if layers.end > config.num_layers {
        bail!(
            "assigned layers {layers:?}, but the model has {}",
            config.num_layers
        );
    }
    let names: Vec<&str> = layers
        .clone()
        .flat_map(|l| checkpoint.layer_tensors(l))
        .map(|t| t.name.as_str())
        .collect();
    let total: u64 = names
        .iter()
        .filter_map(|n| checkpoint.tensor(n))
        .map(|t| t.byte_len)
        .sum();
    let start = client.fetched();
    let bar = super::fetch::progress_bar(&client, total, "fetching");
    {
        let bar = bar.clone();
        client.set_progress(Arc::new(move |fetched| {
            let done = fetched.saturating_sub(start);
            bar.set_position(done);
            let _ = progress.try_send((done, total));
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::kill_at(done, total);
        }));
    }
    let t0 = Instant::now();
    let precision = crate::cmd::options::precision_of(assignment.weights());
    // A shard of these layers already in the cache is read instead of the layers' tensors.
    let streamed = max.is_some_and(|m| layers.len() > m);
    let kept = keep && precision.is_int8() && layers.len() >= 2;
    let from_cache = (streamed || kept)
        && daisy_engine::shard_path(&checkpoint.fingerprint(), &layers, precision)
            .is_ok_and(|p| p.exists());
    if !from_cache {
        checkpoint.prefetch(&names);
    }
    #[cfg(feature = "test-hooks")]
    let built = crate::test_hooks::drop_a_layer(layers.clone());
    #[cfg(not(feature = "test-hooks"))]
    let built = layers.clone();
    let mut stage = crate::memory::loading(|| {
        daisy_engine::load_layers(&checkpoint, &config, built, false, precision, max, keep)
    })
    .with_context(|| format!("loading layers {layers:?}"))?;
    if stage.is_streamed() {
        crate::memory::streaming();
    }
    bar.finish_and_clear();
    let what = format!("layers {layers:?}");
    daisy_engine::onto_backend(&mut stage, backend, &what)?;
    daisy_engine::warm_up(backend, &what)?;
    eprintln!(
        "join: fetched {} bytes of {model} and built layers {layers:?} in {:.2}s{}",
        client.fetched(),
        t0.elapsed().as_secs_f64(),
        crate::memory::peak_so_far()
    );
    Ok(stage)
}

/// Each step's compute time per turn (the last few turns), for the head's picture of a turn.
#[derive(Clone, Default)]
struct StepTimes(Arc<std::sync::Mutex<std::collections::VecDeque<TurnSteps>>>);

/// A turn's number, this member's hop, and each step's microseconds.
type TurnSteps = (u64, usize, Vec<u32>);

impl StepTimes {
    /// Turns whose times are kept.
    const TURNS: usize = 4;

    fn record(&self, turn: u64, hop: usize, took: std::time::Duration) {
        let mut all = self.0.lock().expect("times lock");
        if all.back().is_none_or(|t| t.0 != turn) {
            if all.len() == Self::TURNS {
                all.pop_front();
            }
            all.push_back((turn, hop, Vec::new()));
        }
        let steps = &mut all.back_mut().expect("pushed").2;
        if steps.len() < daisy_wire::MAX_TIMED_STEPS {
            steps.push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
        }
    }

    /// The hop and step times of `turn` (none when it ran no step here).
    fn take(&self, turn: u64) -> (usize, Vec<u32>) {
        let mut all = self.0.lock().expect("times lock");
        match all.iter().position(|t| t.0 == turn) {
            Some(i) => {
                let (_, hop, us) = all.remove(i).expect("found");
                (hop, us)
            }
            None => (0, Vec::new()),
        }
    }
}

/// A member's stepping state for one epoch, shared by its compute thread and the thread of the link
/// from the previous stage (see [`start_epoch`]): stepped by activations and begun by turn starts,
/// one at a time under its lock.
struct Runner {
    epoch: u64,
    turns: HashMap<u64, bool>,
    waiting: Vec<Vec<u8>>,
    stepper: Stepper,
    fail: mpsc::Sender<Failed>,
    /// A failure was reported: nothing more runs in this epoch.
    failed: bool,
}

/// What one step needs beside the turn bookkeeping.
struct Stepper {
    index: usize,
    member: Member<Arc<daisy_wire::Plan>, Arc<Stage>>,
    out: rtc::Outbox,
    hops: mpsc::Sender<HopRecord>,
    times: StepTimes,
    /// How long the last step took (none yet: `None`).
    last: Option<std::time::Duration>,
    #[cfg(feature = "test-hooks")]
    bad: Option<crate::test_hooks::BadFrame>,
}

impl Stepper {
    fn step(&mut self, bytes: &[u8], turn: u64, cached: bool) -> Result<()> {
        let t0 = std::time::Instant::now();
        #[cfg(feature = "test-hooks")]
        {
            crate::test_hooks::slow_step();
            crate::test_hooks::pace_step();
        }
        let sent = self.member.step(bytes, cached)?;
        let took = t0.elapsed();
        self.last = Some(took);
        self.times.record(turn, self.index, took);
        // The lap moves on to the next device: no GEMM here until it comes round again.
        daisy_gemm_int8::rest();
        if let Some(hop) = &sent.hop {
            let _ = self.hops.blocking_send(HopRecord {
                turn,
                hop: self.index,
                after_layer: hop.after_layer,
                sha256: daisy_wire::Hash(hop.sha256),
            });
        }
        #[cfg(feature = "test-hooks")]
        let sent = daisy_engine::Sent {
            bytes: match self.bad.as_mut() {
                Some(b) => b.send(sent.bytes),
                None => sent.bytes,
            },
            ..sent
        };
        // With the link to the next stage gone, the head replans; nothing to report here.
        let _ = self.out.send_blocking(sent.bytes);
        Ok(())
    }
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    fn new(
        epoch: u64,
        plan: daisy_wire::Plan,
        index: usize,
        stage: Arc<Stage>,
        out: rtc::Outbox,
        hops: mpsc::Sender<HopRecord>,
        fail: mpsc::Sender<Failed>,
        times: StepTimes,
    ) -> Self {
        Self {
            epoch,
            turns: HashMap::new(),
            waiting: Vec::new(),
            stepper: Stepper {
                index,
                member: Member::new(Arc::new(plan), index, stage),
                out,
                hops,
                times,
                last: None,
                #[cfg(feature = "test-hooks")]
                bad: crate::test_hooks::BadFrame::from_env(),
            },
            fail,
            failed: false,
        }
    }

    /// Whether the last step was quick enough for the next to run on the link's thread
    /// ([`INLINE_MAX_STEP`]).
    fn quick(&self) -> bool {
        self.stepper.last.is_some_and(|d| d <= INLINE_MAX_STEP)
    }

    /// Take one input; a failure is reported once, after which inputs are dropped.
    fn input(&mut self, msg: Input) {
        if self.failed {
            return;
        }
        let result = match msg {
            Input::Turn(t) => {
                self.turns.insert(t.turn, t.cached);
                // Only the latest turn runs (see `dispatch`): the map stays small.
                self.turns.retain(|&turn, _| turn + OLD_TURNS_KEPT > t.turn);
                if t.cached
                    && let Err(e) = self.stepper.member.begin(t.turn, t.continues)
                {
                    self.failed = true;
                    let _ = self.fail.blocking_send((self.epoch, failure_of(&e)));
                    return;
                }
                let held = std::mem::take(&mut self.waiting);
                let (turns, waiting, stepper) = (&self.turns, &mut self.waiting, &mut self.stepper);
                held.into_iter().try_for_each(|b| {
                    dispatch(&b, turns, waiting, &mut |b, turn, cached| {
                        stepper.step(b, turn, cached)
                    })
                })
            }
            Input::Activation(bytes) => {
                let (turns, waiting, stepper) = (&self.turns, &mut self.waiting, &mut self.stepper);
                dispatch(&bytes, turns, waiting, &mut |b, turn, cached| {
                    stepper.step(b, turn, cached)
                })
            }
        };
        if let Err(e) = result {
            self.failed = true;
            let index = self.stepper.index;
            let _ = self
                .fail
                .blocking_send((self.epoch, format!("stage {index}: {}", failure(&e))));
        }
    }
}

/// The compute thread: inputs the link's thread did not run itself (turn starts, activations
/// behind others or too large to hold the link for), in order.
fn compute(
    runner: Arc<std::sync::Mutex<Runner>>,
    pending: Arc<AtomicUsize>,
    input: std::sync::mpsc::Receiver<Input>,
) {
    while let Ok(msg) = input.recv() {
        let activation = matches!(msg, Input::Activation(_));
        let mut runner = runner.lock().unwrap_or_else(|e| e.into_inner());
        runner.input(msg);
        if activation {
            // Under the lock: the link's thread runs an activation itself only once every one it
            // queued has run.
            pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// How many turns back a member still knows a turn's start.
const OLD_TURNS_KEPT: u64 = 16;

/// One step of the stage: the activation's bytes, its turn, whether the turn is cached.
type Step<'a> = dyn FnMut(&[u8], u64, bool) -> Result<()> + 'a;

/// Run `bytes` when its turn has started, else hold it (its turn's start is on another link).
fn dispatch(
    bytes: &[u8],
    turns: &HashMap<u64, bool>,
    waiting: &mut Vec<Vec<u8>>,
    step: &mut Step<'_>,
) -> Result<()> {
    let turn = turn_of(bytes)?;
    // A turn the head gave up (it replays under a new number): its laps still on their way are
    // not run, so they cannot touch the keys the new turn writes.
    if let Some(latest) = turns.keys().max()
        && turn < *latest
    {
        eprintln!("join: an activation of turn {turn} skipped: turn {latest} began");
        return Ok(());
    }
    match turns.get(&turn) {
        Some(&cached) => step(bytes, turn, cached),
        None if waiting.len() < 4 => {
            waiting.push(bytes.to_vec());
            Ok(())
        }
        None => bail!("activations of turn {turn}, which the head never started"),
    }
}

/// The turn an activation's bytes belong to, from its header alone (the full check, once, happens
/// in the step).
fn turn_of(bytes: &[u8]) -> Result<u64> {
    daisy_wire::peek_activation_turn(bytes).context("on the ring")
}
