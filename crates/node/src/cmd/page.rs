//! The head's page: one HTML file (its CSS and script inline, embedded in the binary, nothing fetched
//! from elsewhere) at `/`, and the ring's state as JSON at `/api/ring`, which the page polls. The
//! page generates through the head's own OpenAI API (`/v1/chat/completions`, streamed).

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tokio::sync::mpsc;

use super::job::Job;
use super::view::SharedView;

const PAGE: &str = include_str!("page.html");

#[derive(Clone)]
struct PageState {
    view: SharedView,
    jobs: mpsc::Sender<Option<Job>>,
}

/// `/` and `/api/ring`.
pub(crate) fn router(view: SharedView, jobs: mpsc::Sender<Option<Job>>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/ring", get(ring))
        .with_state(PageState { view, jobs })
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
