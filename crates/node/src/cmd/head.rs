//! `node head`: stage 0 of the ring. It serves signaling (a WebSocket at `/ring` on its HTTP
//! server) and, when the model is a local folder, that folder in the Hub's layout for the members
//! to fetch their own byte ranges from; it prints a join URL carrying a fresh ring secret, admits the
//! members that prove the secret, probes them, plans, assigns each its layers, connects the ring peer
//! to peer (stage i → i + 1, the last back to the head), and drives the turns: it embeds, runs its
//! own layers, sends the hidden state around, applies the lm_head, samples, and streams the answer.
//! Verify re-runs the turn with every layer on the head and compares the ids.

use std::collections::{BTreeSet, HashMap};
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
    Conversation, LapHeader, Opened, Resume, TurnOptions, TurnReport, generate_turn, load_stage,
    receive_at_head, returned, send, verify,
};
use daisy_loader::{Checkpoint, LocalDir};
use daisy_model::Stage;
use daisy_ring::{DeviceInfo, Exclusion, ModelFacts, plan_layers};
use daisy_wire::{
    Assignment, Commit, DeviceId, Fingerprint, GemmRate, Heartbeat, Hello, HopRecord, LinkIds,
    Message, Placement, Plan, ProbeRequest, RepoId, TurnStart,
};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::api::{self, Api};
use super::job::{Finish, Finished, Job, Picture, Sink, Streamed};
use super::options::{
    ComputeArgs, FormatArgs, GenerateArgs, KeepArgs, ResidencyArgs, Switch, failure, failure_of,
};
use super::page::PageToken;
use super::prefixes::{Prefixes, Seen};
use super::view::SharedView;
use crate::control;
use crate::rtc::{self, Link, LinkConfig};
use daisy_loader::hub::HubClient;
use daisy_signal::{HEAD, JoinUrl, Role, Secret, Signal, member_name, nonce};

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
    #[command(flatten)]
    pub(crate) residency: ResidencyArgs,
    #[command(flatten)]
    pub(crate) keep: KeepArgs,
    /// Prefill chunks around the ring at once on the cached path: the next chunk leaves the head
    /// while the previous one is still travelling (1: one at a time).
    #[arg(long, default_value_t = 2)]
    pub(crate) in_flight: usize,
    /// Skip Verify (the re-run of each turn with every layer on the head) for `--prompt` and stdin
    /// prompts; an API request asks for it with `verify: true`.
    #[arg(long)]
    pub(crate) no_verify: bool,
    #[command(flatten)]
    pub(crate) format: FormatArgs,
    /// Require `Authorization: Bearer KEY` on the OpenAI API (`/v1/*`); `DAISY_API_KEY` sets it
    /// without a command line. Without a key the API is open to whoever reaches `--listen`.
    #[arg(long, value_name = "KEY")]
    pub(crate) api_key: Option<String>,
    /// Turns that may wait for the ring at once; an API request beyond them gets 429.
    #[arg(long, default_value_t = 8)]
    pub(crate) max_queued: usize,
    /// `on`: a cached-path turn whose prompt starts with the previous turn's whole prompt and goes
    /// on with its answer (a chat's next turn) keeps every stage's keys for the positions it shares
    /// with what that turn computed, and prefills only the rest; Verify recomputes it from the
    /// conversation's start.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub(crate) kv_reuse: Switch,
}

/// A link the head expects a member to offer. A member offers it again only after giving up its
/// side of the last attempt (which may have opened on the head's side all the same), so the link
/// the ring gets is the latest attempt's, once open.
struct Incoming {
    /// The member that offers it.
    from: String,
    /// Offers received for the link so far.
    attempts: AtomicU64,
    /// The latest attempt's link, once it opened.
    opened: watch::Sender<Option<Arc<Link>>>,
}

/// Longest wait for a member's Hello or probe result.
const HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the members to load their layers.
const LOAD_TIMEOUT: Duration = Duration::from_secs(1800);

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
    let clean = control::clean_name(&name, 64, "model");
    Ok(RepoId::parse(&format!("local/{clean}"))?)
}

fn open_source(model: &str, hub: &Arc<HubClient>) -> Result<Source> {
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
    let checkpoint = Checkpoint::open_with(model, Some(hub.clone()))
        .with_context(|| format!("opening model {model}"))?;
    let opened = Opened::new(checkpoint).with_context(|| format!("model {model}"))?;
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
    answers: rtc::Answers,
    /// Links the head expects a member to offer, and where to hand them once open.
    incoming: Mutex<HashMap<u64, Arc<Incoming>>>,
    next_link: AtomicU64,
    /// Members admitted by signaling whose control link is not open yet.
    opening: AtomicU64,
    /// Admitted members with their control link, in the order they joined.
    joined: mpsc::Sender<(String, Link)>,
    /// What the page shows.
    view: SharedView,
    /// Recent refused joins (a wrong secret) per address, for the rate limit.
    refusals: Mutex<HashMap<IpAddr, Vec<Instant>>>,
}

/// Wrong-secret joins from one address within [`REFUSAL_WINDOW`] before it is refused outright.
const REFUSAL_LIMIT: usize = 10;
const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

impl Shared {
    /// Whether `ip` is over the limit of refused joins; logged once when it gets there.
    fn rate_limited(&self, ip: IpAddr) -> bool {
        let mut all = self.refusals.lock().expect("refusals lock");
        let recent = all.entry(ip).or_default();
        recent.retain(|t| t.elapsed() < REFUSAL_WINDOW);
        recent.len() >= REFUSAL_LIMIT
    }

    /// Count a refused join from `ip`.
    fn refused(&self, ip: IpAddr) {
        let mut all = self.refusals.lock().expect("refusals lock");
        let recent = all.entry(ip).or_default();
        recent.push(Instant::now());
        if recent.len() == REFUSAL_LIMIT {
            eprintln!(
                "head: {REFUSAL_LIMIT} joins with a wrong secret from {ip} within {}s; further \
                 joins from it are refused without a challenge until it slows down",
                REFUSAL_WINDOW.as_secs()
            );
        }
    }
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

    /// Offer link `link` to `device` (the head sending on it) and wait for it to open (see
    /// [`rtc::offer_until_open`]).
    async fn offer_to(&self, device: &str, role: Role, link: u64) -> Result<Link> {
        rtc::offer_until_open(&self.cfg, &self.answers, link, device, |sdp, attempt| {
            self.signal(
                device,
                Signal::Offer {
                    link,
                    attempt,
                    peer: HEAD.to_string(),
                    role,
                    sdp,
                },
            )
        })
        .await
    }

    /// Relay one signal from member `from`, or take it when it is addressed to the head.
    async fn route(self: &Arc<Self>, from: &str, signal: Signal) -> Result<()> {
        match signal {
            Signal::Offer {
                link,
                attempt: offered,
                peer,
                role: Role::Ring,
                sdp,
            } if peer == HEAD => {
                // Every attempt the member makes at this link answers into the same slot; a new
                // one replaces the last, which the member gave up.
                let Some(slot) = self
                    .incoming
                    .lock()
                    .expect("incoming lock")
                    .get(&link)
                    .cloned()
                else {
                    bail!("member {from} offered link {link}, which the head did not ask for");
                };
                if slot.from != from {
                    bail!(
                        "member {from} offered link {link}, which the head asked of {}",
                        slot.from
                    );
                }
                let attempt = slot.attempts.fetch_add(1, Ordering::AcqRel) + 1;
                if slot.opened.send_replace(None).is_some() {
                    eprintln!(
                        "head: member {from} offered link {link} again; the link its last offer \
                         opened is closed"
                    );
                }
                let (pending, answer) = rtc::answer(&self.cfg, &sdp).await?;
                self.signal(
                    from,
                    Signal::Answer {
                        link,
                        attempt: offered,
                        peer: HEAD.to_string(),
                        sdp: answer,
                    },
                )
                .await?;
                let from = from.to_string();
                tokio::spawn(async move {
                    match pending.connected().await {
                        Ok(l) => {
                            // An attempt the member has offered again since is dropped (closed).
                            if slot.attempts.load(Ordering::Acquire) == attempt {
                                slot.opened.send_replace(Some(Arc::new(l)));
                            }
                        }
                        // The member offers again (or gives up and reports it).
                        Err(e) => eprintln!("head: link {link} from {from}: {}", failure(&e)),
                    }
                });
                Ok(())
            }
            Signal::Answer {
                link,
                attempt,
                peer,
                sdp,
            } if peer == HEAD => match self.answers.deliver(link, attempt, sdp) {
                rtc::Delivered::Taken => Ok(()),
                rtc::Delivered::Late => {
                    eprintln!(
                        "head: member {from} answered attempt {attempt} at link {link}, which \
                         the head had given up: dropped"
                    );
                    Ok(())
                }
                rtc::Delivered::NotOffered => {
                    bail!(
                        "member {from} answered attempt {attempt} at link {link}, which the head \
                         did not offer"
                    )
                }
            },
            Signal::Offer {
                link,
                attempt,
                peer,
                role: Role::Ring,
                sdp,
            } => {
                self.signal(
                    &peer,
                    Signal::Offer {
                        link,
                        attempt,
                        peer: from.to_string(),
                        role: Role::Ring,
                        sdp,
                    },
                )
                .await
            }
            Signal::Answer {
                link,
                attempt,
                peer,
                sdp,
            } => {
                self.signal(
                    &peer,
                    Signal::Answer {
                        link,
                        attempt,
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
    ws.max_message_size(daisy_signal::MAX_SIGNAL_BYTES)
        .on_upgrade(move |socket| async move {
            if let Err(e) = member_session(socket, shared, addr).await {
                eprintln!("head: {addr}: {}", failure(&e));
            }
        })
}

/// Send one signal on a member's socket (recorded under the test hooks).
async fn send_signal(socket: &mut WebSocket, signal: &Signal) -> Result<(), axum::Error> {
    #[cfg(feature = "test-hooks")]
    crate::test_hooks::dump_sent(signal.to_json().as_bytes());
    socket.send(WsMessage::Text(signal.to_json().into())).await
}

async fn next_signal(socket: &mut WebSocket) -> Result<Option<Signal>> {
    loop {
        match socket.recv().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(anyhow!("signaling connection failed: {e}")),
            Some(Ok(WsMessage::Text(text))) => return Ok(Some(Signal::parse(&text)?)),
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
    if shared.rate_limited(addr.ip()) {
        let r = Signal::Refused {
            reason: "rate-limited: too many joins with a wrong secret from this address; wait a \
                     minute"
                .into(),
        };
        let _ = send_signal(&mut socket, &r).await;
        return Ok(());
    }
    let challenge = nonce();
    let hello = Signal::Challenge {
        nonce: hex::encode(challenge),
    };
    send_signal(&mut socket, &hello).await?;
    let first = tokio::time::timeout(Duration::from_secs(10), next_signal(&mut socket)).await;
    let refuse = |reason: &str| Signal::Refused {
        reason: reason.to_string(),
    };
    let device = match first {
        Ok(Ok(Some(Signal::Auth { device, proof }))) => {
            if !shared.secret.check(&challenge, &device, &proof) {
                shared.refused(addr.ip());
                let r = refuse("wrong ring secret");
                send_signal(&mut socket, &r).await?;
                bail!("refused: wrong ring secret");
            }
            if let Err(e) = member_name(&device) {
                let r = refuse(&e.to_string());
                send_signal(&mut socket, &r).await?;
                bail!("refused: bad device name");
            }
            device
        }
        Ok(Ok(Some(_))) | Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
            let r = refuse("expected an auth message first");
            let _ = send_signal(&mut socket, &r).await;
            bail!("refused: no valid auth message");
        }
    };
    let (tx, mut rx) = mpsc::channel::<Signal>(16);
    let own = tx.clone();
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
        send_signal(&mut socket, &r).await?;
        bail!("refused: device {device} already joined");
    }
    let welcome = Signal::Welcome {
        device: device.clone(),
    };
    socket
        .send(WsMessage::Text(welcome.to_json().into()))
        .await?;
    // Counted as opening before it is announced, so a turn that starts right after the
    // announcement waits for its control link rather than running without it.
    shared.opening.fetch_add(1, Ordering::SeqCst);
    eprintln!("{} {}", joined(&device), addr.ip());
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        while let Some(signal) = rx.recv().await {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::dump_sent(signal.to_json().as_bytes());
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
            let link = shared.link_id();
            match shared.offer_to(&device, Role::Control, link).await {
                Ok(link) => {
                    let _ = shared.joined.send((device, link)).await;
                }
                Err(e) => eprintln!("head: no control link to {device}: {}", failure(&e)),
            }
            shared.opening.fetch_sub(1, Ordering::SeqCst);
        });
    }
    let result = loop {
        let signal = match stream.next().await {
            None | Some(Ok(WsMessage::Close(_))) => break Ok(()),
            Some(Err(e)) => break Err(anyhow!("signaling connection failed: {e}")),
            Some(Ok(WsMessage::Text(text))) => match Signal::parse(&text) {
                Ok(s) => s,
                Err(e) => break Err(e.into()),
            },
            Some(Ok(_)) => continue,
        };
        let shared = shared.clone();
        let from = device.clone();
        tokio::spawn(async move {
            if let Err(e) = shared.route(&from, signal).await {
                eprintln!("head: signal from {from}: {}", failure(&e));
            }
        });
    };
    // Only this session's entry: a member of the same name may have joined again since.
    {
        let mut peers = shared.peers.lock().expect("peers lock");
        if peers.get(&device).is_some_and(|t| t.same_channel(&own)) {
            peers.remove(&device);
        }
    }
    writer.abort();
    result
}

pub(crate) fn run(mut args: Args) -> Result<()> {
    daisy_engine::name_notes("head");
    let opts = args.generate.turn_options();
    opts.check()?;
    daisy_engine::check_max_resident(args.residency.max_resident_layers)?;
    if args.max_queued == 0 {
        bail!("--max-queued 0: at least one turn must be able to wait");
    }
    // The key lives in this process's memory only, zeroed when dropped.
    let api_key = args
        .api_key
        .take()
        .or_else(|| std::env::var("DAISY_API_KEY").ok())
        .filter(|k| !k.is_empty())
        .map(zeroize::Zeroizing::new);
    let secret = match &args.secret_file {
        Some(path) => Secret::parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("--secret-file {}", path.display()))?,
        )
        .with_context(|| format!("--secret-file {}", path.display()))?,
        None => Secret::random(),
    };
    // The head's own Hub requests take `HF_TOKEN`, else a token given on its page. The page is not
    // served yet: a model that needs a token now is opened again once it is.
    let view = SharedView::default();
    let token = Arc::new(PageToken::new(view.clone()));
    let hub = Arc::new(HubClient::from_env()?.with_token_provider(token.clone()));
    let source = match open_source(&args.model, &hub) {
        Ok(source) => Some(opened(&args, source)?),
        Err(e) if needs_token(&e) => None,
        Err(e) => return Err(e),
    };
    let chosen = super::backend(args.compute.backend)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let api_key = api_key.as_ref().map(Api::key_hash);
    let head = Head {
        args,
        opts,
        secret,
        api_key,
        view,
        token,
        hub,
        chosen,
    };
    let result = runtime.block_on(serve(head, source));
    crate::memory::print_peak("head");
    result
}

/// Whether opening failed for want of a Hugging Face token.
fn needs_token(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<daisy_loader::Error>(),
            Some(daisy_loader::Error::TokenNeeded { .. })
        )
    })
}

/// A model opened for the ring: `--stages` checked against it, and its own prompt encoder (built
/// outside the runtime, as a repo's tokenizer files may be fetched here).
fn opened(args: &Args, source: Source) -> Result<(Source, Arc<daisy_engine::Encoder>)> {
    let n_layers = source.opened.config().num_layers;
    if let Some(counts) = &args.stages {
        Plan::from_counts(counts, n_layers).with_context(|| format!("--stages {counts:?}"))?;
        if counts.len() < 2 {
            bail!("--stages {counts:?}: a ring needs the head and at least one member");
        }
    }
    let encoder = Arc::new(source.opened.encoder()?);
    Ok((source, encoder))
}

/// What `node head` starts its server with.
struct Head {
    args: Args,
    opts: TurnOptions,
    secret: Secret,
    api_key: Option<[u8; 32]>,
    view: SharedView,
    token: Arc<PageToken>,
    hub: Arc<HubClient>,
    chosen: daisy_engine::ChosenBackend,
}

async fn serve(head: Head, source: Option<(Source, Arc<daisy_engine::Encoder>)>) -> Result<()> {
    let Head {
        args,
        opts,
        secret,
        api_key,
        view,
        token,
        hub,
        chosen,
    } = head;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not listen on {}", args.listen))?;
    let shown = crate::net::reachable(listener.local_addr()?);
    let bind: IpAddr = shown.ip();
    token.set_page(&format!("http://{shown}/"));
    let (joined_tx, mut joined_rx) = mpsc::channel(16);
    let shared = Arc::new(Shared {
        secret: secret.clone(),
        cfg: LinkConfig {
            bind,
            stun: args.stun.clone(),
            recv_buffer: rtc::RECV_SOCKET_BUFFER,
        },
        peers: Mutex::new(HashMap::new()),
        answers: rtc::Answers::default(),
        incoming: Mutex::new(HashMap::new()),
        next_link: AtomicU64::new(0),
        opening: AtomicU64::new(0),
        joined: joined_tx,
        view: view.clone(),
        refusals: Mutex::new(HashMap::new()),
    });
    view.update(|v| {
        v.model = args.model.clone();
        v.state = "opening the model".into();
    });
    let (jobs_tx, mut jobs) = mpsc::channel(args.max_queued);
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let api = Arc::new(Api {
        model_id: args.model.clone(),
        model: std::sync::OnceLock::new(),
        path: opts.path,
        lookahead: opts.lookahead,
        jobs: jobs_tx.clone(),
        ready: ready.clone(),
        key_sha256: api_key,
    });
    let mut app = Router::new()
        .route("/ring", get(ring_socket))
        .with_state(shared.clone())
        .merge(super::page::router(
            view.clone(),
            jobs_tx.clone(),
            token.clone(),
            hub.clone(),
        ))
        .merge(api::router(api.clone()));
    let mut served = None;
    if let Some((source, _)) = &source
        && let Some(folder) = &source.folder
    {
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
    eprintln!("head: the page is at http://{shown}/");
    eprintln!(
        "head: the OpenAI API is at http://{shown}/v1{}",
        if api_key.is_some() {
            " (a key is required)"
        } else {
            ""
        }
    );
    let result = async {
        let (source, encoder) = match source {
            Some(opened) => opened,
            None => {
                // Asked for on the page now; the members may join meanwhile.
                token.enable();
                let model = args.model.clone();
                let hub = hub.clone();
                let source =
                    tokio::task::spawn_blocking(move || open_source(&model, &hub)).await??;
                let args = &args;
                tokio::task::block_in_place(|| opened(args, source))?
            }
        };
        api.model
            .set(api::ApiModel {
                encoder: encoder.clone(),
                context: source.opened.config().max_position_embeddings,
                vocab_size: source.opened.config().vocab_size,
                fingerprint: format!(
                    "daisy-{}",
                    hex::encode(&source.opened.checkpoint.fingerprint()[..8])
                ),
            })
            .map_err(|_| anyhow!("the model was opened twice"))?;
        view.state("waiting for members");
        eprintln!(
            "head: serving {} ({}@{}) on http://{shown}; run `node join URL` on each device with \
             the join URL above",
            args.model,
            source.repo,
            &source.commit.as_str()[..12]
        );
        let settings = Settings {
            args: &args,
            opts: &opts,
            served,
        };
        let queue = Queue {
            jobs: &mut jobs,
            tx: jobs_tx,
            ready: &ready,
            encoder,
        };
        drive(&settings, &shared, &mut joined_rx, queue, source, chosen).await
    }
    .await;
    if let Err(e) = &result {
        view.update(|v| {
            v.state = "stopped".into();
            v.error = Some(failure(e));
        });
    }
    server.abort();
    result
}

/// What every turn of one head process shares.
struct Settings<'a> {
    args: &'a Args,
    opts: &'a TurnOptions,
    /// Bytes the head's folder served, per member (when it serves its folder).
    served: Option<super::mirror::Served>,
}

/// A member admitted to the ring.
struct Member {
    device: String,
    hello: Hello,
    control: Arc<Link>,
}

/// What the members' control links report, tagged with the device.
enum Event {
    Progress(String, daisy_wire::Progress),
    Ready(String, Fingerprint),
    Hop(String, HopRecord),
    Heartbeat(String, u64),
    Times(String, daisy_wire::StageTimes),
    Down(String, String),
}

/// What comes back to the engine's thread: a lap's bytes, or the news that a member is gone.
enum Back {
    Lap(Vec<u8>),
    Down(String, String),
}

/// How often the engine, reading the up-link while it waits for a lap, looks at the channel for
/// news from elsewhere (a member's loss, a failed send), which does not wake its read.
const PUMP_SLICE: Duration = Duration::from_millis(20);

/// The next thing back within `wait`: the engine's thread reads the link laps come back on itself
/// while it waits (`reads`: the datagram wakes it, not the link's thread and then it), else waits
/// on the channel.
fn next_back(
    back: &std::sync::mpsc::Receiver<Back>,
    reads: Option<&mut rtc::Reads<'_>>,
    wait: Duration,
) -> Result<Back, std::sync::mpsc::RecvTimeoutError> {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    let Some(reads) = reads else {
        return back.recv_timeout(wait);
    };
    let deadline = Instant::now() + wait;
    loop {
        match back.try_recv() {
            Ok(b) => return Ok(b),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RecvTimeoutError::Timeout);
        }
        if !reads.pump(left.min(PUMP_SLICE)) {
            // The link has ended: what follows comes through the channel.
            return back.recv_timeout(left);
        }
    }
}

/// A completed attempt at a turn: the generation, every hop of its first lap, for each lap whether
/// it is a decode lap, its milliseconds around the ring and the head's milliseconds before it, its
/// turn number, and what it continued.
type Attempt = (
    daisy_engine::Generated,
    Vec<daisy_engine::Hop>,
    Vec<(bool, f64, f64)>,
    u64,
    Continued,
);

/// The prompt positions a turn kept from the conversation's keys, and the passes that rebuild
/// them (for Verify).
#[derive(Default)]
struct Continued {
    kept: usize,
    history: Vec<(usize, Vec<u32>)>,
}

/// Why the ring could not go on.
enum Failure {
    /// A member failed or left; the turn can be replayed without it.
    Member { device: String, why: String },
    /// Anything else ends the run.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

impl From<daisy_wire::Error> for Failure {
    fn from(e: daisy_wire::Error) -> Self {
        Self::Other(e.into())
    }
}

impl Failure {
    fn member(device: &str, why: impl Into<String>) -> Self {
        Self::Member {
            device: device.to_string(),
            why: why.into(),
        }
    }

    fn into_error(self) -> anyhow::Error {
        match self {
            Self::Member { device, why } => anyhow!("member {device}: {why}"),
            Self::Other(e) => e,
        }
    }
}

/// Forward one member's control messages as events until its link ends; its end is an event too,
/// and the news also goes to the engine's thread, which may be waiting for a lap.
fn watch(
    member: &Member,
    events: mpsc::UnboundedSender<Event>,
    back: std::sync::mpsc::Sender<Back>,
) {
    let link = member.control.clone();
    let device = member.device.clone();
    tokio::spawn(async move {
        let why = loop {
            let event = match control::recv(&link).await {
                Ok(Some(Message::Progress(p))) => Event::Progress(device.clone(), p),
                Ok(Some(Message::Ready(r))) => Event::Ready(device.clone(), r.fingerprint),
                Ok(Some(Message::Hop(h))) => Event::Hop(device.clone(), h),
                Ok(Some(Message::Heartbeat(h))) => Event::Heartbeat(device.clone(), h.seq),
                Ok(Some(Message::StageTimes(t))) => Event::Times(device.clone(), t),
                Ok(Some(Message::Error(e))) => break format!("reported: {}", e.message.as_str()),
                Ok(Some(other)) => {
                    eprintln!("head: {device} sent an unexpected {}", other.kind());
                    continue;
                }
                Ok(None) => {
                    break "its control link closed (the process stopped, or its network did)"
                        .to_string();
                }
                Err(e) => break failure(&e),
            };
            if events.send(event).is_err() {
                return;
            }
        };
        let _ = back.send(Back::Down(device.clone(), why.clone()));
        let _ = events.send(Event::Down(device, why));
    });
}

/// The ring: who holds what, and the links the head drives it through.
struct Ring<'a> {
    settings: &'a Settings<'a>,
    shared: Arc<Shared>,
    source: &'a Source,
    chosen: daisy_engine::ChosenBackend,
    fingerprint: Fingerprint,
    plan: Plan,
    head: Option<Stage>,
    /// The head's peak resident memory when it had loaded its layers last.
    load_peak: Option<u64>,
    /// Stage i + 1 of the plan.
    members: Vec<Member>,
    /// Members left out or dropped, and why.
    excluded: Vec<String>,
    events: mpsc::UnboundedReceiver<Event>,
    events_tx: mpsc::UnboundedSender<Event>,
    back: std::sync::mpsc::Receiver<Back>,
    back_tx: std::sync::mpsc::Sender<Back>,
    /// Where the head's laps go (its link to stage 1).
    to_ring: Option<rtc::Outbox>,
    /// The head's current ring links (to stage 1, from the last stage).
    links: Vec<Arc<Link>>,
    /// The slowest lap so far, for the stall timeout.
    slowest_lap: Duration,
    next_turn: u64,
    /// The laps of turns the head gave up that it sent and has not had back: one of them may
    /// still come back, and is skipped; any other lap of an earlier turn is a replayed frame.
    abandoned: HashMap<u64, BTreeSet<usize>>,
    /// The head's probe of the Hello seed, for devices that join later.
    head_probe: (daisy_wire::Hash, f64),
    /// Bytes the head has sent on ring links that are closed now.
    bytes_sent_before: u64,
    /// The keys every stage holds after the last cached turn, for the next turn to continue
    /// (`--kv-reuse on`); none after a failed turn or a new ring.
    conversation: Option<Conversation>,
    /// The record of conversation prefixes (none without a data folder, or when the file there
    /// is not one).
    prefixes: Option<Prefixes>,
}

/// How many turns back the head still expects a given-up turn's laps (see `Ring::abandoned`).
const ABANDONED_TURNS_KEPT: u64 = 16;
/// Longest wait for the first lap of a ring (a prefill chunk on the slowest member).
const FIRST_LAP_TIMEOUT: Duration = Duration::from_secs(120);
/// Heartbeat round trips per member that time a hop (`--format json`).
const HOP_PINGS: usize = 100;
/// The same after a client's turn (its reply's `timings.hop_ms`).
const CLIENT_HOP_PINGS: usize = 10;
/// A lap is stalled after this many times the slowest lap so far (and at least `MIN_STALL`).
const STALL_FACTOR: u32 = 50;
const MIN_STALL: Duration = Duration::from_secs(10);

impl Ring<'_> {
    fn devices(&self) -> Vec<String> {
        let mut d = vec![HEAD.to_string()];
        d.extend(self.members.iter().map(|m| m.device.clone()));
        d
    }

    /// How long a lap may take when the slowest decode lap so far took `slowest` (none yet: the
    /// first lap's allowance).
    fn stall_timeout(slowest: Duration) -> Duration {
        if slowest.is_zero() {
            FIRST_LAP_TIMEOUT
        } else {
            (slowest * STALL_FACTOR).max(MIN_STALL)
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent_before + self.links.iter().map(|l| l.bytes_sent()).sum::<u64>()
    }

    /// Send the plan and assignments, load the head's layers, connect the ring, wait until every
    /// member is ready.
    async fn establish(&mut self) -> Result<(), Failure> {
        // New members hold no keys; links an earlier plan still waited for are not this one's.
        self.conversation = None;
        self.shared.incoming.lock().expect("incoming lock").clear();
        for link in self.links.drain(..) {
            self.bytes_sent_before += link.bytes_sent();
            link.close().await;
        }
        self.to_ring = None;
        let devices = self.devices();
        let placement = Placement::new(
            self.plan.clone(),
            devices
                .iter()
                .map(|d| DeviceId::parse(d))
                .collect::<Result<_, _>>()?,
        )?;
        for (i, span) in self.plan.stages().iter().enumerate() {
            eprintln!(
                "head: stage {i} = {} holds layers {}..{}",
                devices[i], span.layers.start, span.layers.end
            );
            self.shared.view.device(&devices[i], |d| {
                d.layers = Some([span.layers.start, span.layers.end]);
                d.stage = Some(i);
                d.status = "in the ring".into();
                d.ready = i == 0 && d.ready;
            });
        }
        self.shared.view.update(|v| {
            v.ring = devices.clone();
            v.state = "loading".into();
        });
        let weights = crate::cmd::options::weights_of(self.settings.args.compute.precision);
        // ids[i] is the link from stage i to stage i + 1, the last one back to the head.
        let n = self.members.len();
        let ids: Vec<u64> = (0..=n).map(|_| self.shared.link_id()).collect();
        for (i, m) in self.members.iter().enumerate() {
            let stage = i + 1;
            let assignment = Assignment::new(
                self.source.repo.clone(),
                self.source.commit.clone(),
                self.fingerprint,
                stage,
                self.plan.stages()[stage].layers.clone(),
            )?
            .with_weights(weights);
            let links = LinkIds {
                up: ids[i],
                down: ids[i + 1],
            };
            let sent = async {
                control::send(&m.control, &Message::Plan(placement.clone())).await?;
                control::send(&m.control, &Message::Assignment(assignment)).await?;
                control::send(&m.control, &Message::Links(links)).await
            };
            if let Err(e) = sent.await {
                return Err(Failure::member(&m.device, failure(&e)));
            }
        }

        // The links: stage i offers to stage i + 1, the last to the head.
        let (down, up) = if self.members.is_empty() {
            (None, None)
        } else {
            let shared = self.shared.clone();
            let first = self.members[0].device.clone();
            let to_first = ids[0];
            let down =
                tokio::spawn(async move { shared.offer_to(&first, Role::Ring, to_first).await });
            let link = ids[n];
            let last = &self.members[self.members.len() - 1].device;
            let slot = Arc::new(Incoming {
                from: last.clone(),
                attempts: AtomicU64::new(0),
                opened: watch::Sender::new(None),
            });
            self.shared
                .incoming
                .lock()
                .expect("incoming lock")
                .insert(link, slot.clone());
            let connect = Signal::Connect {
                link,
                peer: HEAD.to_string(),
            };
            if let Err(e) = self.shared.signal(last, connect).await {
                return Err(Failure::member(last, failure(&e)));
            }
            for i in 0..n - 1 {
                let link = ids[i + 1];
                let connect = Signal::Connect {
                    link,
                    peer: self.members[i + 1].device.clone(),
                };
                if let Err(e) = self.shared.signal(&self.members[i].device, connect).await {
                    return Err(Failure::member(&self.members[i].device, failure(&e)));
                }
            }
            (Some(down), Some((link, slot)))
        };

        // The head's own layers load while the members fetch theirs.
        let want = self.plan.stages()[0].layers.clone();
        if self.head.as_ref().map(Stage::layers) != Some(want.clone()) {
            let t0 = Instant::now();
            let opened = &self.source.opened;
            let (plan, precision, backend, max, keep) = (
                &self.plan,
                self.settings.args.compute.precision,
                &self.chosen.backend,
                self.settings.args.residency.max_resident_layers,
                self.settings.args.keep.on(),
            );
            let stage = tokio::task::block_in_place(|| {
                let stage = crate::memory::loading(|| {
                    load_stage(opened, plan, 0, precision, backend, max, keep)
                })?;
                daisy_engine::warm_up(backend, "its layers")?;
                if stage.is_streamed() {
                    crate::memory::streaming();
                }
                Ok::<_, anyhow::Error>(stage)
            })?;
            self.load_peak = daisy_engine::peak_rss_bytes();
            eprintln!(
                "head: loaded its layers {want:?} in {:.2}s{}",
                t0.elapsed().as_secs_f64(),
                crate::memory::peak_so_far()
            );
            self.head = Some(stage);
        }
        self.shared.view.device(HEAD, |d| d.ready = true);

        // Every member reports its download and says Ready with the fingerprint it computed.
        let mut ready: HashMap<String, bool> = self
            .members
            .iter()
            .map(|m| (m.device.clone(), false))
            .collect();
        let deadline = tokio::time::Instant::now() + LOAD_TIMEOUT;
        let mut shown: HashMap<String, u64> = HashMap::new();
        while ready.values().any(|r| !r) {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| anyhow!("the members did not load within {LOAD_TIMEOUT:?}"))?
                .context("the members' events stopped")?;
            match event {
                Event::Progress(device, p) => {
                    self.shared.view.device(&device, |d| {
                        let t0 = *d.fetch_started.get_or_insert_with(Instant::now);
                        d.fetched = p.fetched();
                        d.total = p.total();
                        d.rate = p.fetched() as f64 / t0.elapsed().as_secs_f64().max(1e-3);
                    });
                    let pct = 100 * p.fetched() / p.total().max(1);
                    let last = shown.entry(device.clone()).or_insert(u64::MAX);
                    if *last != pct && pct % 25 == 0 {
                        *last = pct;
                        eprintln!(
                            "head: {device} fetched {} of {} bytes ({pct}%)",
                            p.fetched(),
                            p.total()
                        );
                    }
                }
                Event::Ready(device, fingerprint) => {
                    if fingerprint != self.fingerprint {
                        return Err(Failure::member(
                            &device,
                            format!(
                                "refused: it holds another model's slice (fingerprint {} where \
                                 the head's is {})",
                                hex::encode(&fingerprint.0[..8]),
                                hex::encode(&self.fingerprint.0[..8])
                            ),
                        ));
                    }
                    eprintln!("head: {device} is ready");
                    self.shared.view.device(&device, |d| {
                        d.ready = true;
                        d.fetched = d.fetched.max(d.total);
                    });
                    ready.insert(device, true);
                }
                Event::Down(device, why) if ready.contains_key(&device) => {
                    return Err(Failure::member(&device, why));
                }
                Event::Down(..) | Event::Hop(..) | Event::Heartbeat(..) | Event::Times(..) => {}
            }
        }
        // Stale news of members no longer in the ring is not for the laps to come.
        while self.back.try_recv().is_ok() {}

        if let (Some(down), Some((up_id, slot))) = (down, up) {
            let first = self.members[0].device.clone();
            let last = self.members[self.members.len() - 1].device.clone();
            let down = Arc::new(down.await.map_err(|e| anyhow!("{e}"))?.map_err(|e| {
                Failure::member(&first, format!("the link to it: {}", failure(&e)))
            })?);
            // Ready, the last member has its side of its latest attempt open; the head's side
            // opens with it.
            let mut opened = slot.opened.subscribe();
            let up =
                tokio::time::timeout(Duration::from_secs(30), opened.wait_for(Option::is_some))
                    .await
                    .map_err(|_| Failure::member(&last, "it did not connect back within 30 s"))?
                    .map_err(|_| Failure::member(&last, "its link to the head was dropped"))?
                    .clone()
                    .expect("waited for an open link");
            // Offers of this link from now on are refused: the ring has it.
            self.shared
                .incoming
                .lock()
                .expect("incoming lock")
                .remove(&up_id);
            slot.opened.send_replace(None);
            let to_ring = {
                let back = self.back_tx.clone();
                rtc::Outbox::new(down.clone(), move |e| {
                    let _ = back.send(Back::Down(
                        first,
                        format!("the link to it: {}", failure(&e)),
                    ));
                })
            };
            {
                // Laps go from the link's thread straight to the engine's: one wake-up.
                let back = self.back_tx.clone();
                up.forward(move |msg| {
                    let _ = back.send(match msg {
                        Ok(bytes) => Back::Lap(bytes),
                        Err(e) => Back::Down(last.clone(), format!("its link to the head: {e}")),
                    });
                });
            }
            self.to_ring = Some(to_ring);
            // `up_link` names the second.
            self.links = vec![down, up];
        }
        eprintln!(
            "head: the ring is connected: {} -> head",
            self.devices().join(" -> ")
        );
        self.shared.view.state("ready");
        Ok(())
    }

    /// Leave `device` out: its layers go to the stage before it (the head when it was stage 1).
    async fn drop_member(&mut self, device: &str, why: &str) -> Result<()> {
        let Some(i) = self.members.iter().position(|m| m.device == device) else {
            bail!("{device} is not in the ring");
        };
        let member = self.members.remove(i);
        member.control.close().await;
        self.shared.peers.lock().expect("peers lock").remove(device);
        self.excluded.push(format!("{device}: dropped, {why}"));
        self.shared.view.device(device, |d| {
            d.status = format!("dropped: {why}");
            d.layers = None;
            d.stage = None;
            d.ready = false;
        });
        let excluded = self.excluded.clone();
        self.shared.view.update(|v| v.excluded = excluded);
        let mut counts: Vec<usize> = self.plan.stages().iter().map(|s| s.len()).collect();
        let gone = counts.remove(i + 1);
        counts[i] += gone;
        self.plan = Plan::from_counts(&counts, self.plan.n_layers())?;
        Ok(())
    }

    /// Take a device that joined after the ring formed as the last stage: the plan of `--stages`
    /// when the count matches it again, else the last stage's layers split with it. `false` when it
    /// is not taken (the last stage holds a single layer).
    async fn add_member(&mut self, member: Member) -> Result<bool> {
        let mut counts: Vec<usize> = self.plan.stages().iter().map(|s| s.len()).collect();
        let counts = match &self.settings.args.stages {
            Some(given) if given.len() == counts.len() + 1 => given.clone(),
            _ => {
                let last = counts.last_mut().expect("the head's stage");
                if *last < 2 {
                    let why = format!("{}: not taken, no stage has layers to share", member.device);
                    eprintln!("head: {why}");
                    self.excluded.push(why);
                    member.control.close().await;
                    return Ok(false);
                }
                let half = *last / 2;
                *last -= half;
                counts.push(half);
                counts
            }
        };
        self.plan = Plan::from_counts(&counts, self.plan.n_layers())?;
        eprintln!("head: {} takes part from the next turn", member.device);
        self.shared.view.device(&member.device, |d| {
            d.status = "joins at the next turn".into()
        });
        watch(&member, self.events_tx.clone(), self.back_tx.clone());
        self.members.push(member);
        Ok(true)
    }

    /// Where each decode lap of turn `turn` went: the head's compute, each member's (asked for
    /// now: every member timed its steps), and the rest of the lap, the wire. A member that does not
    /// answer within 5 s leaves its column empty.
    async fn picture(&mut self, turn: u64, laps: &[(bool, f64, f64)]) -> Picture {
        for m in &self.members {
            let _ = control::send(
                &m.control,
                &Message::TimesRequest(daisy_wire::TimesRequest { turn }),
            )
            .await;
        }
        let mut steps: Vec<Option<Vec<u32>>> = vec![None; self.members.len()];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while steps.iter().any(Option::is_none) {
            let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.events.recv()).await
            else {
                break;
            };
            if let Event::Times(device, t) = event
                && t.turn() == turn
                && let Some(i) = self.members.iter().position(|m| m.device == device)
            {
                steps[i] = Some(t.compute_us().to_vec());
            }
        }
        let mut picture = Picture {
            stages: self.devices(),
            compute_ms: Vec::new(),
            wire_ms: Vec::new(),
        };
        // Every lap visits each member once, in order: a member's k-th step is lap k.
        for (k, &(decode, lap, head)) in laps.iter().enumerate() {
            if !decode {
                continue;
            }
            let members: Vec<Option<f64>> = steps
                .iter()
                .map(|s| {
                    s.as_ref()
                        .and_then(|s| s.get(k))
                        .map(|&us| f64::from(us) / 1e3)
                })
                .collect();
            let ring: f64 = members.iter().flatten().sum();
            picture.wire_ms.push((lap - ring).max(0.0));
            let mut row = vec![Some(head)];
            row.extend(members);
            picture.compute_ms.push(row);
        }
        picture
    }

    /// When a lap stalls with every link up, the member whose heartbeat gets no answer is the one.
    async fn find_stalled(&mut self) -> Option<String> {
        let seq = self.next_turn;
        for m in &self.members {
            let _ = control::send(&m.control, &Message::Heartbeat(Heartbeat { seq })).await;
        }
        let mut answered: Vec<String> = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while answered.len() < self.members.len() {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(Event::Heartbeat(d, s))) if s == seq => answered.push(d),
                Ok(Some(Event::Down(d, _))) => return Some(d),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.members
            .iter()
            .find(|m| !answered.contains(&m.device))
            .map(|m| m.device.clone())
    }

    /// The link laps come back on, from the last stage (the second of `links`).
    fn up_link(&self) -> Option<&Arc<Link>> {
        self.links.get(1)
    }

    /// The one-way latency of a hop on these links: half the heartbeat round trip, `n` per member.
    async fn measure_hops(&mut self, n: usize) -> Result<LapStats> {
        let mut ms = Vec::new();
        for i in 0..self.members.len() {
            for k in 0..n {
                let seq = (1 << 63) | (k as u64);
                let t = Instant::now();
                control::send(
                    &self.members[i].control,
                    &Message::Heartbeat(Heartbeat { seq }),
                )
                .await?;
                loop {
                    let event = tokio::time::timeout(Duration::from_secs(5), self.events.recv())
                        .await
                        .map_err(|_| anyhow!("a heartbeat got no answer within 5 s"))?
                        .context("the members' events stopped")?;
                    match event {
                        Event::Heartbeat(d, s) if s == seq && d == self.members[i].device => break,
                        Event::Down(d, why) => bail!("{d} left while its hops were timed: {why}"),
                        _ => {}
                    }
                }
                ms.push(t.elapsed().as_secs_f64() * 1e3 / 2.0);
            }
        }
        Ok(lap_stats(ms))
    }

    /// One attempt at a turn. `shown` keeps what earlier attempts (that failed) already showed,
    /// which a replay does not show again.
    async fn attempt(&mut self, job: &Job, shown: &mut Shown) -> Result<Attempt, Failure> {
        let opts = &job.opts;
        let prompt_ids = &job.prompt_ids[..];
        let quiet = matches!(job.sink, Sink::Stdout) && self.settings.args.format.json();
        let turn = self.next_turn;
        self.next_turn += 1;
        let cached = opts.path == daisy_model::ForwardPath::Cached;
        // Laps from this one on are decode laps (one next token, and its drafts with lookahead).
        let prefill_laps = if cached {
            daisy_model::prefill_chunks(prompt_ids.len()).len()
        } else {
            1
        };
        let reuse = cached && self.settings.args.kv_reuse == Switch::On;
        if !reuse {
            self.conversation = None;
        }
        let kept = self.conversation.as_ref().map_or(0, |c| c.kept(prompt_ids));
        let continues = (kept > 0).then(|| self.conversation.as_ref().map(Conversation::turn));
        let start = TurnStart {
            turn,
            cached,
            continues: continues.flatten(),
        };
        if let Some(prev) = start.continues {
            eprintln!(
                "head: turn {turn} continues the keys of turn {prev}: {kept} prompt positions kept"
            );
        }
        for m in &self.members {
            if let Err(e) = control::send(&m.control, &Message::Turn(start)).await {
                return Err(Failure::member(&m.device, failure(&e)));
            }
        }
        let mut hops = Vec::new();
        let mut lap_ms = Vec::new();
        let culprit: std::cell::RefCell<Option<(String, String)>> = std::cell::RefCell::new(None);
        let mut stalled = false;
        let mut slowest = self.slowest_lap;
        let plan = &self.plan;
        let head = self.head.as_ref().expect("established");
        let (to_ring, back) = (&self.to_ring, &self.back);
        // The link laps come back on, read by the engine's thread while it waits for one.
        let up = self.up_link().cloned().filter(|_| to_ring.is_some());
        let opened = &self.source.opened;
        let first = self.members.first().map(|m| m.device.clone());
        let last = self.members.last().map(|m| m.device.clone());
        let in_ring: Vec<String> = self.members.iter().map(|m| m.device.clone()).collect();
        let in_flight = self.settings.args.in_flight.max(1);
        if reuse && self.conversation.is_none() {
            self.conversation = Some(Conversation::new(head));
        }
        // Until the turn succeeds, what the stages hold is no conversation's.
        let mut conversation = self.conversation.take();
        let continued = Continued {
            kept,
            history: conversation
                .as_ref()
                .map_or_else(Vec::new, |c| c.history(kept)),
        };
        let mut abandoned = std::mem::take(&mut self.abandoned);
        // The laps sent and not back yet, the oldest first.
        let mut outstanding: std::collections::VecDeque<(LapHeader, Instant, f64)> =
            std::collections::VecDeque::new();
        let generated = tokio::task::block_in_place(|| {
            let mut stdout = std::io::stdout().lock();
            // A lap's return, checked; an earlier attempt's laps still on their way are skipped.
            // When the last lap came back: the head computes from then until it sends the next.
            let last_back = std::cell::Cell::new(Instant::now());
            let mut reads = up.as_ref().map(|l| l.take_reads());
            let mut wait_back = |header: LapHeader,
                                 t: Instant,
                                 head_ms: f64|
             -> daisy_engine::Result<Vec<f32>> {
                // From the slowest decode lap so far, this turn's included.
                let wait = if header.lap == 0 {
                    FIRST_LAP_TIMEOUT.max(Self::stall_timeout(slowest))
                } else {
                    Self::stall_timeout(slowest)
                };
                loop {
                    match next_back(back, reads.as_mut(), wait) {
                        Ok(Back::Lap(bytes)) => {
                            // The last stage sent what comes back: a frame the head refuses is
                            // that member's doing, and the turn replays without it.
                            let refuse = |e: daisy_engine::Error| {
                                if let Some(device) = &last {
                                    *culprit.borrow_mut() = Some((
                                        device.clone(),
                                        format!(
                                            "the head refused its activation: {}",
                                            failure_of(&e)
                                        ),
                                    ));
                                }
                                e
                            };
                            let (got, data) = returned(plan, head, &bytes).map_err(refuse)?;
                            if got.turn != turn {
                                let in_flight = abandoned.get_mut(&got.turn);
                                if in_flight.is_some_and(|laps| laps.remove(&got.lap)) {
                                    continue;
                                }
                                return Err(refuse(daisy_engine::Error::Invalid(format!(
                                    "lap {} of turn {} is no lap in flight (turn {turn} runs): a \
                                     replayed or forged activation",
                                    got.lap, got.turn
                                ))));
                            }
                            if got != header {
                                return Err(refuse(daisy_engine::Error::Invalid(format!(
                                    "the head expected {header:?} back and got {got:?}"
                                ))));
                            }
                            let took = t.elapsed();
                            if header.lap > 0 {
                                slowest = slowest.max(took);
                            }
                            lap_ms.push((
                                header.lap >= prefill_laps,
                                took.as_secs_f64() * 1e3,
                                head_ms,
                            ));
                            last_back.set(Instant::now());
                            return Ok(data);
                        }
                        // News of a device no longer in the ring is old news.
                        Ok(Back::Down(device, _)) if !in_ring.contains(&device) => {}
                        Ok(Back::Down(device, why)) => {
                            *culprit.borrow_mut() = Some((device, why));
                            return Err(daisy_engine::Error::Invalid("the ring is broken".into()));
                        }
                        Err(_) => {
                            stalled = true;
                            return Err(daisy_engine::Error::Invalid(format!(
                                "lap {} did not come back within {wait:?}",
                                header.lap
                            )));
                        }
                    }
                }
            };
            let mut lap = |pass: daisy_model::Pass| -> daisy_engine::Result<Vec<f32>> {
                let header = LapHeader {
                    turn,
                    lap: pass.lap,
                    pos0: pass.pos0,
                    rows: pass.rows,
                };
                let head_ms = last_back.get().elapsed().as_secs_f64() * 1e3;
                let mut sent = send(plan, head, header, 0, pass.hidden)?;
                hops.extend(sent.hop.take());
                let Some(to_ring) = to_ring else {
                    // The head alone: the lap is its own.
                    return receive_at_head(plan, head, header, &sent.bytes);
                };
                // At most `in_flight` laps around the ring at once: the oldest comes back first.
                while outstanding.len() >= in_flight {
                    let (h, t, ms) = *outstanding.front().expect("not empty");
                    wait_back(h, t, ms)?;
                    outstanding.pop_front();
                }
                // The lap is the ring's until it comes back: no GEMM here meanwhile.
                daisy_gemm_int8::rest();
                // The lap's clock starts before the send: the first member, woken by it, may
                // take this thread's core before `sendto` returns, and its step is the lap's.
                let left = Instant::now();
                if let Err(e) = to_ring.send_blocking(sent.bytes) {
                    let device = first.clone().unwrap_or_default();
                    *culprit.borrow_mut() = Some((device, failure(&e)));
                    return Err(daisy_engine::Error::Invalid("the ring is broken".into()));
                }
                outstanding.push_back((header, left, head_ms));
                if !pass.wanted {
                    // A prefill chunk run for the stages' KV: the next one may leave now.
                    return Ok(Vec::new());
                }
                let mut data = Vec::new();
                while let Some(&(h, t, ms)) = outstanding.front() {
                    data = wait_back(h, t, ms)?;
                    outstanding.pop_front();
                }
                Ok(data)
            };
            let resume = conversation.as_mut().map(|c| Resume {
                cache: c.cache_mut(),
                kept,
            });
            generate_turn(opened, head, prompt_ids, opts, resume, &mut lap, &mut |t| {
                // A replay's tokens up to where the failed attempt got were shown already.
                if t.index < shown.tokens {
                    return ControlFlow::Continue(());
                }
                shown.tokens = t.index + 1;
                let text = shown.scan.push(t.text);
                match &job.sink {
                    Sink::Stdout => {
                        if !quiet {
                            let _ = write!(stdout, "{text}").and_then(|()| stdout.flush());
                        }
                    }
                    Sink::Client(tx) => {
                        let sent = text.is_empty() || tx.send(Streamed::Text(text)).is_ok();
                        if !sent || tx.is_closed() {
                            shown.client_gone = true;
                            return ControlFlow::Break(());
                        }
                    }
                }
                if shown.scan.stopped() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
        });
        self.slowest_lap = slowest;
        // What a failed attempt left on its way may still come back; a few turns' worth is kept.
        for (h, _, _) in outstanding {
            abandoned.entry(h.turn).or_default().insert(h.lap);
        }
        abandoned.retain(|&t, laps| !laps.is_empty() && t + ABANDONED_TURNS_KEPT > turn);
        self.abandoned = abandoned;
        let generated = match generated {
            Ok(g) => {
                if let Some(c) = conversation.as_mut() {
                    c.record(turn, prompt_ids, kept, &g.generation.passes);
                }
                self.conversation = conversation;
                g
            }
            Err(e) => {
                if let Some((device, why)) = culprit.into_inner() {
                    return Err(Failure::Member { device, why });
                }
                // A message the last member began on the return link and never finished.
                if stalled
                    && let (Some(link), Some(m)) = (self.up_link(), self.members.last())
                    && link.partial() > 0
                {
                    return Err(Failure::member(
                        &m.device,
                        format!("a lap stalled ({e}) on a message it began and never finished"),
                    ));
                }
                if stalled && let Some(device) = self.find_stalled().await {
                    return Err(Failure::member(
                        &device,
                        format!("a lap stalled ({e}) and its heartbeat got no answer"),
                    ));
                }
                return Err(Failure::Other(anyhow::Error::from(e)));
            }
        };
        // Every member's hop of the first lap, in hop order after the head's.
        let mut member_hops: Vec<Option<daisy_engine::Hop>> = vec![None; self.members.len()];
        while member_hops.iter().any(Option::is_none) {
            let event = tokio::time::timeout(Duration::from_secs(10), self.events.recv())
                .await
                .map_err(|_| anyhow!("the members did not report their hops within 10 s"))?
                .context("the members' events stopped")?;
            match event {
                Event::Hop(device, h) if h.turn == turn => {
                    let at = self.members.iter().position(|m| m.device == device);
                    if let Some(i) = at.filter(|&i| h.hop == i + 1) {
                        member_hops[i] = Some(daisy_engine::Hop {
                            after_layer: h.after_layer,
                            sha256: h.sha256.0,
                        });
                    }
                }
                Event::Down(device, why) if self.members.iter().any(|m| m.device == device) => {
                    return Err(Failure::Member { device, why });
                }
                _ => {}
            }
        }
        hops.extend(member_hops.into_iter().flatten());
        Ok((generated, hops, lap_ms, turn, continued))
    }

    /// A turn: replayed once, without the member that failed, when one does. A client's turn that
    /// fails is told why before the error ends the head.
    async fn turn(&mut self, job: Job) -> Result<()> {
        self.shared.view.state("generating");
        let result = self.turn_of(&job).await;
        match &result {
            Ok(()) => self.shared.view.update(|v| {
                v.state = "ready".into();
                v.turns += 1;
            }),
            Err(e) => {
                let why = failure(e);
                self.shared.view.update(|v| {
                    v.state = "stopped".into();
                    v.error = Some(why.clone());
                });
                if let Sink::Client(tx) = &job.sink {
                    let _ = tx.send(Streamed::Failed(why));
                }
            }
        }
        result
    }

    async fn turn_of(&mut self, job: &Job) -> Result<()> {
        let args = self.settings.args;
        let (opts, prompt_ids) = (&job.opts, &job.prompt_ids);
        if job.sink.gone() {
            eprintln!("head: a queued request was cancelled before its turn");
            return Ok(());
        }
        if let Sink::Client(tx) = &job.sink {
            let _ = tx.send(Streamed::Started);
        }
        let stdout_json = matches!(job.sink, Sink::Stdout) && args.format.json();
        eprintln!(
            "head: a turn of {} prompt tokens, {} path",
            prompt_ids.len(),
            opts.path.name()
        );
        let mut shown = Shown {
            tokens: 0,
            scan: daisy_engine::StopScan::new(job.stop.clone())?,
            client_gone: false,
        };
        let mut replays = 0;
        let (generated, hops, lap_ms, turn, continued) = loop {
            match self.attempt(job, &mut shown).await {
                Ok(done) => break done,
                Err(Failure::Member { device, why }) if replays == 0 => {
                    eprintln!(
                        "\nhead: {device} failed mid-turn ({why}); replanning without it and \
                         replaying the turn from the start"
                    );
                    replays += 1;
                    self.shared.view.update(|v| {
                        v.state = "replaying".into();
                        v.replays += 1;
                    });
                    self.drop_member(&device, &why).await?;
                    if let Err(f) = self.establish().await {
                        bail!(
                            "the ring could not be rebuilt for the replay: {}",
                            failure(&f.into_error())
                        );
                    }
                }
                Err(Failure::Member { device, why }) => bail!(
                    "the turn failed again in its replay: member {device}: {why}; the ring is \
                     stopped"
                ),
                Err(Failure::Other(e)) => return Err(e),
            }
        };
        let ids = &generated.generation.ids;
        if shown.client_gone {
            eprintln!(
                "head: the client went away; its turn stopped after {} tokens",
                ids.len()
            );
            return Ok(());
        }
        // The end of the answer: what the stop scan held back, and (without a stop string) any
        // characters the last ids complete.
        let held = shown.scan.finish();
        let text = if shown.scan.stopped() {
            shown.scan.text().to_string()
        } else {
            generated.text.clone()
        };
        let tail = match text.strip_prefix(shown.scan.text()) {
            Some(rest) => format!("{held}{rest}"),
            None => held,
        };
        match &job.sink {
            Sink::Stdout if !stdout_json => {
                println!("{tail}");
            }
            Sink::Stdout => {}
            Sink::Client(tx) => {
                if !tail.is_empty() {
                    let _ = tx.send(Streamed::Text(tail));
                }
            }
        }
        let t = generated.timings;
        let decode: Vec<f64> = lap_ms.iter().filter(|l| l.0).map(|l| l.1).collect();
        let stats = lap_stats(lap_ms.iter().map(|l| l.1).collect());
        let decode_stats = lap_stats(decode);
        // One hop on the wire, for the report (`--format json`) and a client's latency picture.
        // A measurement, not the answer: when a ping is lost the turn still stands, without it.
        let pings = if stdout_json {
            Some(HOP_PINGS)
        } else if matches!(job.sink, Sink::Client(_)) && !self.members.is_empty() {
            Some(CLIENT_HOP_PINGS)
        } else {
            None
        };
        let hop_stats = match pings {
            Some(n) => match self.measure_hops(n).await {
                Ok(h) => Some(h),
                Err(e) => {
                    eprintln!("head: the hops were not timed: {}", failure(&e));
                    None
                }
            },
            None => None,
        };
        let hop_ms = hop_stats.as_ref().map(|h| h.p50_ms);
        // Where a decode lap went: for a client's picture, and the report's medians.
        let picture = if stdout_json || matches!(job.sink, Sink::Client(_)) {
            Some(self.picture(turn, &lap_ms).await)
        } else {
            None
        };
        if hop_ms.is_some() {
            self.shared.view.update(|v| v.hop_ms = hop_ms);
        }
        eprintln!(
            "head: {} tokens, prefill {:.1} tok/s, decode {:.1} tok/s; lap p50 {:.2} ms, p99 {:.2} ms",
            ids.len(),
            t.prefill_tokens_per_s,
            t.decode_tokens_per_s,
            stats.p50_ms,
            stats.p99_ms
        );
        let opened = &self.source.opened;
        let ended_by_eos = !opts.ignore_eos
            && ids
                .last()
                .is_some_and(|id| opened.eos_token_ids().contains(id));
        let finish =
            if shown.scan.stopped() || ended_by_eos || generated.json_complete == Some(true) {
                Finish::Stop
            } else if ids.len() >= opts.max_new_tokens {
                Finish::Length
            } else {
                Finish::Stop
            };
        if generated.json_complete == Some(false) && matches!(job.sink, Sink::Stdout) {
            bail!(
                "json-output: the value is not complete after --max-new-tokens {}",
                opts.max_new_tokens
            );
        }
        let head = self.head.as_ref().expect("established");
        // Verify needs every layer on the head; when they cannot fit it says so, never passes.
        let facts = model_facts(opened);
        let whole = facts.head_bytes + facts.n_layers as u64 * facts.layer_bytes;
        let memory = control::memory_bytes(args.memory_limit);
        let mut verify_unavailable = None;
        let verified = if !job.verify {
            eprintln!(
                "head: verify skipped ({})",
                match job.sink {
                    Sink::Stdout => "--no-verify",
                    Sink::Client(_) => "the request did not ask for it",
                }
            );
            None
        } else if let Some(m) = memory.filter(|&m| {
            m < facts.head_bytes + daisy_model::MAX_LIVE_LAYERS as u64 * facts.layer_bytes
        }) {
            let why = format!(
                "verify: not run, the head cannot hold even the embedding and two layers ({whole} \
                 bytes of weights in all, {m} available): this answer is unverified"
            );
            eprintln!("head: {why}");
            verify_unavailable = Some(why);
            None
        } else {
            // Beyond the head's memory Verify streams the layers from their shard, two live.
            let max = if memory.is_some_and(|m| m < whole) {
                Some(daisy_model::MAX_LIVE_LAYERS)
            } else {
                args.residency.max_resident_layers
            };
            if max.is_some() {
                eprintln!("head: verify streams the layers from their shard, two live at a time");
            }
            // A turn cut short by a stop string is verified over the ids it produced.
            let mut opts = opts.clone();
            if generated.generation.cancelled {
                opts.max_new_tokens = ids.len();
            }
            let backend = self.chosen.backend.clone();
            #[cfg(feature = "test-hooks")]
            let fresh = Continued::default();
            #[cfg(feature = "test-hooks")]
            let replayed = if crate::test_hooks::verify_fresh() {
                &fresh
            } else {
                &continued
            };
            #[cfg(not(feature = "test-hooks"))]
            let replayed = &continued;
            let report = tokio::task::block_in_place(|| {
                verify(
                    opened,
                    None,
                    head.precision(),
                    &backend,
                    prompt_ids,
                    &opts,
                    daisy_engine::SplitRun {
                        ids,
                        hops: &hops,
                        history: &replayed.history,
                        kept: replayed.kept,
                    },
                    max,
                )
            })
            .context("verify: the head could not re-run the turn with every layer")?;
            eprintln!("head: {}", report.summary());
            Some(report)
        };
        let conversation = self.prefixes.as_mut().and_then(|p| {
            p.record(&self.fingerprint.0, prompt_ids)
                .map_err(|e| {
                    eprintln!(
                        "head: the conversation record was not saved: {}",
                        failure(&e)
                    )
                })
                .ok()
        });
        let failed = verified.as_ref().is_some_and(|v| !v.matched);
        if let Sink::Client(tx) = &job.sink {
            // The ring is free before the client hears the answer is complete.
            self.shared.view.state("ready");
            let _ = tx.send(Streamed::Done(Box::new(Finished {
                text,
                prompt_tokens: prompt_ids.len(),
                completion_tokens: ids.len(),
                finish,
                verify: verified,
                verify_unavailable,
                decode_tokens_per_s: t.decode_tokens_per_s,
                lap_ms: decode_stats.p50_ms,
                hop_ms,
                hops: self.members.len() + 1,
                picture,
                laps: generated.generation.laps,
                drafted: generated.generation.drafted,
                accepted: generated.generation.accepted,
                kept_positions: continued.kept,
            })));
            return Ok(());
        }
        if stdout_json {
            let report = RingReport {
                turn: TurnReport {
                    load_peak_rss_bytes: self.load_peak,
                    ..TurnReport::of(
                        opened,
                        &self.plan,
                        head,
                        self.chosen.adapter.clone(),
                        opts.path,
                        prompt_ids.clone(),
                        generated,
                        &hops,
                        verified,
                    )
                },
                turn_id: turn,
                replays,
                kept_positions: continued.kept,
                conversation,
                verify_unavailable,
                devices: self.devices(),
                excluded: self.excluded.clone(),
                lap_ms: stats,
                decode_lap_ms: decode_stats,
                hop_ms: hop_stats,
                lap_split: picture.as_ref().map(LapSplit::of),
                bytes_sent_by_head: self.bytes_sent(),
                bytes_served: self
                    .settings
                    .served
                    .as_ref()
                    .map(super::mirror::Served::by_client),
            };
            println!("{}", serde_json::to_string(&report)?);
        }
        if failed {
            bail!("verify failed: the ring and the head's unsplit run gave different ids");
        }
        Ok(())
    }
}

/// What a turn has shown so far, kept across its replay.
struct Shown {
    /// Tokens shown.
    tokens: usize,
    scan: daisy_engine::StopScan,
    /// The client's receiver is gone: the turn was cancelled.
    client_gone: bool,
}

/// The start of the head's line for a member it admitted (`head: stage-1 joined from 127.0.0.1`),
/// which `node demo` waits for before it starts the next member.
pub(crate) fn joined(device: &str) -> String {
    format!("head: {device} joined from")
}

/// A plan's estimate of a token's compute for people: milliseconds below a second (a small model's
/// token is a fraction of one), seconds above.
fn per_token(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
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

/// A turn's [`Picture`] in medians: each stage's compute in a decode lap, and the rest, the wire.
#[derive(Serialize)]
struct LapSplit {
    /// The stages, head first.
    stages: Vec<String>,
    /// Per stage, the median of its compute per decode lap (`None`: the member did not report).
    compute_p50_ms: Vec<Option<f64>>,
    /// The median of each decode lap less its members' compute.
    wire_p50_ms: f64,
}

impl LapSplit {
    fn of(p: &Picture) -> Self {
        let median = |ms: Vec<f64>| (!ms.is_empty()).then(|| lap_stats(ms).p50_ms);
        let compute_p50_ms = (0..p.stages.len())
            .map(|i| {
                median(
                    p.compute_ms
                        .iter()
                        .filter_map(|row| row.get(i).copied().flatten())
                        .collect(),
                )
            })
            .collect();
        Self {
            stages: p.stages.clone(),
            compute_p50_ms,
            wire_p50_ms: median(p.wire_ms.clone()).unwrap_or(0.0),
        }
    }
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
    /// The turn number of the attempt that completed.
    turn_id: u64,
    /// How many times the turn was replayed (0 or 1).
    replays: usize,
    /// Prompt positions whose keys the stages kept from the previous turn (`--kv-reuse`), not
    /// computed again.
    kept_positions: usize,
    /// This turn's conversation in the prefix record (the turns seen with its prefix so far).
    conversation: Option<Seen>,
    /// Why Verify did not run although it was asked for (the head cannot hold even the embedding
    /// and two layers).
    verify_unavailable: Option<String>,
    devices: Vec<String>,
    excluded: Vec<String>,
    /// Every lap, from leaving the head to coming back.
    lap_ms: LapStats,
    /// Decode laps only.
    decode_lap_ms: LapStats,
    /// One hop on the wire: half the round trip of a heartbeat on the head's link to each member,
    /// measured after the turn (`--format json` only).
    hop_ms: Option<LapStats>,
    /// Where a decode lap went, in medians over the turn's decode laps.
    lap_split: Option<LapSplit>,
    bytes_sent_by_head: u64,
    /// Bytes of the head's model folder each member fetched (when the head serves its folder).
    bytes_served: Option<std::collections::BTreeMap<String, u64>>,
}

/// The record of conversation prefixes in the data folder, said on stderr; none (and why) when
/// there is no data folder or its file is not a record.
fn open_prefixes() -> Option<Prefixes> {
    let path = Prefixes::default_path()?;
    match Prefixes::open(path) {
        Ok(p) => {
            eprintln!(
                "head: {} conversation prefixes on record in {}",
                p.len(),
                p.path().display()
            );
            Some(p)
        }
        Err(e) => {
            eprintln!("head: no conversation record this run: {}", failure(&e));
            None
        }
    }
}

/// Admit `needed` members: each says Hello and runs a fresh probe, which must match the head's.
async fn admit(
    needed: usize,
    joined: &mut mpsc::Receiver<(String, Link)>,
    backend: &Arc<dyn daisy_gemm_int8::Backend>,
    head_probe: &(daisy_wire::Hash, f64),
    excluded: &mut Vec<String>,
    view: &SharedView,
) -> Result<Vec<Member>> {
    let mut members: Vec<Member> = Vec::new();
    eprintln!("head: waiting for {needed} member(s)");
    while members.len() < needed {
        let (device, link) = joined
            .recv()
            .await
            .context("the signaling server stopped")?;
        if let Some(m) = admit_one(device, link, backend, head_probe, excluded, view).await? {
            members.push(m);
        }
    }
    Ok(members)
}

/// One joined device: its Hello, then a fresh seeded probe; `None` when it is left out (and why is
/// printed and listed in `excluded`).
async fn admit_one(
    device: String,
    link: Link,
    backend: &Arc<dyn daisy_gemm_int8::Backend>,
    head_probe: &(daisy_wire::Hash, f64),
    excluded: &mut Vec<String>,
    view: &SharedView,
) -> Result<Option<Member>> {
    let link = Arc::new(link);
    view.device(&device, |_| {});
    let hello = match control::expect(&link, "hello", HELLO_TIMEOUT).await {
        Ok(Message::Hello(h)) if h.device.as_str() == device => h,
        Ok(_) => {
            eprintln!("head: {device} did not start with its hello; left out");
            return Ok(None);
        }
        Err(e) => {
            eprintln!("head: {device}: {}; left out", failure(&e));
            return Ok(None);
        }
    };
    view.device(&device, |d| {
        d.memory_bytes = hello.memory_bytes;
        d.backend = hello.backend.as_str().to_string();
        d.gemm_rate = hello.gemm_rate.get();
        d.probe = "running".into();
    });
    let left_out = |why: &str| {
        view.device(&device, |d| {
            d.probe = format!("left out: {why}");
            d.status = format!("left out: {why}");
        });
    };
    let seed = u64::from_le_bytes(nonce()[..8].try_into().expect("8 bytes"));
    control::send(&link, &Message::ProbeRequest(ProbeRequest { seed })).await?;
    let expected = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || control::probe(&backend, seed)).await??
    };
    let result = match control::expect(&link, "probe result", HELLO_TIMEOUT).await {
        Ok(Message::ProbeResult(r)) => r,
        Ok(Message::Error(e)) => {
            let why = format!(
                "{device}: left out, its probe failed: {}",
                e.message.as_str()
            );
            eprintln!("head: {why}");
            left_out(&format!("its probe failed: {}", e.message.as_str()));
            excluded.push(why);
            link.close().await;
            return Ok(None);
        }
        Ok(_) | Err(_) => {
            eprintln!("head: {device} did not answer the probe; left out");
            left_out("it did not answer the probe");
            link.close().await;
            return Ok(None);
        }
    };
    if result.seed != seed || result.hash != expected.0 || hello.probe_hash != head_probe.0 {
        let why = format!(
            "{device}: left out, its probe disagrees (SHA-256 {} where the head computed {})",
            hex::encode(&result.hash.0[..8]),
            hex::encode(&expected.0.0[..8])
        );
        eprintln!("head: {why}");
        left_out("its probe disagrees with the head's");
        excluded.push(why);
        link.close().await;
        return Ok(None);
    }
    view.device(&device, |d| {
        d.probe = "passed".into();
        d.gemm_rate = result.gemm_rate.get();
    });
    eprintln!(
        "head: {device}: {}, {:.1} GMAC/s, memory {}, probe matches",
        hello.backend.as_str(),
        result.gemm_rate.get() / 1e9,
        hello
            .memory_bytes
            .map_or("unknown".to_string(), |m| format!("{} MiB", m >> 20))
    );
    Ok(Some(Member {
        device,
        hello,
        control: link,
    }))
}

/// The head's one queue of turns: stdin's prompts and the API's requests (`None`: stdin ended).
struct Queue<'a> {
    jobs: &'a mut mpsc::Receiver<Option<Job>>,
    tx: mpsc::Sender<Option<Job>>,
    /// Set once the ring is formed.
    ready: &'a std::sync::atomic::AtomicBool,
    /// Encodes stdin's prompts on a thread of their own.
    encoder: Arc<daisy_engine::Encoder>,
}

async fn drive(
    settings: &Settings<'_>,
    shared: &Arc<Shared>,
    joined: &mut mpsc::Receiver<(String, Link)>,
    queue: Queue<'_>,
    source: Source,
    chosen: daisy_engine::ChosenBackend,
) -> Result<()> {
    let args = settings.args;
    let backend = chosen.backend.clone();
    let needed = args
        .members
        .unwrap_or_else(|| args.stages.as_ref().map_or(1, |s| s.len() - 1));
    let head_probe = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || control::probe(&backend, control::HELLO_PROBE_SEED))
            .await??
    };
    let view = &shared.view;
    view.device(HEAD, |d| {
        d.head = true;
        d.memory_bytes = control::memory_bytes(args.memory_limit);
        d.backend = chosen.backend.name();
        d.adapter = chosen.adapter.clone();
        d.gemm_rate = head_probe.1;
        d.probe = "passed (the reference)".into();
        d.status = "in the ring".into();
    });
    let mut excluded = Vec::new();
    let members = admit(needed, joined, &backend, &head_probe, &mut excluded, view).await?;

    // The plan: `--stages` as given, members in the order they joined; else the planner's.
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
                view.device(e.device.as_str(), |d| d.status = format!("left out: {why}"));
                excluded.push(line);
            }
            eprintln!(
                "head: the plan estimates {} of compute per token",
                per_token(decision.seconds_per_token)
            );
            view.update(|v| v.seconds_per_token = Some(decision.seconds_per_token));
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
    if args.stages.is_some() {
        let counts: Vec<usize> = plan.stages().iter().map(|s| s.len()).collect();
        let mut rates = vec![head_probe.1];
        rates.extend(members.iter().map(|m| m.hello.gemm_rate.get()));
        let seconds = daisy_ring::seconds_per_token(&counts, &rates, &model_facts(opened));
        view.update(|v| v.seconds_per_token = Some(seconds));
    }
    view.update(|v| v.excluded = excluded.clone());
    let (events_tx, events) = mpsc::unbounded_channel();
    let (back_tx, back) = std::sync::mpsc::channel();
    for m in &members {
        watch(m, events_tx.clone(), back_tx.clone());
    }
    let mut ring = Ring {
        settings,
        shared: shared.clone(),
        source: &source,
        chosen,
        fingerprint: Fingerprint(opened.checkpoint.fingerprint()),
        plan,
        head: None,
        load_peak: None,
        members,
        excluded,
        events,
        events_tx,
        back,
        back_tx,
        to_ring: None,
        links: Vec::new(),
        slowest_lap: Duration::ZERO,
        next_turn: 1,
        abandoned: HashMap::new(),
        head_probe,
        bytes_sent_before: 0,
        conversation: None,
        prefixes: open_prefixes(),
    };
    let result = run_turns(&mut ring, joined, queue).await;
    for m in &ring.members {
        m.control.close().await;
    }
    for link in &ring.links {
        link.close().await;
    }
    shared.peers.lock().expect("peers lock").clear();
    result
}

/// Form the ring: a member refused while it forms (another model's slice, a failed load, a link
/// that does not open) is left out and its layers go to the stage before it.
async fn form(ring: &mut Ring<'_>) -> Result<()> {
    loop {
        match ring.establish().await {
            Ok(()) => return Ok(()),
            Err(Failure::Member { device, why }) => {
                eprintln!("head: {device} is left out: {why}");
                ring.drop_member(&device, &why).await?;
            }
            Err(Failure::Other(e)) => return Err(e),
        }
    }
}

/// Does stdin carry prompts? Not when it is `/dev/null` (a character device that is no terminal):
/// a head started that way serves its API until it is stopped.
fn stdin_has_prompts() -> bool {
    use std::io::IsTerminal;
    use std::os::unix::fs::FileTypeExt;
    if std::io::stdin().is_terminal() {
        return true;
    }
    !std::fs::metadata("/dev/stdin").is_ok_and(|m| m.file_type().is_char_device())
}

async fn run_turns(
    ring: &mut Ring<'_>,
    joined: &mut mpsc::Receiver<(String, Link)>,
    queue: Queue<'_>,
) -> Result<()> {
    let args = ring.settings.args;
    form(ring).await?;
    queue.ready.store(true, Ordering::SeqCst);
    let job = |prompt_ids| Job {
        prompt_ids,
        opts: ring.settings.opts.clone(),
        stop: Vec::new(),
        verify: !args.no_verify,
        sink: Sink::Stdout,
    };
    if let Some(p) = &args.prompt {
        let prompt = super::run::prompt(p, args.generate.chat);
        let ids = ring.source.opened.encode(&prompt).context("--prompt")?;
        let job = job(ids);
        return ring.turn(job).await;
    }
    if stdin_has_prompts() {
        // Prompts are read and tokenized on a thread of their own, so one typed while a turn owns
        // the ring is tokenized while it waits; turns take them in order, with the API's requests.
        let encoder = queue.encoder.clone();
        let chat = args.generate.chat;
        let tx = queue.tx.clone();
        let template = job(Vec::new());
        let (opts, verify) = (template.opts, template.verify);
        std::thread::Builder::new()
            .name("prompts".into())
            .spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    let Ok(line) = line else { break };
                    if line.trim().is_empty() {
                        continue;
                    }
                    // A prompt that cannot be encoded loses nothing else: the next is read.
                    let ids = match encoder.encode(&super::run::prompt(&line, chat)) {
                        Ok(ids) => ids,
                        Err(e) => {
                            eprintln!("head: the prompt: {}", failure_of(&e));
                            continue;
                        }
                    };
                    eprintln!("head: a prompt of {} tokens is queued", ids.len());
                    let job = Job {
                        prompt_ids: ids,
                        opts: opts.clone(),
                        stop: Vec::new(),
                        verify,
                        sink: Sink::Stdout,
                    };
                    if tx.blocking_send(Some(job)).is_err() {
                        return;
                    }
                }
                let _ = tx.blocking_send(None);
            })?;
        eprintln!("head: type a prompt and press enter (end with ctrl-d)");
    } else {
        eprintln!("head: ready; serving until stopped");
    }
    drop(queue.tx);
    while let Some(Some(job)) = queue.jobs.recv().await {
        // Devices that joined since the last turn (a dropped member back, or a new one) take part;
        // one whose control link is still opening is waited for a little.
        let t0 = Instant::now();
        while ring.shared.opening.load(Ordering::SeqCst) > 0
            && t0.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut added = false;
        while let Ok((device, link)) = joined.try_recv() {
            let backend = ring.chosen.backend.clone();
            let probe = ring.head_probe;
            let mut excluded = Vec::new();
            let view = ring.shared.view.clone();
            let admitted = admit_one(device, link, &backend, &probe, &mut excluded, &view).await?;
            ring.excluded.extend(excluded);
            let all = ring.excluded.clone();
            ring.shared.view.update(|v| v.excluded = all);
            if let Some(m) = admitted {
                added |= ring.add_member(m).await?;
            }
        }
        if added {
            form(ring).await?;
        }
        ring.turn(job).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_estimate_reads_in_milliseconds_below_a_second() {
        // SmolLM2 at 360 GMAC/s: 0.37 ms, which "{:.3} s" printed as 0.000 s.
        assert_eq!(per_token(0.000_374), "0.37 ms");
        assert_eq!(per_token(0.25), "250.00 ms");
        assert_eq!(per_token(2.5), "2.50 s");
    }
}
