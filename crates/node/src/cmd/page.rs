//! The head's page: one HTML file (its CSS and script inline, embedded in the binary, nothing fetched
//! from elsewhere) at `/`, and the ring's state as JSON at `/api/ring`, which the page polls. The
//! page generates through the head's own OpenAI API (`/v1/chat/completions`, streamed).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use daisy_loader::hub::HubClient;
use tokio::sync::mpsc;

use super::job::Job;
use super::view::SharedView;

const PAGE: &str = include_str!("page.html");

#[derive(Clone)]
struct PageState {
    view: SharedView,
    jobs: mpsc::Sender<Option<Job>>,
    token: Arc<PageToken>,
    hub: Arc<HubClient>,
}

/// `/`, `/api/ring`, and `/api/token` (POST gives the head a token, DELETE forgets it).
pub(crate) fn router(
    view: SharedView,
    jobs: mpsc::Sender<Option<Job>>,
    token: Arc<PageToken>,
    hub: Arc<HubClient>,
) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/ring", get(ring))
        .route("/api/token", post(give_token).delete(forget_token))
        .layer(DefaultBodyLimit::max(64 << 10))
        .with_state(PageState {
            view,
            jobs,
            token,
            hub,
        })
}

/// `{"token": "…"}` in a POST body (never a URL): the head keeps it in memory for its own requests.
async fn give_token(State(s): State<PageState>, body: Bytes) -> Response {
    let token = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("token")
                .and_then(|t| t.as_str())
                .map(str::trim)
                .map(str::to_string)
        })
        .filter(|t| !t.is_empty())
        .map(zeroize::Zeroizing::new);
    match token {
        Some(t) => {
            s.token.give(t);
            StatusCode::NO_CONTENT.into_response()
        }
        None => (
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"token\": \"…\"}",
        )
            .into_response(),
    }
}

/// Forget token: the hub client drops it; the next request that needs one asks again.
async fn forget_token(State(s): State<PageState>) -> Response {
    s.hub.forget_token();
    *s.token.given.lock().expect("token lock") = None;
    s.view.update(|v| v.token_held = false);
    eprintln!("head: the token was forgotten (the page's Forget token)");
    StatusCode::NO_CONTENT.into_response()
}

async fn page() -> Response {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        Html(PAGE),
    )
        .into_response()
}

async fn ring(State(s): State<PageState>) -> Response {
    let mut view = s.view.snapshot();
    view.queued = s.jobs.max_capacity() - s.jobs.capacity();
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        serde_json::to_string(&view).unwrap_or_else(|_| "{}".into()),
    )
        .into_response()
}

/// The head's Hugging Face token, given on the page when a request of the head's own needs one:
/// held in this process's memory only (zeroed when dropped), never logged, stored or sent to a
/// member. The hub client asks here after `HF_TOKEN`; the asking thread waits until the page gives
/// one.
pub(crate) struct PageToken {
    view: SharedView,
    /// The head's page, named in the line that says a token is needed.
    page_url: std::sync::Mutex<String>,
    /// The page is served: a request may wait for it (before, none is given).
    enabled: std::sync::atomic::AtomicBool,
    given: std::sync::Mutex<Option<zeroize::Zeroizing<String>>>,
    arrived: std::sync::Condvar,
}

impl PageToken {
    pub(crate) fn new(view: SharedView) -> Self {
        Self {
            view,
            page_url: std::sync::Mutex::new(String::new()),
            enabled: std::sync::atomic::AtomicBool::new(false),
            given: std::sync::Mutex::new(None),
            arrived: std::sync::Condvar::new(),
        }
    }

    pub(crate) fn set_page(&self, url: &str) {
        *self.page_url.lock().expect("page lock") = url.to_string();
    }

    /// The page is up: from now on a request that needs a token waits for one given there.
    pub(crate) fn enable(&self) {
        self.enabled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn give(&self, token: zeroize::Zeroizing<String>) {
        *self.given.lock().expect("token lock") = Some(token);
        self.arrived.notify_all();
    }
}

impl daisy_loader::hub::TokenProvider for PageToken {
    fn token(&self, repo: &str, why: &str) -> Result<Option<daisy_loader::hub::Token>, String> {
        if !self.enabled.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(None);
        }
        eprintln!(
            "head: {why}; give a Hugging Face token for {repo} on the head's page ({}) or start \
             the head with HF_TOKEN",
            self.page_url.lock().expect("page lock")
        );
        self.view.update(|v| {
            v.token_request = Some(TokenRequest {
                repo: repo.to_string(),
                why: why.to_string(),
            });
        });
        let mut given = self.given.lock().expect("token lock");
        while given.is_none() {
            given = self.arrived.wait(given).expect("token lock");
        }
        let token = given.take().expect("a token");
        self.view.update(|v| {
            v.token_request = None;
            v.token_held = true;
        });
        eprintln!("head: a token was given on the page; it is kept in memory only");
        Ok(Some(daisy_loader::hub::Token::new(token.to_string())))
    }
}

/// A token the head asks for (shown on the page with a password field).
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct TokenRequest {
    pub(crate) repo: String,
    pub(crate) why: String,
}
