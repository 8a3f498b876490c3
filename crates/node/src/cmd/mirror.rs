//! `node mirror DIR`: serve local model folders under the Hugging Face Hub's URL layout, so the devices
//! of a LAN (and the tests) fetch their byte ranges from one machine instead of the Hub.
//!
//! Files are served at `/{org}/{name}/resolve/{revision}/{file}` with `Range`, `ETag` and
//! `X-Repo-Commit`, like the Hub. Weight files are answered with a 302 to a second host name (by default
//! `127.0.0.2`, a loopback address of its own) the way the Hub hands large files to its CDN; that host
//! serves them under a signed path and never asks for a token. With `--require-token` the first host
//! answers 401 to a request without a bearer token listed in `DAISY_MIRROR_TOKEN` (comma-separated:
//! one token per user of a gated repo).
//!
//! `GET /__stats` returns the bytes served per client (the `X-Daisy-Client` header, else the peer's IP)
//! and how many requests reached the redirect host carrying an `Authorization` header (always 0 for a
//! well-behaved client).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::options::failure;
use anyhow::{Context, bail};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use daisy_loader::{DEFAULT_REVISION, ModelRef, RepoId, Revision, cache_folder, find_in_cache};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Serve Hugging Face-layout model folders (and a Hugging Face cache) with the Hub's URL layout.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Folder holding `org/name/` model folders in Hugging Face layout, and/or `models--org--name/`
    /// folders of a Hugging Face cache (`~/.cache/huggingface/hub` can be served as it is).
    dir: PathBuf,
    /// Address to listen on; port 0 picks a free one. The URL is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:8790")]
    listen: SocketAddr,
    /// Host address weight files are redirected to, served on a port of its own (like the Hub's CDN).
    #[arg(long, default_value = "127.0.0.2")]
    redirect_host: IpAddr,
    /// Answer 401 to requests without `Authorization: Bearer $DAISY_MIRROR_TOKEN` (a gated repo).
    #[arg(long)]
    require_token: bool,
    /// Cap each response's body rate at this many MB/s (to play a LAN link on loopback, e.g. in
    /// benchmarks); unlimited when absent.
    #[arg(long)]
    rate_limit: Option<f64>,
    /// Misbehave on purpose, to test that clients refuse a broken server (tests only).
    #[arg(long, value_enum, hide = true)]
    fault: Option<Fault>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    /// Answer 200 with the whole body to a range request.
    IgnoreRange,
    /// Announce the full length but send half the body.
    ShortBody,
    /// Answer a range request with a `Content-Range` one byte off.
    WrongContentRange,
    /// Redirect weight files to themselves, forever.
    RedirectLoop,
    /// Report a new commit on every answer.
    CommitChanges,
}

struct Mirror {
    dir: PathBuf,
    /// Serve only this folder, as this repo (the head serving its model to the members).
    single: Option<(RepoId, PathBuf)>,
    /// Answer weight files with a redirect to the second host (`false`: serve them directly).
    redirect: bool,
    token: Option<String>,
    /// Where weight files are redirected for a request that came to a loopback address.
    redirect_host: IpAddr,
    /// The redirect host's port (it listens on every address the first host does).
    cdn_port: u16,
    fault: Option<Fault>,
    /// Bytes per second for one response body, when capped.
    rate: Option<f64>,
    served: Mutex<BTreeMap<String, u64>>,
    auth_on_redirect_host: AtomicU64,
    answers: AtomicU64,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if !args.dir.is_dir() {
        bail!(
            "mirror folder {} does not exist or is not a folder",
            args.dir.display()
        );
    }
    let token = if args.require_token {
        let token = std::env::var("DAISY_MIRROR_TOKEN").context(
            "--require-token reads the expected token from DAISY_MIRROR_TOKEN, which is not set",
        )?;
        if token.is_empty() {
            bail!("DAISY_MIRROR_TOKEN is empty");
        }
        Some(token)
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args, token))
}

async fn serve(args: Args, token: Option<String>) -> anyhow::Result<()> {
    let main = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not listen on {}", args.listen))?;
    // The redirect host listens where the first host does (so another device can follow a redirect),
    // and on its own loopback address when the first host is loopback only.
    let cdn_ip = if args.listen.ip().is_loopback() {
        args.redirect_host
    } else {
        args.listen.ip()
    };
    let cdn_addr = SocketAddr::new(cdn_ip, 0);
    let cdn = tokio::net::TcpListener::bind(cdn_addr)
        .await
        .with_context(|| {
            format!(
                "could not listen on the redirect host {}",
                args.redirect_host
            )
        })?;
    let main_addr = main.local_addr()?;
    let cdn_addr = cdn.local_addr()?;
    let mirror = Arc::new(Mirror {
        dir: args.dir.clone(),
        single: None,
        redirect: true,
        token,
        redirect_host: args.redirect_host,
        cdn_port: cdn_addr.port(),
        fault: args.fault,
        rate: args.rate_limit.map(|mb| mb * 1e6),
        served: Mutex::new(BTreeMap::new()),
        auth_on_redirect_host: AtomicU64::new(0),
        answers: AtomicU64::new(0),
    });
    let main_app = Router::new()
        .route("/__stats", get(stats))
        .route("/{org}/{name}/resolve/{revision}/{*file}", get(resolve))
        .fallback(not_found)
        .with_state(mirror.clone());
    let cdn_app = Router::new()
        .route("/__cdn/{org}/{name}/{commit}/{*file}", get(cdn_file))
        .fallback(not_found)
        .with_state(mirror.clone());
    // Bound to every interface, the URL names this machine's LAN address, which other devices use.
    let main_addr = crate::net::reachable(main_addr);
    println!("listening on http://{main_addr}");
    eprintln!(
        "mirror: serving {} on http://{main_addr}; weight files redirect to port {} of the host a \
         request came to ({} for loopback){}",
        args.dir.display(),
        cdn_addr.port(),
        args.redirect_host,
        if mirror.token.is_some() {
            "; a bearer token is required"
        } else {
            ""
        }
    );
    let main_server = axum::serve(
        main,
        main_app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    let cdn_server = axum::serve(
        cdn,
        cdn_app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    tokio::select! {
        r = main_server => r.context("mirror server failed")?,
        r = cdn_server => r.context("redirect host server failed")?,
        _ = tokio::signal::ctrl_c() => eprintln!("mirror: stopped"),
    }
    Ok(())
}

/// A Hub-style error: status, `X-Error-Code` and `X-Error-Message`.
fn hub_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (status, message.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        "x-error-code",
        HeaderValue::from_str(code).expect("ascii code"),
    );
    if let Ok(value) = HeaderValue::from_str(message) {
        headers.insert("x-error-message", value);
    }
    response
}

async fn not_found() -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        "EntryNotFound",
        "no such path on this mirror",
    )
}

async fn stats(State(mirror): State<Arc<Mirror>>) -> Response {
    let served = mirror.served.lock().expect("stats lock").clone();
    let body = serde_json::json!({
        "bytes_served": served,
        "authorization_on_redirect_host": mirror.auth_on_redirect_host.load(Ordering::Relaxed),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn revision_not_found(revision: &str) -> Box<Response> {
    Box::new(hub_error(
        StatusCode::NOT_FOUND,
        "RevisionNotFound",
        &format!("Invalid rev id: {revision}"),
    ))
}

/// A repository resolved on disk: the folder its files are in and the commit it stands for.
struct Snapshot {
    root: PathBuf,
    commit: String,
}

/// The file path inside a repo: relative, normal components only.
fn valid_file(file: &str) -> Option<PathBuf> {
    let path = Path::new(file);
    if file.is_empty() || file.contains('\\') || file.contains('\0') {
        return None;
    }
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| path.to_path_buf())
}

impl Mirror {
    fn snapshot(&self, org: &str, name: &str, revision: &str) -> Result<Snapshot, Box<Response>> {
        let repo_not_found = || {
            hub_error(
                StatusCode::UNAUTHORIZED,
                "RepoNotFound",
                &format!("Repository Not Found for url: {org}/{name}."),
            )
        };
        // The wire's repo-id grammar (the one contract): no part can escape the mirror folder.
        let Ok(repo) = RepoId::parse(&format!("{org}/{name}")) else {
            return Err(Box::new(repo_not_found()));
        };
        let Ok(rev) = Revision::parse(revision) else {
            return Err(revision_not_found(revision));
        };
        let folder = match &self.single {
            Some((only, folder)) if *only == repo => folder.clone(),
            Some(_) => return Err(Box::new(repo_not_found())),
            None => self.dir.join(repo.org()).join(repo.name()),
        };
        if folder.is_dir() {
            let commit = folder_commit(&folder).map_err(|e| {
                hub_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "ServerError",
                    &failure(&e),
                )
            })?;
            // Under the commit-changes fault every reported commit shares the real one's first 32 digits.
            let reported = self.fault == Some(Fault::CommitChanges)
                && revision.len() == 40
                && revision.get(..32) == commit.get(..32);
            if revision != DEFAULT_REVISION && revision != commit && !reported {
                return Err(revision_not_found(revision));
            }
            return Ok(Snapshot {
                root: folder,
                commit,
            });
        }
        // A Hugging Face cache, laid out as the loader reads it.
        if !cache_folder(&self.dir, &repo).is_dir() {
            return Err(Box::new(repo_not_found()));
        }
        let model = ModelRef {
            repo,
            revision: Some(rev),
        };
        match find_in_cache(&self.dir, &model) {
            Ok(found) => Ok(Snapshot {
                root: found.dir,
                commit: found.commit,
            }),
            Err(_) => Err(revision_not_found(revision)),
        }
    }

    fn commit_header(&self, commit: &str) -> HeaderValue {
        let commit = if self.fault == Some(Fault::CommitChanges) {
            let n = self.answers.fetch_add(1, Ordering::Relaxed);
            let mut changed = commit.to_string();
            changed.replace_range(32.., &format!("{n:08x}"));
            changed
        } else {
            commit.to_string()
        };
        HeaderValue::from_str(&commit).expect("hex commit")
    }

    fn count(&self, client: String, bytes: u64) {
        *self
            .served
            .lock()
            .expect("stats lock")
            .entry(client)
            .or_default() += bytes;
    }

    /// The signature of a redirect-host path, so that host serves only what the first host allowed.
    fn sign(&self, path: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.token.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
        h.update(path.as_bytes());
        hex::encode(h.finalize())
    }
}

/// Bytes a folder router has served, per client.
#[derive(Clone)]
pub(crate) struct Served(Arc<Mirror>);

impl Served {
    /// Bytes served so far, by client (`X-Daisy-Client`, else the peer's IP).
    pub(crate) fn by_client(&self) -> BTreeMap<String, u64> {
        self.0.served.lock().expect("stats lock").clone()
    }
}

/// The Hub's routes for one local folder served as `repo` (weight files answered directly, bytes
/// counted per client at `/__stats`): how the head hands its model to the members.
pub(crate) fn folder_router(repo: RepoId, folder: PathBuf) -> (Router, Served) {
    let mirror = Arc::new(Mirror {
        dir: folder.clone(),
        single: Some((repo, folder)),
        redirect: false,
        token: None,
        redirect_host: IpAddr::from([127, 0, 0, 2]),
        cdn_port: 0,
        fault: None,
        rate: None,
        served: Mutex::new(BTreeMap::new()),
        auth_on_redirect_host: AtomicU64::new(0),
        answers: AtomicU64::new(0),
    });
    let served = Served(mirror.clone());
    let router = Router::new()
        .route("/__stats", get(stats))
        .route("/{org}/{name}/resolve/{revision}/{*file}", get(resolve))
        .with_state(mirror);
    (router, served)
}

/// A stable commit id for a plain folder: SHA-256 over each file's relative path, size and
/// modification time, cut to the 40 hex digits of a git commit. Changing a file changes it.
pub(crate) fn folder_commit(folder: &Path) -> anyhow::Result<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, u64, u128)>) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                walk(base, &entry.path(), out)?;
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(base)?
                    .to_string_lossy()
                    .into_owned();
                let mtime = meta
                    .modified()?
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_nanos();
                out.push((rel, meta.len(), mtime));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(folder, folder, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for (rel, len, mtime) in files {
        h.update(format!("{rel}\0{len}\0{mtime}\n").as_bytes());
    }
    Ok(hex::encode(h.finalize())[..40].to_string())
}

/// The file `file` of `snapshot` on disk and its size, or the Hub's answer for a bad or missing path.
fn locate(
    snapshot: &Snapshot,
    file: &str,
    revision: &str,
) -> Result<(PathBuf, u64), Box<Response>> {
    let Some(rel) = valid_file(file) else {
        return Err(Box::new(hub_error(
            StatusCode::BAD_REQUEST,
            "InvalidPath",
            &format!("invalid file path {file:?}"),
        )));
    };
    let path = snapshot.root.join(rel);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => Ok((path, meta.len())),
        _ => Err(Box::new(hub_error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{file} does not exist on \"{revision}\""),
        ))),
    }
}

fn is_weight_file(file: &str) -> bool {
    [
        ".safetensors",
        ".gguf",
        ".bin",
        ".pt",
        ".pth",
        ".h5",
        ".msgpack",
        ".onnx",
    ]
    .iter()
    .any(|ext| file.ends_with(ext))
}

fn client_id(headers: &HeaderMap, peer: SocketAddr) -> String {
    headers
        .get("x-daisy-client")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(str::to_string)
        .unwrap_or_else(|| peer.ip().to_string())
}

async fn resolve(
    State(mirror): State<Arc<Mirror>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    UrlPath((org, name, revision, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(tokens) = &mirror.token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| tokens.split(',').any(|t| !t.is_empty() && t == g)) {
            return hub_error(
                StatusCode::UNAUTHORIZED,
                "GatedRepo",
                &format!(
                    "Access to model {org}/{name} is restricted. You must have access to it and be authenticated to access it."
                ),
            );
        }
    }
    let snapshot = match mirror.snapshot(&org, &name, &revision) {
        Ok(s) => s,
        Err(response) => return *response,
    };
    let (path, size) = match locate(&snapshot, &file, &revision) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    if mirror.redirect && is_weight_file(&file) {
        let cdn_path = if mirror.fault == Some(Fault::RedirectLoop) {
            format!("/{org}/{name}/resolve/{revision}/{file}")
        } else {
            format!("/__cdn/{org}/{name}/{}/{file}", snapshot.commit)
        };
        let location = if mirror.fault == Some(Fault::RedirectLoop) {
            cdn_path
        } else {
            let sig = mirror.sign(&cdn_path);
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            let base = redirect_base(host, mirror.redirect_host, mirror.cdn_port);
            format!("{base}{cdn_path}?sig={sig}")
        };
        let mut response = StatusCode::FOUND.into_response();
        let h = response.headers_mut();
        h.insert(
            header::LOCATION,
            HeaderValue::from_str(&location).expect("ascii location"),
        );
        h.insert("x-repo-commit", mirror.commit_header(&snapshot.commit));
        h.insert("x-linked-size", HeaderValue::from(size));
        return response;
    }
    let client = client_id(&headers, peer);
    serve_file(&mirror, &path, size, &snapshot.commit, &headers, client).await
}

/// The redirect host for a request whose `Host` header is `host`: the same host name on the redirect
/// port (another device reaches the mirror the way it came), or the loopback redirect address when
/// the request came over loopback or named no usable host.
fn redirect_base(host: Option<&str>, loopback: IpAddr, port: u16) -> String {
    let fallback = || format!("http://{}", SocketAddr::new(loopback, port));
    let Some(authority) = host.and_then(|h| h.parse::<axum::http::uri::Authority>().ok()) else {
        return fallback();
    };
    let name = authority.host();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    let is_loopback = name.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if is_loopback || authority.as_str().contains(['/', '?', '@']) {
        return fallback();
    }
    format!("http://{name}:{port}")
}

#[derive(serde::Deserialize)]
struct Signed {
    sig: Option<String>,
}

async fn cdn_file(
    State(mirror): State<Arc<Mirror>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    UrlPath((org, name, commit, file)): UrlPath<(String, String, String, String)>,
    Query(signed): Query<Signed>,
    headers: HeaderMap,
) -> Response {
    if headers.contains_key(header::AUTHORIZATION) {
        mirror.auth_on_redirect_host.fetch_add(1, Ordering::Relaxed);
    }
    let cdn_path = format!("/__cdn/{org}/{name}/{commit}/{file}");
    if signed.sig.as_deref() != Some(mirror.sign(&cdn_path).as_str()) {
        return hub_error(
            StatusCode::FORBIDDEN,
            "InvalidSignature",
            "bad or missing signature",
        );
    }
    let snapshot = match mirror.snapshot(&org, &name, &commit) {
        Ok(s) => s,
        Err(response) => return *response,
    };
    let (path, size) = match locate(&snapshot, &file, &commit) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let client = client_id(&headers, peer);
    serve_file(&mirror, &path, size, &snapshot.commit, &headers, client).await
}

/// Parse a single `bytes=` range against a file of `size` bytes: `a-b`, `a-` or `-n`.
fn parse_range(value: &str, size: u64) -> Option<(u64, u64)> {
    let spec = value.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (start, end) = spec.split_once('-')?;
    let (start, end) = if start.is_empty() {
        let n: u64 = end.parse().ok()?;
        if n == 0 {
            return None;
        }
        (size.saturating_sub(n), size.checked_sub(1)?)
    } else {
        let start: u64 = start.parse().ok()?;
        let end = if end.is_empty() {
            size.checked_sub(1)?
        } else {
            end.parse::<u64>().ok()?.min(size.checked_sub(1)?)
        };
        (start, end)
    };
    (start <= end && end < size).then_some((start, end))
}

async fn serve_file(
    mirror: &Mirror,
    path: &Path,
    size: u64,
    commit: &str,
    headers: &HeaderMap,
    client: String,
) -> Response {
    let range = match headers.get(header::RANGE).map(|v| v.to_str().unwrap_or("")) {
        None => None,
        Some(value) => match parse_range(value, size) {
            Some(r) => Some(r),
            None => {
                let mut response = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
                response.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}")).expect("ascii"),
                );
                return response;
            }
        },
    };
    let range = if mirror.fault == Some(Fault::IgnoreRange) {
        None
    } else {
        range
    };
    let (status, start, len) = match range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        None => (StatusCode::OK, 0, size),
    };
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) => {
            return hub_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "ServerError",
                &e.to_string(),
            );
        }
    };
    if let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
        return hub_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ServerError",
            &e.to_string(),
        );
    }
    let sent = if mirror.fault == Some(Fault::ShortBody) {
        len / 2
    } else {
        len
    };
    mirror.count(client, sent);
    let stream = tokio_util::io::ReaderStream::with_capacity(file.take(sent), 64 * 1024);
    let body = match mirror.rate {
        None => Body::from_stream(stream),
        Some(rate) => {
            let start = tokio::time::Instant::now();
            let mut sent_so_far = 0u64;
            Body::from_stream(stream.then(move |chunk| {
                if let Ok(bytes) = &chunk {
                    sent_so_far += bytes.len() as u64;
                }
                let due = start + std::time::Duration::from_secs_f64(sent_so_far as f64 / rate);
                async move {
                    tokio::time::sleep_until(due).await;
                    chunk
                }
            }))
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert("x-repo-commit", mirror.commit_header(commit));
    let etag = {
        let mut e = Sha256::new();
        e.update(commit.as_bytes());
        e.update(path.to_string_lossy().as_bytes());
        e.update(size.to_le_bytes());
        format!("\"{}\"", &hex::encode(e.finalize())[..40])
    };
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&etag).expect("ascii etag"),
    );
    if status == StatusCode::PARTIAL_CONTENT {
        let shown = if mirror.fault == Some(Fault::WrongContentRange) {
            start + 1
        } else {
            start
        };
        let value = format!("bytes {shown}-{}/{size}", shown + len - 1);
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("ascii"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-7", 100), Some((0, 7)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=95-200", 100), Some((95, 99)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=5-4", 100), None);
        assert_eq!(parse_range("bytes=0-1,4-5", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
        assert_eq!(parse_range("bytes=0-0", 0), None);
    }

    #[test]
    fn redirects_name_the_host_the_request_came_to() {
        let loopback: IpAddr = "127.0.0.2".parse().unwrap();
        let at = |host: Option<&str>| redirect_base(host, loopback, 4242);
        assert_eq!(at(Some("127.0.0.1:8790")), "http://127.0.0.2:4242");
        assert_eq!(at(Some("localhost:8790")), "http://127.0.0.2:4242");
        assert_eq!(at(None), "http://127.0.0.2:4242");
        assert_eq!(at(Some("192.168.1.20:8790")), "http://192.168.1.20:4242");
        assert_eq!(at(Some("gpu-box.local")), "http://gpu-box.local:4242");
        assert_eq!(at(Some("[fe80::1]:8790")), "http://[fe80::1]:4242");
        // Not a host name: the loopback default, never a crafted location.
        assert_eq!(at(Some("evil/x?y")), "http://127.0.0.2:4242");
    }

    #[test]
    fn paths_cannot_escape_the_mirror() {
        assert!(valid_file("model.safetensors").is_some());
        assert!(valid_file("sub/dir/file.json").is_some());
        for bad in ["../secret", "/etc/passwd", "a/../../b", "a\\b", "", "./x"] {
            assert!(valid_file(bad).is_none(), "{bad} accepted");
        }
        for bad in ["..", ".", "", "a/b", "a%2e", "a b"] {
            assert!(
                RepoId::parse(&format!("{bad}/name")).is_err(),
                "{bad} accepted"
            );
        }
    }
}
