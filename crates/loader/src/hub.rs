//! The Hugging Face Hub (or a mirror with its URL layout) as a [`Repo`]: each file is fetched with HTTP
//! range requests, so a device downloads only the byte ranges it owns.
//!
//! Files live at `$HF_ENDPOINT/{org}/{name}/resolve/{revision}/{file}`. The revision is resolved once,
//! from the `X-Repo-Commit` header of the first answer, and every later request names that commit, so
//! one run never mixes two commits; an answer that reports another commit is refused. Redirects are
//! followed by hand so the `Authorization` header is sent to the endpoint's own host only, never to the
//! host a large file is redirected to.
//!
//! The token is asked for when a request fails for want of it, not before: `HF_TOKEN` when the user set
//! it, else the client's [`TokenProvider`] (the binary's: a hidden prompt on a terminal, a page's
//! password field), else an error saying a token is needed. The loader never touches a terminal. The
//! token lives in this process's memory only ([`Token`] redacts itself and is zeroed on drop).

use std::io::Read;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::Url;
use reqwest::blocking::{Client, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, HeaderMap, LOCATION, RANGE};
use zeroize::Zeroizing;

use crate::Error;
use daisy_wire::{ModelRef, RepoId};

use crate::source::{ByteSource, MemSource, Repo, revision_of};

/// The public Hub, used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Redirects followed for one request before it is refused as a loop.
const MAX_REDIRECTS: usize = 10;
/// Attempts for one range (the first and the retries) on 5xx answers and broken connections.
const ATTEMPTS: u32 = 4;

/// A Hugging Face token. Its `Debug` never shows it, and its memory is zeroed when dropped.
pub struct Token(Zeroizing<String>);

impl Token {
    pub fn new(secret: String) -> Token {
        Token(Zeroizing::new(secret))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Asked for a token when a request fails for want of one and `HF_TOKEN` is not set. The binary
/// decides how to ask; the loader only says for which repository and why.
pub trait TokenProvider: Send + Sync {
    /// A token for `repo`, `Ok(None)` when the user gave none; `why` says what the Hub answered.
    fn token(&self, repo: &str, why: &str) -> Result<Option<Token>, String>;
}

/// Bytes fetched so far by one client, for progress bars and the ring's progress events.
pub type ProgressFn = dyn Fn(u64) + Send + Sync;

/// A connection to one Hub endpoint: the HTTP client, the token once asked for, and the bytes fetched.
pub struct HubClient {
    endpoint: Url,
    http: Client,
    token: Mutex<Option<Token>>,
    provider: Option<Arc<dyn TokenProvider>>,
    client_id: Option<String>,
    fetched: std::sync::atomic::AtomicU64,
    progress: Mutex<Option<Arc<ProgressFn>>>,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

fn http_error(url: &str, err: impl std::fmt::Display) -> Error {
    Error::Http {
        url: url.to_string(),
        problem: err.to_string(),
    }
}

impl HubClient {
    /// A client for `$HF_ENDPOINT`, or the public Hub.
    pub fn from_env() -> Result<HubClient, Error> {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        HubClient::new(&endpoint)
    }

    pub fn new(endpoint: &str) -> Result<HubClient, Error> {
        let mut endpoint = Url::parse(endpoint)
            .map_err(|e| http_error(endpoint, format!("HF_ENDPOINT is not a URL: {e}")))?;
        if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host().is_none() {
            return Err(http_error(
                endpoint.as_str(),
                "HF_ENDPOINT must be an http(s) URL with a host",
            ));
        }
        if !endpoint.path().ends_with('/') {
            let path = format!("{}/", endpoint.path());
            endpoint.set_path(&path);
        }
        // One process-wide TLS provider; a second install (another client) is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(20))
            .timeout(Duration::from_secs(300))
            .user_agent(concat!("daisychain-infer/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| http_error(endpoint.as_str(), e))?;
        Ok(HubClient {
            endpoint,
            http,
            token: Mutex::new(None),
            provider: None,
            client_id: None,
            fetched: std::sync::atomic::AtomicU64::new(0),
            progress: Mutex::new(None),
        })
    }

    /// Name this device to the server (`X-Daisy-Client`), so a mirror can count bytes per device.
    pub fn with_client_id(mut self, id: &str) -> HubClient {
        self.client_id = Some(id.to_string());
        self
    }

    /// Ask `provider` for a token when a request needs one and `HF_TOKEN` is not set.
    pub fn with_token_provider(mut self, provider: Arc<dyn TokenProvider>) -> HubClient {
        self.provider = Some(provider);
        self
    }

    /// Called with the total bytes fetched so far, after every chunk.
    pub fn set_progress(&self, f: Arc<ProgressFn>) {
        *self.progress.lock().expect("progress lock") = Some(f);
    }

    /// Total body bytes fetched by this client.
    pub fn fetched(&self) -> u64 {
        self.fetched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drop the token: the next request that needs one asks again.
    pub fn forget_token(&self) {
        *self.token.lock().expect("token lock") = None;
    }

    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    fn count(&self, n: u64) {
        let total = self
            .fetched
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed)
            + n;
        if let Some(f) = self.progress.lock().expect("progress lock").as_ref() {
            f(total);
        }
    }

    fn same_host(&self, url: &Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host() == self.endpoint.host()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// The token, asking for it now: `HF_TOKEN`, else the token provider.
    fn obtain_token(&self, repo: &str, why: &str) -> Result<(), Error> {
        let mut slot = self.token.lock().expect("token lock");
        if slot.is_some() {
            return Ok(());
        }
        if let Some(t) = std::env::var("HF_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            *slot = Some(Token::new(t.trim().to_string()));
            return Ok(());
        }
        if let Some(provider) = &self.provider {
            let given = provider.token(repo, why).map_err(|e| Error::TokenNeeded {
                repo: repo.to_string(),
                reason: format!("{why}; could not read a token: {e}"),
            })?;
            if let Some(t) = given.filter(|t| !t.0.trim().is_empty()) {
                *slot = Some(Token::new(t.0.trim().to_string()));
                return Ok(());
            }
        }
        Err(Error::TokenNeeded {
            repo: repo.to_string(),
            reason: why.to_string(),
        })
    }

    /// One GET, following redirects by hand; `Authorization` goes to the endpoint's host only.
    fn get(&self, url: Url, range: Option<(u64, u64)>) -> Result<(Url, Response), Error> {
        let mut url = url;
        let mut seen = vec![url.clone()];
        loop {
            let mut req = self.http.get(url.clone());
            if let Some((start, end)) = range {
                req = req.header(RANGE, format!("bytes={start}-{end}"));
            }
            if let Some(id) = &self.client_id {
                req = req.header("x-daisy-client", id);
            }
            if self.same_host(&url)
                && let Some(token) = self.token.lock().expect("token lock").as_ref()
            {
                req = req.header(AUTHORIZATION, format!("Bearer {}", token.0.as_str()));
            }
            let resp = req
                .send()
                .map_err(|e| http_error(&redact(&url), without_url(e)))?;
            if !resp.status().is_redirection() {
                return Ok((url, resp));
            }
            let location = resp
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| http_error(&redact(&url), "redirect without a Location header"))?;
            let next = url
                .join(location)
                .map_err(|e| http_error(&redact(&url), format!("bad redirect Location: {e}")))?;
            if seen.contains(&next) || seen.len() > MAX_REDIRECTS {
                return Err(http_error(
                    &redact(&url),
                    format!("redirect loop after {} redirects", seen.len()),
                ));
            }
            seen.push(next.clone());
            url = next;
        }
    }
}

/// A URL for messages: the path without the query, which may carry a signature.
fn redact(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// A reqwest error's text without the URL it carries (which may hold a signed query).
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// One repository on the Hub at one revision, pinned to a commit by the first answer.
pub struct HubRepo {
    client: Arc<HubClient>,
    repo: RepoId,
    revision: String,
    commit: Arc<OnceLock<String>>,
    /// Whole small files already fetched (config, tokenizer, shard index), by name.
    small: Arc<Mutex<std::collections::HashMap<String, Vec<u8>>>>,
}

impl HubRepo {
    pub fn new(client: Arc<HubClient>, model: ModelRef) -> HubRepo {
        HubRepo {
            client,
            revision: revision_of(&model).to_string(),
            repo: model.repo,
            commit: Arc::new(OnceLock::new()),
            small: Arc::default(),
        }
    }

    /// The commit the revision resolved to (after the first request).
    pub fn commit(&self) -> Option<&str> {
        self.commit.get().map(String::as_str)
    }

    pub fn repo_id(&self) -> &RepoId {
        &self.repo
    }

    fn url(&self, file: &str) -> Result<Url, Error> {
        const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'_')
            .remove(b'.')
            .remove(b'~');
        let revision = self.commit.get().unwrap_or(&self.revision);
        let rev = percent_encoding::utf8_percent_encode(revision, SEGMENT).to_string();
        let file: Vec<String> = file
            .split('/')
            .map(|s| percent_encoding::utf8_percent_encode(s, SEGMENT).to_string())
            .collect();
        let path = format!("{}/resolve/{rev}/{}", self.repo, file.join("/"));
        self.client
            .endpoint
            .join(&path)
            .map_err(|e| http_error(&path, e))
    }

    /// Check the answer's `X-Repo-Commit` against the pinned commit, pinning it on the first answer.
    fn pin(&self, url: &Url, headers: &HeaderMap) -> Result<(), Error> {
        let Some(commit) = header_str(headers, "x-repo-commit") else {
            return Ok(());
        };
        let pinned = self.commit.get_or_init(|| commit.to_string());
        if pinned != commit {
            return Err(Error::CommitChanged {
                repo: self.repo.to_string(),
                pinned: pinned.clone(),
                now: commit.to_string(),
                url: redact(url),
            });
        }
        Ok(())
    }

    /// GET `file` (a whole file, or one inclusive byte range), asking for a token on 401/403 once.
    /// `Ok(None)` when the file does not exist in the repository.
    fn request(
        &self,
        file: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(Url, Response)>, Error> {
        let mut asked = false;
        loop {
            let (url, resp) = self.client.get(self.url(file)?, range)?;
            let status = resp.status();
            let code = header_str(resp.headers(), "x-error-code")
                .unwrap_or("")
                .to_string();
            let message = header_str(resp.headers(), "x-error-message")
                .unwrap_or("")
                .to_string();
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                let had_token = self.client.token.lock().expect("token lock").is_some();
                if asked || had_token {
                    let detail = if message.is_empty() {
                        code.clone()
                    } else {
                        message.clone()
                    };
                    return Err(Error::TokenRefused {
                        repo: self.repo.to_string(),
                        status: status.as_u16(),
                        detail,
                    });
                }
                let why = match code.as_str() {
                    "RepoNotFound" => format!(
                        "the Hub answered {status} RepoNotFound for {}: the repository does not exist, or it is private and a token is needed",
                        self.repo
                    ),
                    "GatedRepo" => format!(
                        "{} is a gated repository: a Hugging Face token is needed ({message})",
                        self.repo
                    ),
                    _ => format!(
                        "the Hub answered {status} for {}: a Hugging Face token is needed",
                        self.repo
                    ),
                };
                self.client.obtain_token(self.repo.as_str(), &why)?;
                asked = true;
                continue;
            }
            if status == StatusCode::NOT_FOUND {
                if code == "RevisionNotFound" {
                    return Err(Error::NotFound(format!(
                        "{}: revision `{}` does not exist",
                        self.repo, self.revision
                    )));
                }
                if code == "RepoNotFound" {
                    return Err(Error::NotFound(format!(
                        "repository {} does not exist on {}",
                        self.repo, self.client.endpoint
                    )));
                }
                return Ok(None);
            }
            self.pin(&url, resp.headers())?;
            return Ok(Some((url, resp)));
        }
    }
}

/// Read exactly `want` bytes of body, counting them as they come; `Err` keeps what arrived.
fn read_body(
    client: &HubClient,
    resp: &mut Response,
    want: u64,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut buf = vec![0u8; 256 * 1024];
    while (out.len() as u64) < want {
        let n = resp
            .read(&mut buf)
            .map_err(|e| format!("short body: {} of {want} bytes, then {e}", out.len()))?;
        if n == 0 {
            return Err(format!("short body: {} of {want} bytes", out.len()));
        }
        let take = n.min((want - out.len() as u64) as usize);
        out.extend_from_slice(&buf[..take]);
        client.count(take as u64);
    }
    Ok(())
}

impl Repo for HubRepo {
    fn open(&self, name: &str) -> Result<Option<Arc<dyn ByteSource>>, Error> {
        if name
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(Error::NotFound(format!("refusing file name `{name}`")));
        }
        let weights = name.ends_with(".safetensors") || name.ends_with(".gguf");
        if weights {
            // No request yet: the first range read learns the size from `Content-Range`.
            return Ok(Some(Arc::new(HttpSource {
                repo: self.share(),
                file: name.to_string(),
                size: Arc::default(),
                first: Arc::default(),
                prefetch: Arc::default(),
            })));
        }
        if let Some(cached) = self.small.lock().expect("cache lock").get(name) {
            return Ok(Some(Arc::new(MemSource::new(name, cached.clone()))));
        }
        let (url, body) = match self.fetch_whole(name)? {
            Some(found) => found,
            None => return Ok(None),
        };
        self.small
            .lock()
            .expect("cache lock")
            .insert(name.to_string(), body.clone());
        Ok(Some(Arc::new(MemSource::new(&redact(&url), body))))
    }

    fn describe(&self) -> String {
        format!(
            "{}{}@{}",
            self.client.endpoint,
            self.repo,
            self.commit().unwrap_or(&self.revision)
        )
    }
}

/// A transport failure worth another attempt (the connection broke, or was closed under us).
fn transient(e: &Error) -> bool {
    matches!(e, Error::Http { problem, .. }
        if problem.contains("error sending request") || problem.contains("connection"))
}

impl HubRepo {
    /// A whole small file, retried on 5xx answers, broken connections and short bodies.
    fn fetch_whole(&self, name: &str) -> Result<Option<(Url, Vec<u8>)>, Error> {
        with_retries(|| {
            let (url, mut resp) = match self.request(name, None) {
                Ok(Some(found)) => found,
                Ok(None) => return Ok(None),
                Err(e) if transient(&e) => return Err(Attempt::Retry(e)),
                Err(e) => return Err(Attempt::Fatal(e)),
            };
            if resp.status().is_server_error() {
                return Err(Attempt::Retry(http_error(
                    &redact(&url),
                    format!("server error {}", resp.status()),
                )));
            }
            check_status(&url, &resp, None).map_err(Attempt::Fatal)?;
            let mut body = Vec::new();
            match resp.content_length() {
                Some(len) => read_body(&self.client, &mut resp, len, &mut body),
                None => resp
                    .read_to_end(&mut body)
                    .map(|n| self.client.count(n as u64))
                    .map_err(|e| format!("short body: {} bytes, then {e}", body.len())),
            }
            .map_err(|p| Attempt::Short(http_error(&redact(&url), p)))?;
            Ok(Some((url, body)))
        })
    }

    /// A handle on the same repository and pinned commit, for the file sources it hands out.
    fn share(&self) -> Arc<HubRepo> {
        Arc::new(HubRepo {
            client: self.client.clone(),
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            commit: self.commit.clone(),
            small: self.small.clone(),
        })
    }

    /// Resolve the revision to a commit now (fetching `config.json`, which is kept for `open`).
    pub fn resolve(&self) -> Result<String, Error> {
        if self.open("config.json")?.is_none() {
            return Err(Error::NotFound(format!(
                "{}: no config.json",
                self.describe()
            )));
        }
        Ok(self.commit().unwrap_or(&self.revision).to_string())
    }
}

fn check_status(url: &Url, resp: &Response, range: Option<(u64, u64)>) -> Result<(), Error> {
    let status = resp.status();
    match range {
        None if status == StatusCode::OK => Ok(()),
        Some(_) if status == StatusCode::PARTIAL_CONTENT => Ok(()),
        Some(_) if status == StatusCode::OK => Err(http_error(
            &redact(url),
            "the server ignored the Range request and answered 200 with the whole file",
        )),
        _ => {
            let code = header_str(resp.headers(), "x-error-code").unwrap_or("");
            Err(http_error(
                &redact(url),
                format!("unexpected answer {status} {code}").trim(),
            ))
        }
    }
}

/// Parse `Content-Range: bytes a-b/size`.
fn content_range(headers: &HeaderMap) -> Option<(u64, u64, u64)> {
    let v = headers.get(CONTENT_RANGE)?.to_str().ok()?;
    let rest = v.strip_prefix("bytes ")?;
    let (span, size) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, size.parse().ok()?))
}

/// One remote file read by range requests.
#[derive(Clone)]
struct HttpSource {
    repo: Arc<HubRepo>,
    file: String,
    size: Arc<OnceLock<u64>>,
    /// The first 8 bytes (a safetensors header length), fetched by the request that learns the size.
    first: Arc<OnceLock<Vec<u8>>>,
    prefetch: Arc<Prefetch>,
}

/// Ranges announced by [`ByteSource::prefetch`], fetched in order by one background thread that keeps
/// one range in flight while the reader widens and quantizes the previous one.
#[derive(Default)]
struct Prefetch {
    state: Mutex<PrefetchState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct PrefetchState {
    blocks: Vec<Block>,
    /// Readers waiting for a block not fetched yet: the fetcher must not hold back for them.
    waiting: usize,
}

struct Block {
    offset: u64,
    len: u64,
    data: BlockData,
    consumed: u64,
}

enum BlockData {
    Pending,
    Ready(Arc<Vec<u8>>),
    Failed(String),
    Dropped,
}

/// Largest coalesced range: a bound on what one request (and the memory it fills) may hold.
const MAX_BLOCK: u64 = 8 << 20;

/// Merge `(offset, len)` ranges that touch into blocks of at most [`MAX_BLOCK`], in the order
/// given — the order they will be read. (File order would fetch far ahead whenever the two differ:
/// safetensors sorts layer 10 before layer 2, so a stage read layer by layer would hold most of its
/// fetched bytes at once.)
fn coalesce(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut blocks: Vec<(u64, u64)> = Vec::new();
    for &(offset, len) in ranges.iter().filter(|r| r.1 > 0) {
        match blocks.last_mut() {
            Some((o, l)) if *o + *l == offset && *l + len <= MAX_BLOCK => *l += len,
            _ => blocks.push((offset, len)),
        }
    }
    blocks
}

impl HttpSource {
    /// One attempt at bytes `[start, end]` appended to `out`; `Retry` for what may pass next time.
    fn attempt(&self, start: u64, end: u64, out: &mut Vec<u8>) -> Result<(), Attempt> {
        let (url, mut resp) = match self.repo.request(&self.file, Some((start, end))) {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err(Attempt::Fatal(Error::NotFound(format!(
                    "{}: no {}",
                    self.repo.describe(),
                    self.file
                ))));
            }
            Err(e) if transient(&e) => return Err(Attempt::Retry(e)),
            Err(e) => return Err(Attempt::Fatal(e)),
        };
        if resp.status() == StatusCode::RANGE_NOT_SATISFIABLE {
            let size = header_str(resp.headers(), "content-range")
                .and_then(|v| v.strip_prefix("bytes */"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return Err(Attempt::Fatal(Error::OutOfRange {
                what: self.describe(),
                offset: start,
                len: end - start + 1,
                size,
            }));
        }
        if resp.status().is_server_error() {
            return Err(Attempt::Retry(http_error(
                &redact(&url),
                format!("server error {}", resp.status()),
            )));
        }
        check_status(&url, &resp, Some((start, end))).map_err(Attempt::Fatal)?;
        match content_range(resp.headers()) {
            Some((a, b, total))
                if a == start && b == end && *self.size.get_or_init(|| total) == total => {}
            Some((a, b, total)) => {
                return Err(Attempt::Fatal(http_error(
                    &redact(&url),
                    format!("asked for bytes {start}-{end}, Content-Range says {a}-{b}/{total}"),
                )));
            }
            None => {
                return Err(Attempt::Fatal(http_error(
                    &redact(&url),
                    "206 answer without a valid Content-Range",
                )));
            }
        }
        read_body(&self.repo.client, &mut resp, end - start + 1, out)
            .map_err(|p| Attempt::Short(http_error(&redact(&url), p)))
    }
}

/// How one attempt at a request failed.
enum Attempt {
    /// May pass next time (a dropped connection, a server error).
    Retry(Error),
    /// The body broke off: retried, and named in the final error over a later `Retry`, because it
    /// says more than the stale connection a retry then met.
    Short(Error),
    /// Retrying cannot help.
    Fatal(Error),
}

/// Run `attempt` up to [`ATTEMPTS`] times with a growing pause between tries.
fn with_retries<T>(mut attempt: impl FnMut() -> Result<T, Attempt>) -> Result<T, Error> {
    let (mut last, mut short) = (None, None);
    for i in 0..ATTEMPTS {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(200 << i));
        }
        match attempt() {
            Ok(v) => return Ok(v),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Short(e)) => short = Some(e),
            Err(Attempt::Retry(e)) => last = Some(e),
        }
    }
    Err(match short.or(last).expect("at least one attempt") {
        Error::Http { url, problem } => Error::Http {
            url,
            problem: format!("{problem} (after {ATTEMPTS} attempts)"),
        },
        other => other,
    })
}

impl HttpSource {
    /// Bytes `[offset, offset + len)` from a prefetched block, waiting for it; `None` when no
    /// announced block holds the whole range.
    fn read_prefetched(&self, offset: u64, len: u64) -> Option<Result<Vec<u8>, Error>> {
        let mut state = self.prefetch.state.lock().expect("prefetch lock");
        let i = state.blocks.iter().position(|b| {
            b.offset <= offset
                && offset + len <= b.offset + b.len
                && !matches!(b.data, BlockData::Dropped)
        })?;
        let mut counted = false;
        loop {
            match &state.blocks[i].data {
                BlockData::Pending => {
                    if !counted {
                        state.waiting += 1;
                        counted = true;
                        self.prefetch.changed.notify_all();
                    }
                    state = self.prefetch.changed.wait(state).expect("prefetch lock");
                }
                BlockData::Failed(problem) => {
                    let problem = problem.clone();
                    if counted {
                        state.waiting -= 1;
                    }
                    return Some(Err(Error::Http {
                        url: self.describe(),
                        problem,
                    }));
                }
                BlockData::Dropped => unreachable!("a block is dropped only once fully read"),
                BlockData::Ready(data) => {
                    let data = data.clone();
                    if counted {
                        state.waiting -= 1;
                    }
                    let block = &mut state.blocks[i];
                    let start = (offset - block.offset) as usize;
                    let out = data[start..start + len as usize].to_vec();
                    block.consumed += len;
                    if block.consumed >= block.len {
                        block.data = BlockData::Dropped;
                    }
                    self.prefetch.changed.notify_all();
                    return Some(Ok(out));
                }
            }
        }
    }

    /// The fetcher: each block in order, holding back while two fetched blocks wait to be read and
    /// no reader waits for a later one.
    fn fetch_blocks(&self) {
        let count = self
            .prefetch
            .state
            .lock()
            .expect("prefetch lock")
            .blocks
            .len();
        for i in 0..count {
            let (offset, len) = {
                let mut state = self.prefetch.state.lock().expect("prefetch lock");
                loop {
                    let unread = state
                        .blocks
                        .iter()
                        .filter(|b| matches!(b.data, BlockData::Ready(_)))
                        .count();
                    if unread < 2 || state.waiting > 0 {
                        break;
                    }
                    state = self.prefetch.changed.wait(state).expect("prefetch lock");
                }
                (state.blocks[i].offset, state.blocks[i].len)
            };
            let result = self.fetch_range(offset, len as usize);
            let mut state = self.prefetch.state.lock().expect("prefetch lock");
            state.blocks[i].data = match result {
                Ok(bytes) => BlockData::Ready(Arc::new(bytes)),
                Err(e) => BlockData::Failed(e.to_string()),
            };
            self.prefetch.changed.notify_all();
        }
    }

    /// Bytes `[offset, offset + len)` with retries, resuming after what already arrived.
    fn fetch_range(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let end = offset + len as u64;
        let mut out = Vec::with_capacity(len);
        if len == 0 {
            return Ok(out);
        }
        with_retries(|| {
            let start = offset + out.len() as u64;
            self.attempt(start, end - 1, &mut out)
        })?;
        Ok(out)
    }
}

impl ByteSource for HttpSource {
    fn prefetch(&self, ranges: &[(u64, u64)]) {
        let blocks = coalesce(ranges);
        if blocks.is_empty() {
            return;
        }
        {
            let mut state = self.prefetch.state.lock().expect("prefetch lock");
            if !state.blocks.is_empty() {
                return; // one plan per source; later reads go straight to the server
            }
            state.blocks = blocks
                .into_iter()
                .map(|(offset, len)| Block {
                    offset,
                    len,
                    data: BlockData::Pending,
                    consumed: 0,
                })
                .collect();
        }
        let me = self.clone();
        std::thread::spawn(move || me.fetch_blocks());
    }

    fn len(&self) -> Result<u64, Error> {
        if let Some(size) = self.size.get() {
            return Ok(*size);
        }
        // The first 8 bytes teach the size (and are what a reader asks for next).
        let first = self.fetch_range(0, 8)?;
        let _ = self.first.set(first);
        Ok(*self.size.get().expect("learned from Content-Range"))
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let out_of_range = |size| Error::OutOfRange {
            what: self.describe(),
            offset,
            len: len as u64,
            size,
        };
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| out_of_range(u64::MAX))?;
        if let Some(&size) = self.size.get()
            && end > size
        {
            return Err(out_of_range(size));
        }
        if let Some(first) = self.first.get()
            && end <= first.len() as u64
        {
            return Ok(first[offset as usize..end as usize].to_vec());
        }
        if let Some(result) = self.read_prefetched(offset, len as u64) {
            return result;
        }
        self.fetch_range(offset, len)
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.repo.describe(), self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_never_shows_in_debug() {
        let t = Token::new("hf_secret_value".to_string());
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn revision_and_file_are_percent_encoded() {
        let client = Arc::new(HubClient::new("http://127.0.0.1:9/").unwrap());
        let repo = HubRepo::new(client, ModelRef::parse("org/name@refs/pr/1").unwrap());
        let url = repo.url("sub dir/model.safetensors").unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:9/org/name/resolve/refs%2Fpr%2F1/sub%20dir/model.safetensors"
        );
    }

    #[test]
    fn touching_ranges_coalesce_in_read_order() {
        assert_eq!(
            coalesce(&[(0, 100), (100, 50), (150, 0), (200, 10)]),
            vec![(0, 150), (200, 10)]
        );
        // Read later, fetched later: the order given is kept.
        assert_eq!(
            coalesce(&[(200, 10), (100, 50), (0, 100)]),
            vec![(200, 10), (100, 50), (0, 100)]
        );
        assert_eq!(
            coalesce(&[(0, MAX_BLOCK), (MAX_BLOCK, 1)]),
            vec![(0, MAX_BLOCK), (MAX_BLOCK, 1)]
        );
    }

    #[test]
    fn content_range_is_parsed_strictly() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_RANGE, "bytes 8-15/100".parse().unwrap());
        assert_eq!(content_range(&h), Some((8, 15, 100)));
        h.insert(CONTENT_RANGE, "bytes */100".parse().unwrap());
        assert_eq!(content_range(&h), None);
    }
}
