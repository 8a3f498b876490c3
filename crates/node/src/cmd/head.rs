//! `node head`: stage 0 of the ring. It serves signaling (a WebSocket at `/ring` on its HTTP
//! server) and, when the model is a local folder, that folder in the Hub's layout for the members
//! to fetch their own byte ranges from; it prints a join URL carrying a fresh ring secret, admits the
//! members that prove the secret, probes them, plans, assigns each its layers, connects the ring peer
//! to peer (stage i → i + 1, the last back to the head), and drives the turns: it embeds, runs its
//! own layers, sends the hidden state around, applies the lm_head, samples, and streams the answer.
//! Verify re-runs the turn with every layer on the head and compares the ids.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use axum::Router;
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::routing::get;
use daisy_engine::{
    BackendReport, HopReport, LapHeader, Opened, Prompt, TurnOptions, TurnReport, generate_turn,
    load_stage, peak_rss_bytes, plan_ranges, receive_at_head, send, verify,
};
use daisy_loader::{Checkpoint, LocalDir};
use daisy_model::Stage;
use daisy_ring::{DeviceInfo, Exclusion, ModelFacts, plan_layers};
use daisy_wire::{
    Assignment, Commit, DeviceId, Fingerprint, GemmRate, Hello, Message, Placement, Plan,
    ProbeRequest, RepoId, TurnStart,
};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::options::{ComputeArgs, FormatArgs, GenerateArgs};
use crate::control;
use crate::rtc::{self, Link, LinkConfig};
use crate::signal::{HEAD, JoinUrl, Role, Secret, Signal, nonce};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local model folder in Hugging Face layout (served to the members from this head), or a
    /// repo id `org/name[@revision]` (every device fetches its own slice from `$HF_ENDPOINT`).
    #[arg(long)]
    pub(crate) model: String,
    /// Address of the head's server (signaling, and the model folder); `0.0.0.0:8788` for a LAN.
    /// Port 0 picks a free one. The join URL is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:8788")]
    pub(crate) listen: SocketAddr,
    /// Read the ring secret from this file instead of making a new one at each start.
    #[arg(long)]
    pub(crate) secret_file: Option<PathBuf>,
    /// A STUN server (`stun:host:port`) for devices behind NAT; host candidates only without it.
    #[arg(long)]
    pub(crate) stun: Option<String>,
    /// Layer count of each stage, head first (`10,10,10`): the plan, the members taking stages 1, 2,
    /// … in the order they join. Without it the planner splits by measured rate and memory.
    #[arg(long, value_delimiter = ',')]
    pub(crate) stages: Option<Vec<usize>>,
    /// Members to wait for before planning (default: one per stage of `--stages`, else 1).
    #[arg(long)]
    pub(crate) members: Option<usize>,
    /// Bytes of memory the head announces for weights (default: what the system has available).
    #[arg(long)]
    pub(crate) memory_limit: Option<u64>,
    /// One prompt: run it once the ring is ready, then stop the ring. Without it, prompts are read
    /// from stdin, one per line, each its own turn.
    #[arg(long)]
    pub(crate) prompt: Option<String>,
    #[command(flatten)]
    pub(crate) generate: GenerateArgs,
    #[command(flatten)]
    pub(crate) compute: ComputeArgs,
    /// Skip Verify (the re-run of each turn with every layer on the head).
    #[arg(long)]
    pub(crate) no_verify: bool,
    #[command(flatten)]
    pub(crate) format: FormatArgs,
}

/// Longest wait for a member's Hello or probe result.
const HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the members to load their layers.
const LOAD_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest wait for one lap to come back around the ring.
const LAP_TIMEOUT: Duration = Duration::from_secs(120);

/// The model as the ring knows it: opened on the head, and the repo and commit members fetch.
struct Source {
    opened: Opened,
    repo: RepoId,
    commit: Commit,
    /// The folder the head serves, when the model is local.
    folder: Option<PathBuf>,
}

/// A repo name for a local folder: its last path component in the Hub's grammar.
fn local_repo(folder: &Path) -> Result<RepoId> {
    let name = folder
        .canonicalize()
        .with_context(|| format!("model folder {}", folder.display()))?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let clean = clean.trim_matches(['.', '-', '_']);
    let clean = if clean.is_empty() { "model" } else { clean };
    Ok(RepoId::parse(&format!("local/{clean}"))?)
}

fn open_source(model: &str) -> Result<Source> {
    let path = Path::new(model);
    if path.is_file() {
        bail!(
            "--model {model} is a file; the ring serves its members a model folder in Hugging \
             Face layout, or each fetches from the Hub by repo id"
        );
    }
    if path.is_dir() {
        let repo = local_repo(path)?;
        let commit = super::mirror::folder_commit(path)?;
        let checkpoint =
            Checkpoint::from_repo(Box::new(LocalDir::new(path)), repo.as_str(), &commit)
                .with_context(|| format!("opening model {model}"))?;
        let opened = Opened::new(checkpoint).with_context(|| format!("model {model}"))?;
        return Ok(Source {
            opened,
            repo,
            commit: Commit::parse(&commit)?,
            folder: Some(path.to_path_buf()),
        });
    }
    let opened = super::open(model)?;
    let repo = RepoId::parse(opened.checkpoint.repo_id())
        .with_context(|| format!("--model {model} is neither a folder nor a repo id"))?;
    let commit = Commit::parse(opened.checkpoint.commit())?;
    Ok(Source {
        opened,
        repo,
        commit,
        folder: None,
    })
}

/// Signaling shared by the WebSocket handlers and the driver.
struct Shared {
    secret: Secret,
    cfg: LinkConfig,
    /// The WebSocket of each admitted member.
    peers: Mutex<HashMap<String, mpsc::Sender<Signal>>>,
    /// Offers the head made, waiting for their answer.
    answers: Mutex<HashMap<u64, oneshot::Sender<String>>>,
    /// Links the head expects a member to offer, and where to hand them once open.
    incoming: Mutex<HashMap<u64, oneshot::Sender<Result<Link>>>>,
    next_link: AtomicU64,
    /// Admitted members with their control link, in the order they joined.
    joined: mpsc::Sender<(String, Link)>,
}

impl Shared {
    fn link_id(&self) -> u64 {
        self.next_link.fetch_add(1, Ordering::Relaxed)
    }

    async fn signal(&self, device: &str, signal: Signal) -> Result<()> {
        let tx = self
            .peers
            .lock()
            .expect("peers lock")
            .get(device)
            .cloned()
            .with_context(|| format!("member {device} is not connected"))?;
        tx.send(signal)
            .await
            .map_err(|_| anyhow!("member {device} left"))
    }

    /// Offer a link to `device` (the head sending on it) and wait for it to open.
    async fn offer_to(&self, device: &str, role: Role) -> Result<Link> {
        let link = self.link_id();
        let (tx, rx) = oneshot::channel();
        self.answers.lock().expect("answers lock").insert(link, tx);
        let (pending, sdp) = rtc::offer(&self.cfg).await?;
        self.signal(
            device,
            Signal::Offer {
                link,
                peer: HEAD.to_string(),
                role,
                sdp,
            },
        )
        .await?;
        let answer = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .map_err(|_| anyhow!("member {device} did not answer the offer within 30 s"))?
            .map_err(|_| anyhow!("member {device} left before answering"))?;
        pending.accept(&answer).await
    }

    /// Relay one signal from member `from`, or take it when it is addressed to the head.
    async fn route(self: &Arc<Self>, from: &str, signal: Signal) -> Result<()> {
        match signal {
            Signal::Offer {
                link,
                peer,
                role: Role::Ring,
                sdp,
            } if peer == HEAD => {
                let Some(done) = self.incoming.lock().expect("incoming lock").remove(&link) else {
                    bail!("member {from} offered link {link}, which the head did not ask for");
                };
                let (pending, answer) = rtc::answer(&self.cfg, &sdp).await?;
                self.signal(
                    from,
                    Signal::Answer {
                        link,
                        peer: HEAD.to_string(),
                        sdp: answer,
                    },
                )
                .await?;
                tokio::spawn(async move {
                    let _ = done.send(pending.connected().await);
                });
                Ok(())
            }
            Signal::Answer { link, peer, sdp } if peer == HEAD => {
                let Some(done) = self.answers.lock().expect("answers lock").remove(&link) else {
                    bail!("member {from} answered link {link}, which the head did not offer");
                };
                let _ = done.send(sdp);
                Ok(())
            }
            Signal::Offer {
                link,
                peer,
                role: Role::Ring,
                sdp,
            } => {
                self.signal(
                    &peer,
                    Signal::Offer {
                        link,
                        peer: from.to_string(),
                        role: Role::Ring,
                        sdp,
                    },
                )
                .await
            }
            Signal::Answer { link, peer, sdp } => {
                self.signal(
                    &peer,
                    Signal::Answer {
                        link,
                        peer: from.to_string(),
                        sdp,
                    },
                )
                .await
            }
            other => bail!("member {from} sent an unexpected {other:?}"),
        }
    }
}

async fn ring_socket(
    ws: WebSocketUpgrade,
    State(shared): State<Arc<Shared>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
) -> Response {
    ws.max_message_size(crate::signal::MAX_SIGNAL_BYTES)
        .on_upgrade(move |socket| async move {
            if let Err(e) = member_session(socket, shared, addr).await {
                eprintln!("head: {addr}: {e:#}");
            }
        })
}

async fn next_signal(socket: &mut WebSocket) -> Result<Option<Signal>> {
    loop {
        match socket.recv().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(anyhow!("signaling connection failed: {e}")),
            Some(Ok(WsMessage::Text(text))) => return Signal::parse(&text).map(Some),
            Some(Ok(WsMessage::Close(_))) => return Ok(None),
            Some(Ok(WsMessage::Binary(_))) => bail!("binary signaling message refused"),
            Some(Ok(_)) => {}
        }
    }
}

/// One member's signaling connection: the secret checked before anything else, then its control
/// link, then relaying its signals until it leaves.
async fn member_session(
    mut socket: WebSocket,
    shared: Arc<Shared>,
    addr: SocketAddr,
) -> Result<()> {
    let challenge = nonce();
    let hello = Signal::Challenge {
        nonce: hex::encode(challenge),
    };
    socket.send(WsMessage::Text(hello.to_json().into())).await?;
    let first = tokio::time::timeout(Duration::from_secs(10), next_signal(&mut socket)).await;
    let refuse = |reason: &str| Signal::Refused {
        reason: reason.to_string(),
    };
    let device = match first {
        Ok(Ok(Some(Signal::Auth { device, proof }))) => {
            if !shared.secret.check(&challenge, &device, &proof) {
                let r = refuse("wrong ring secret");
                socket.send(WsMessage::Text(r.to_json().into())).await?;
                bail!("refused: wrong ring secret");
            }
            if DeviceId::parse(&device).is_err() || device == HEAD {
                let r =
                    refuse("device name refused: expected 1-64 of A-Z a-z 0-9 . _ -, not `head`");
                socket.send(WsMessage::Text(r.to_json().into())).await?;
                bail!("refused: bad device name");
            }
            device
        }
        Ok(Ok(Some(_))) | Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
            let r = refuse("expected an auth message first");
            let _ = socket.send(WsMessage::Text(r.to_json().into())).await;
            bail!("refused: no valid auth message");
        }
    };
    let (tx, mut rx) = mpsc::channel::<Signal>(16);
    let taken = {
        let mut peers = shared.peers.lock().expect("peers lock");
        let taken = peers.contains_key(&device);
        if !taken {
            peers.insert(device.clone(), tx);
        }
        taken
    };
    if taken {
        let r = refuse("a member of that name is already in the ring");
        socket.send(WsMessage::Text(r.to_json().into())).await?;
        bail!("refused: device {device} already joined");
    }
    let welcome = Signal::Welcome {
        device: device.clone(),
    };
    socket
        .send(WsMessage::Text(welcome.to_json().into()))
        .await?;
    eprintln!("head: {device} joined from {}", addr.ip());
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        while let Some(signal) = rx.recv().await {
            if sink
                .send(WsMessage::Text(signal.to_json().into()))
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = sink.close().await;
    });
    {
        let shared = shared.clone();
        let device = device.clone();
        tokio::spawn(async move {
            match shared.offer_to(&device, Role::Control).await {
                Ok(link) => {
                    let _ = shared.joined.send((device, link)).await;
                }
                Err(e) => eprintln!("head: no control link to {device}: {e:#}"),
            }
        });
    }
    let result = loop {
        let signal = match stream.next().await {
            None | Some(Ok(WsMessage::Close(_))) => break Ok(()),
            Some(Err(e)) => break Err(anyhow!("signaling connection failed: {e}")),
            Some(Ok(WsMessage::Text(text))) => match Signal::parse(&text) {
                Ok(s) => s,
                Err(e) => break Err(e),
            },
            Some(Ok(_)) => continue,
        };
        let shared = shared.clone();
        let from = device.clone();
        tokio::spawn(async move {
            if let Err(e) = shared.route(&from, signal).await {
                eprintln!("head: signal from {from}: {e:#}");
            }
        });
    };
    shared.peers.lock().expect("peers lock").remove(&device);
    writer.abort();
    result
}

/// A member in the plan.
struct Member {
    device: String,
    hello: Hello,
    control: Arc<Link>,
}

/// What the planner knows of the model: int8 bytes and multiply-accumulates per layer and head.
fn model_facts(opened: &Opened) -> ModelFacts {
    let ck = &opened.checkpoint;
    let elements =
        |ts: Vec<&daisy_loader::TensorInfo>| ts.iter().map(|t| t.elements()).sum::<usize>();
    let layer = elements(ck.layer_tensors(0));
    let head = elements(ck.non_layer_tensors());
    let config = opened.config();
    ModelFacts {
        n_layers: config.num_layers,
        layer_bytes: layer as u64,
        head_bytes: head as u64,
        layer_macs: layer as f64,
        head_macs: (config.vocab_size * config.hidden_size) as f64,
    }
}

#[derive(Serialize)]
struct LapStats {
    laps: usize,
    p50_ms: f64,
    p99_ms: f64,
}

fn lap_stats(mut ms: Vec<f64>) -> LapStats {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if ms.is_empty() {
            0.0
        } else {
            ms[((ms.len() - 1) as f64 * q).round() as usize]
        }
    };
    LapStats {
        laps: ms.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    }
}

/// `--format json`: the turn's report with the ring's own facts.
#[derive(Serialize)]
struct RingReport {
    #[serde(flatten)]
    turn: TurnReport,
    devices: Vec<String>,
    excluded: Vec<String>,
    lap_ms: LapStats,
    bytes_sent_by_head: u64,
    /// Bytes of the head's model folder each member fetched (when the head serves its folder).
    bytes_served: Option<std::collections::BTreeMap<String, u64>>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let opts = args.generate.turn_options();
    opts.check()?;
    let secret = match &args.secret_file {
        Some(path) => Secret::parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("--secret-file {}", path.display()))?,
        )
        .with_context(|| format!("--secret-file {}", path.display()))?,
        None => Secret::random(),
    };
    let source = open_source(&args.model)?;
    let n_layers = source.opened.config().num_layers;
    if let Some(counts) = &args.stages {
        Plan::from_counts(counts, n_layers).with_context(|| format!("--stages {counts:?}"))?;
        if counts.len() < 2 {
            bail!("--stages {counts:?}: a ring needs the head and at least one member");
        }
    }
    let chosen = super::backend(args.compute.backend)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(args, opts, secret, source, chosen))
}

async fn serve(
    args: Args,
    opts: TurnOptions,
    secret: Secret,
    source: Source,
    chosen: daisy_engine::ChosenBackend,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not listen on {}", args.listen))?;
    let shown = crate::net::reachable(listener.local_addr()?);
    let bind: IpAddr = shown.ip();
    let (joined_tx, mut joined_rx) = mpsc::channel(16);
    let shared = Arc::new(Shared {
        secret: secret.clone(),
        cfg: LinkConfig {
            bind,
            stun: args.stun.clone(),
        },
        peers: Mutex::new(HashMap::new()),
        answers: Mutex::new(HashMap::new()),
        incoming: Mutex::new(HashMap::new()),
        next_link: AtomicU64::new(0),
        joined: joined_tx,
    });
    let mut app = Router::new()
        .route("/ring", get(ring_socket))
        .with_state(shared.clone());
    let mut served = None;
    if let Some(folder) = &source.folder {
        let (routes, counter) = super::mirror::folder_router(source.repo.clone(), folder.clone());
        app = app.merge(routes);
        served = Some(counter);
    }
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    // The join URL is the one place the secret is shown: stdout, for the person starting the ring.
    let join = format!("http://{shown}/join#{}", secret.expose());
    debug_assert!(JoinUrl::parse(&join).is_ok());
    println!("join: {join}");
    std::io::stdout().flush()?;
    eprintln!(
        "head: serving {} ({}@{}) on http://{shown}; run `node join URL` on each device with the \
         join URL above",
        args.model,
        source.repo,
        &source.commit.as_str()[..12]
    );

    let ring = Ring {
        args: &args,
        opts: &opts,
        served,
    };
    let result = drive(&ring, &shared, &mut joined_rx, source, chosen).await;
    server.abort();
    result
}

/// What every turn of one head process shares.
struct Ring<'a> {
    args: &'a Args,
    opts: &'a TurnOptions,
    /// Bytes the head's folder served, per member (when it serves its folder).
    served: Option<super::mirror::Served>,
}

/// A connected ring, ready for turns.
struct Session<'a> {
    ring: &'a Ring<'a>,
    opened: &'a Opened,
    plan: Plan,
    head: Stage,
    members: Vec<Member>,
    inbox: mpsc::Receiver<(usize, Result<Option<Message>>)>,
    to_ring: mpsc::Sender<Vec<u8>>,
    from_ring: std::sync::mpsc::Receiver<Result<Vec<u8>>>,
    devices: Vec<String>,
    excluded: Vec<String>,
    chosen: daisy_engine::ChosenBackend,
    down: Arc<Link>,
}

async fn drive(
    ring: &Ring<'_>,
    shared: &Arc<Shared>,
    joined: &mut mpsc::Receiver<(String, Link)>,
    source: Source,
    chosen: daisy_engine::ChosenBackend,
) -> Result<()> {
    let args = ring.args;
    let backend = chosen.backend.clone();
    let needed = args
        .members
        .unwrap_or_else(|| args.stages.as_ref().map_or(1, |s| s.len() - 1));
    let head_probe = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || control::probe(&backend, control::HELLO_PROBE_SEED))
            .await??
    };

    // 1. members join and say Hello; each runs a fresh probe.
    let mut members: Vec<Member> = Vec::new();
    let mut excluded: Vec<String> = Vec::new();
    eprintln!("head: waiting for {needed} member(s)");
    while members.len() < needed {
        let (device, link) = joined
            .recv()
            .await
            .context("the signaling server stopped")?;
        let link = Arc::new(link);
        let Message::Hello(hello) = control::expect(&link, "hello", HELLO_TIMEOUT).await? else {
            eprintln!("head: {device} did not start with a hello; left out");
            continue;
        };
        if hello.device.as_str() != device {
            eprintln!("head: {device} says it is {}; left out", hello.device);
            continue;
        }
        let seed = u64::from_le_bytes(nonce()[..8].try_into().expect("8 bytes"));
        control::send(&link, &Message::ProbeRequest(ProbeRequest { seed })).await?;
        let expected = {
            let backend = backend.clone();
            tokio::task::spawn_blocking(move || control::probe(&backend, seed)).await??
        };
        let Message::ProbeResult(result) =
            control::expect(&link, "probe result", HELLO_TIMEOUT).await?
        else {
            eprintln!("head: {device} did not answer the probe; left out");
            continue;
        };
        if result.seed != seed || result.hash != expected.0 || hello.probe_hash != head_probe.0 {
            let why = format!(
                "{device}: left out, its probe disagrees (SHA-256 {} where the head computed {})",
                hex::encode(&result.hash.0[..8]),
                hex::encode(&expected.0.0[..8])
            );
            eprintln!("head: {why}");
            excluded.push(why);
            link.close().await;
            continue;
        }
        eprintln!(
            "head: {device}: {}, {:.1} GMAC/s, memory {}, probe matches",
            hello.backend.as_str(),
            result.gemm_rate.get() / 1e9,
            hello
                .memory_bytes
                .map_or("unknown".to_string(), |m| format!("{} MiB", m >> 20))
        );
        members.push(Member {
            device,
            hello,
            control: link,
        });
    }

    // 2. the plan.
    let opened = &source.opened;
    let n_layers = opened.config().num_layers;
    let (plan, members) = match &args.stages {
        Some(counts) => (Plan::from_counts(counts, n_layers)?, members),
        None => {
            let mut devices = vec![DeviceInfo {
                id: DeviceId::parse(HEAD)?,
                memory_bytes: control::memory_bytes(args.memory_limit),
                gemm_rate: GemmRate::new(head_probe.1)?,
                probe_hash: head_probe.0,
            }];
            devices.extend(members.iter().map(|m| DeviceInfo::from(&m.hello)));
            let decision = plan_layers(&devices, &model_facts(opened))?;
            for e in &decision.excluded {
                let why = match &e.reason {
                    Exclusion::ProbeMismatch { .. } => "its probe disagrees",
                    Exclusion::NoRoom => "its memory cannot hold a layer",
                    Exclusion::TooSlowForALayer => "too slow for a layer",
                    Exclusion::Unneeded => "the head holds the whole model",
                };
                let line = format!("{}: left out, {why}", e.device);
                eprintln!("head: {line}");
                excluded.push(line);
            }
            eprintln!(
                "head: the plan estimates {:.3} s per token",
                decision.seconds_per_token
            );
            let kept: Vec<Member> = members
                .into_iter()
                .filter(|m| decision.devices.iter().any(|d| d.as_str() == m.device))
                .collect();
            (decision.plan, kept)
        }
    };
    if members.len() + 1 != plan.len() {
        bail!(
            "the plan has {} stages but {} member(s) are in it",
            plan.len(),
            members.len()
        );
    }
    let mut devices = vec![HEAD.to_string()];
    devices.extend(members.iter().map(|m| m.device.clone()));
    let placement = Placement::new(
        plan.clone(),
        devices
            .iter()
            .map(|d| DeviceId::parse(d))
            .collect::<Result<_, _>>()?,
    )?;
    for (i, span) in plan.stages().iter().enumerate() {
        eprintln!(
            "head: stage {i} = {} holds layers {}..{}",
            devices[i], span.layers.start, span.layers.end
        );
    }

    // 3. the head's own layers load while the members fetch theirs.
    let precision = args.compute.precision;
    let fingerprint = Fingerprint(opened.checkpoint.fingerprint());
    for (i, m) in members.iter().enumerate() {
        let stage = i + 1;
        control::send(&m.control, &Message::Plan(placement.clone())).await?;
        let assignment = Assignment::new(
            source.repo.clone(),
            source.commit.clone(),
            fingerprint,
            stage,
            plan.stages()[stage].layers.clone(),
        )?;
        control::send(&m.control, &Message::Assignment(assignment)).await?;
    }

    // 4. the ring's links: stage i offers to stage i + 1, the last to the head.
    let down = {
        let shared = shared.clone();
        let first = members.first().map(|m| m.device.clone()).expect("a member");
        tokio::spawn(async move { shared.offer_to(&first, Role::Ring).await })
    };
    let up = {
        let link = shared.link_id();
        let (tx, rx) = oneshot::channel();
        shared
            .incoming
            .lock()
            .expect("incoming lock")
            .insert(link, tx);
        let last = members.last().expect("a member");
        shared
            .signal(
                &last.device,
                Signal::Connect {
                    link,
                    peer: HEAD.to_string(),
                },
            )
            .await?;
        rx
    };
    for i in 0..members.len().saturating_sub(1) {
        let link = shared.link_id();
        shared
            .signal(
                &members[i].device,
                Signal::Connect {
                    link,
                    peer: members[i + 1].device.clone(),
                },
            )
            .await?;
    }

    // Every member's control messages, tagged with its stage, on one queue.
    let (inbox_tx, mut inbox) = mpsc::channel::<(usize, Result<Option<Message>>)>(256);
    for (i, m) in members.iter().enumerate() {
        let link = m.control.clone();
        let tx = inbox_tx.clone();
        tokio::spawn(async move {
            loop {
                let msg = control::recv(&link).await;
                let end = !matches!(msg, Ok(Some(_)));
                if tx.send((i + 1, msg)).await.is_err() || end {
                    break;
                }
            }
        });
    }

    let head_stage = {
        let plan = plan.clone();
        let backend = backend.clone();
        let t0 = Instant::now();
        let stage = tokio::task::block_in_place(|| {
            load_stage(opened, &plan, 0, precision, &backend).map_err(anyhow::Error::from)
        })?;
        eprintln!(
            "head: loaded its layers {:?} in {:.2}s",
            stage.layers(),
            t0.elapsed().as_secs_f64()
        );
        stage
    };

    // 5. every member reports its download and says Ready with the fingerprint it computed.
    let mut ready = vec![false; members.len()];
    let deadline = tokio::time::Instant::now() + LOAD_TIMEOUT;
    let mut last_progress = HashMap::new();
    while ready.iter().any(|r| !r) {
        let (stage, msg) = tokio::time::timeout_at(deadline, inbox.recv())
            .await
            .map_err(|_| anyhow!("the members did not load within {LOAD_TIMEOUT:?}"))?
            .context("member queue closed")?;
        let name = &devices[stage];
        match msg {
            Ok(Some(Message::Progress(p))) => {
                let pct = 100 * p.fetched() / p.total().max(1);
                let shown = last_progress.entry(stage).or_insert(u64::MAX);
                if *shown != pct && (pct % 25 == 0 || pct == 100) {
                    *shown = pct;
                    eprintln!(
                        "head: {name} fetched {} of {} bytes ({pct}%)",
                        p.fetched(),
                        p.total()
                    );
                }
            }
            Ok(Some(Message::Ready(r))) => {
                if r.fingerprint != fingerprint {
                    bail!(
                        "{name} (stage {stage}) loaded another model: fingerprint {} where the \
                         head's is {}",
                        hex::encode(&r.fingerprint.0[..8]),
                        hex::encode(&fingerprint.0[..8])
                    );
                }
                eprintln!("head: {name} is ready (stage {stage})");
                ready[stage - 1] = true;
            }
            Ok(Some(Message::Error(e))) => {
                bail!("{name} (stage {stage}) failed: {}", e.message.as_str())
            }
            Ok(Some(other)) => eprintln!("head: {name} sent an unexpected {}", other.kind()),
            Ok(None) => bail!("{name} (stage {stage}) left the ring while loading"),
            Err(e) => bail!("{name} (stage {stage}): {e:#}"),
        }
    }
    let down = Arc::new(down.await?.context("the head's link to stage 1")?);
    let up = Arc::new(
        tokio::time::timeout(Duration::from_secs(30), up)
            .await
            .map_err(|_| anyhow!("the last stage did not connect back to the head within 30 s"))?
            .map_err(|_| anyhow!("the last stage's link was dropped"))?
            .context("the last stage's link to the head")?,
    );
    eprintln!(
        "head: the ring is connected: {}",
        devices.join(" -> ") + " -> head"
    );

    // Laps cross from the engine's thread to the links through two queues.
    let (to_ring, mut to_ring_rx) = mpsc::channel::<Vec<u8>>(4);
    let (from_ring_tx, from_ring) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(4);
    {
        let down = down.clone();
        tokio::spawn(async move {
            while let Some(bytes) = to_ring_rx.recv().await {
                if let Err(e) = down.send(&bytes).await {
                    eprintln!("head: sending to stage 1: {e:#}");
                    break;
                }
            }
        });
    }
    {
        let up = up.clone();
        let last = devices.last().cloned().unwrap_or_default();
        tokio::spawn(async move {
            loop {
                let msg = match up.recv().await {
                    Some(m) => m,
                    None => Err(anyhow!("the link from {last} closed")),
                };
                let end = msg.is_err();
                if from_ring_tx.send(msg).is_err() || end {
                    break;
                }
            }
        });
    }

    let prompts: Vec<String> = match &args.prompt {
        Some(p) => vec![p.clone()],
        None => Vec::new(),
    };
    let from_stdin = args.prompt.is_none();
    if from_stdin {
        eprintln!("head: type a prompt and press enter (end with ctrl-d)");
    }
    let mut stdin_lines = from_stdin.then(|| std::io::stdin().lock().lines());
    let mut turn = 0u64;
    let mut queue = prompts.into_iter();
    let mut session = Session {
        ring,
        opened,
        plan,
        head: head_stage,
        members,
        inbox,
        to_ring,
        from_ring,
        devices,
        excluded,
        chosen,
        down: down.clone(),
    };
    let mut failure = None;
    loop {
        let text = match stdin_lines.as_mut() {
            Some(lines) => match tokio::task::block_in_place(|| lines.next()) {
                Some(line) => line?,
                None => break,
            },
            None => match queue.next() {
                Some(p) => p,
                None => break,
            },
        };
        if text.trim().is_empty() {
            continue;
        }
        turn += 1;
        let prompt = super::run::prompt(&text, args.generate.chat);
        let outcome = session.turn(turn, prompt).await;
        if let Err(e) = outcome {
            failure = Some(e);
            break;
        }
    }
    for m in &session.members {
        m.control.close().await;
    }
    down.close().await;
    up.close().await;
    shared.peers.lock().expect("peers lock").clear();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl Session<'_> {
    /// One turn: the prompt around the ring, the answer streamed, the members' hops gathered, Verify.
    async fn turn(&mut self, turn: u64, prompt: Prompt) -> Result<()> {
        let Self {
            ring,
            opened,
            plan,
            head,
            members,
            inbox,
            to_ring,
            from_ring,
            devices,
            excluded,
            chosen,
            down,
        } = self;
        let (args, opts) = (ring.args, ring.opts);
        let (opened, plan, head) = (*opened, &*plan, &*head);
        let json = args.format.json();
        let prompt_ids = opened.encode(&prompt).context("the prompt")?;
        let cached = opts.path == daisy_model::ForwardPath::Cached;
        for m in members.iter() {
            control::send(&m.control, &Message::Turn(TurnStart { turn, cached })).await?;
        }
        eprintln!(
            "head: turn {turn}: {} prompt tokens, {} path",
            prompt_ids.len(),
            opts.path.name()
        );
        let mut hops = Vec::new();
        let mut lap_ms = Vec::new();
        let generated = tokio::task::block_in_place(|| {
            let mut stdout = std::io::stdout().lock();
            let mut lap = |pass: daisy_model::Pass| -> daisy_engine::Result<Vec<f32>> {
                let header = LapHeader {
                    turn,
                    lap: pass.lap,
                    pos0: pass.pos0,
                    rows: pass.rows,
                };
                let t = Instant::now();
                let mut sent = send(plan, head, header, 0, pass.hidden)?;
                hops.extend(sent.hop.take());
                to_ring.blocking_send(sent.bytes).map_err(|_| {
                    daisy_engine::Error::Invalid("the link to stage 1 closed".into())
                })?;
                let back = match from_ring.recv_timeout(LAP_TIMEOUT) {
                    Ok(Ok(bytes)) => bytes,
                    Ok(Err(e)) => return Err(daisy_engine::Error::Invalid(format!("{e:#}"))),
                    Err(_) => {
                        return Err(daisy_engine::Error::Invalid(format!(
                            "lap {} did not come back within {LAP_TIMEOUT:?}",
                            pass.lap
                        )));
                    }
                };
                let out = receive_at_head(plan, head, &back);
                lap_ms.push(t.elapsed().as_secs_f64() * 1e3);
                out
            };
            generate_turn(opened, head, &prompt_ids, opts, &mut lap, &mut |t| {
                if !json {
                    let _ = write!(stdout, "{}", t.text).and_then(|()| stdout.flush());
                }
                ControlFlow::Continue(())
            })
        })?;
        if !json {
            println!();
        }
        // Every member's hop of the first lap, in hop order after the head's.
        let mut member_hops: Vec<Option<daisy_engine::Hop>> = vec![None; members.len()];
        while member_hops.iter().any(Option::is_none) {
            let (stage, msg) = tokio::time::timeout(Duration::from_secs(10), inbox.recv())
                .await
                .map_err(|_| anyhow!("the members did not report their hops within 10 s"))?
                .context("member queue closed")?;
            match msg {
                Ok(Some(Message::Hop(h))) if h.turn == turn && h.hop == stage => {
                    member_hops[stage - 1] = Some(daisy_engine::Hop {
                        after_layer: h.after_layer,
                        sha256: h.sha256.0,
                    });
                }
                Ok(Some(Message::Error(e))) => {
                    bail!(
                        "{} (stage {stage}) failed: {}",
                        devices[stage],
                        e.message.as_str()
                    )
                }
                Ok(None) => bail!("{} (stage {stage}) left the ring", devices[stage]),
                Err(e) => bail!("{} (stage {stage}): {e:#}", devices[stage]),
                Ok(Some(_)) => {}
            }
        }
        hops.extend(member_hops.into_iter().flatten());
        let t = generated.timings;
        let stats = lap_stats(lap_ms);
        eprintln!(
            "head: {} tokens, prefill {:.1} tok/s, decode {:.1} tok/s; lap p50 {:.2} ms, p99 {:.2} ms",
            generated.generation.ids.len(),
            t.prefill_tokens_per_s,
            t.decode_tokens_per_s,
            stats.p50_ms,
            stats.p99_ms
        );
        if generated.json_complete == Some(false) {
            bail!(
                "json-output: the value is not complete after --max-new-tokens {}",
                opts.max_new_tokens
            );
        }
        let verified = if args.no_verify {
            eprintln!("head: verify skipped (--no-verify)");
            None
        } else {
            let backend = chosen.backend.clone();
            let report = tokio::task::block_in_place(|| {
                verify(
                    opened,
                    None,
                    head.precision(),
                    &backend,
                    &prompt_ids,
                    opts,
                    &generated.generation.ids,
                )
            })
            .context("verify: the head could not re-run the turn with every layer")?;
            eprintln!("head: {}", report.summary());
            Some(report)
        };
        let failed = verified.as_ref().is_some_and(|v| !v.matched);
        if json {
            let report = RingReport {
                turn: TurnReport {
                    prompt_ids,
                    ids: generated.generation.ids.clone(),
                    text: generated.text,
                    plan: plan_ranges(plan),
                    stages: plan.stages().iter().map(|s| s.len()).collect(),
                    fingerprint: hex::encode(head.fingerprint()),
                    backend: BackendReport {
                        name: head.backend().name().to_string(),
                        adapter: chosen.adapter.clone(),
                    },
                    precision: head.precision().name(),
                    path: opts.path.name(),
                    hops: HopReport::list(&hops),
                    laps: generated.generation.laps,
                    cancelled: generated.generation.cancelled,
                    verify: verified,
                    json_complete: generated.json_complete,
                    timings: generated.timings,
                    params: opened.config().num_params(),
                    peak_rss_bytes: peak_rss_bytes(),
                },
                devices: devices.to_vec(),
                excluded: excluded.to_vec(),
                lap_ms: stats,
                bytes_sent_by_head: down.bytes_sent(),
                bytes_served: ring.served.as_ref().map(super::mirror::Served::by_client),
            };
            println!("{}", serde_json::to_string(&report)?);
        }
        if failed {
            bail!("verify failed: the ring and the head's unsplit run gave different ids");
        }
        Ok(())
    }
}
