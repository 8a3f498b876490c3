//! The head's OpenAI-compatible API: `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, as OpenAI documents them, streamed as server-sent events on request.
//! Requests become turns in the head's one queue (behind the turn that owns the ring); a client that
//! goes away cancels its turn between two tokens. Errors take OpenAI's shape. The non-standard
//! `verify: true` returns Verify's result with the answer (a `verify` field, and the header
//! `x-daisy-verify` on a reply that is not streamed); `path` (`auto`, `cached`, `full-window`) and
//! `lookahead` (true or false) override the head's own choices for one request.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use daisy_engine::{Encoder, Prompt, StopScan, TurnOptions};
use daisy_model::{ForwardPath, Sampling};
use daisy_tokenizer::Message as ChatMessage;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use zeroize::Zeroizing;

use super::job::{Finished, Job, Sink, Streamed};

/// The largest request body read (a larger one is answered 413 once it is drained).
pub(crate) const MAX_BODY_BYTES: usize = 2 << 20;
/// A body up to this size is read to its end before the 413, so the client sees the answer rather
/// than a reset connection; a larger one is cut off.
const DRAIN_BYTES: usize = 64 << 20;
/// Seconds a client is told to wait while no ring is ready, or while the queue is full.
const RETRY_AFTER_S: u64 = 5;
/// The default `max_tokens` of `/v1/completions`, as OpenAI's.
const COMPLETIONS_MAX_TOKENS: usize = 16;

/// What the API's handlers share.
pub(crate) struct Api {
    /// The model's id, as the user named it on the command line.
    pub(crate) model_id: String,
    /// Set once the head has opened the model.
    pub(crate) model: std::sync::OnceLock<ApiModel>,
    /// The forward path of a request that does not name one (the head's `--path`).
    pub(crate) path: ForwardPath,
    /// The head's `--lookahead` (drafts per lap; 0 is off), a request's `lookahead` overrides it.
    pub(crate) lookahead: usize,
    pub(crate) jobs: mpsc::Sender<Option<Job>>,
    /// A ring is formed and takes turns.
    pub(crate) ready: Arc<AtomicBool>,
    /// SHA-256 of the key `Authorization: Bearer` must carry, when one is set.
    pub(crate) key_sha256: Option<[u8; 32]>,
}

/// What the API knows of the opened model.
pub(crate) struct ApiModel {
    pub(crate) encoder: Arc<Encoder>,
    /// The model's context: prompt and answer together.
    pub(crate) context: usize,
    /// Token ids are below this.
    pub(crate) vocab_size: usize,
    /// The checkpoint's fingerprint, reported as `system_fingerprint`.
    pub(crate) fingerprint: String,
}

impl Api {
    pub(crate) fn key_hash(key: &Zeroizing<String>) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }
}

/// The API's routes (`/v1/...`), with the key check when a key is set.
pub(crate) fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/{*rest}", axum::routing::any(unknown_route))
        .layer(middleware::from_fn_with_state(api.clone(), authorize))
        .with_state(api)
}

/// An error in OpenAI's shape.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
    code: Option<&'static str>,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn retry_after(mut self, s: u64) -> Self {
        self.retry_after = Some(s);
        self
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &self.body());
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn authorize(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if let Some(expected) = &api.key_sha256 {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|k| <[u8; 32]>::from(Sha256::digest(k.trim().as_bytes())));
        if given.as_ref() != Some(expected) {
            let why = if given.is_none() {
                "No API key was given: send `Authorization: Bearer KEY` (the head's --api-key)."
            } else {
                "The API key is not the head's (--api-key)."
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", why)
                .code("invalid_api_key")
                .into_response();
        }
    }
    next.run(request).await
}

async fn unknown_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "Unknown route: the head serves /v1/models, /v1/chat/completions and /v1/completions.",
    )
    .code("unknown_url")
}

fn model_object(api: &Api) -> Value {
    json!({"id": api.model_id, "object": "model", "created": 0, "owned_by": "daisychain-infer"})
}

async fn models(State(api): State<Arc<Api>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_object(&api)]}),
    )
}

async fn model(State(api): State<Arc<Api>>, Path(id): Path<String>) -> Response {
    if id == api.model_id {
        json_response(StatusCode::OK, &model_object(&api))
    } else {
        unknown_model(&id).into_response()
    }
}

fn unknown_model(id: &str) -> ApiError {
    ApiError {
        param: Some("model"),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{id}` does not exist: this head serves one model."),
        )
    }
    .code("model_not_found")
}

/// The request body, read up to [`MAX_BODY_BYTES`] and parsed as one JSON object.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Map<String, Value>, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is over {MAX_BODY_BYTES} bytes."),
        )
        .code("request_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > DRAIN_BYTES) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk: Bytes = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("The request body could not be read: {e}"),
            )
        })?;
        seen += chunk.len();
        if seen > DRAIN_BYTES {
            return Err(too_large());
        }
        if seen <= MAX_BODY_BYTES {
            bytes.extend_from_slice(&chunk);
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(too_large());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "The request body must be a JSON object.",
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("The request body is not valid JSON: {e}."),
        )),
    }
}

/// Typed reads of a request's fields: `null` is the same as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn number(&self, name: &'static str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be a number."))),
        }
    }

    fn integer(&self, name: &'static str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be an integer."))),
        }
    }

    fn boolean(&self, name: &'static str) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be true or false."))),
        }
    }

    fn string(&self, name: &'static str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| ApiError::invalid(name, format!("`{name}` must be a string."))),
        }
    }
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
}

/// A request, checked: everything the turn and the reply need.
struct Checked {
    prompt: PromptOf,
    max_tokens: Option<usize>,
    opts: TurnOptions,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    verify: bool,
}

enum PromptOf {
    Text(Prompt),
    Ids(Vec<u32>),
}

fn check(endpoint: Endpoint, api: &Api, body: &Map<String, Value>) -> Result<Checked, ApiError> {
    let f = Fields(body);
    let model = f
        .string("model")?
        .ok_or_else(|| ApiError::invalid("model", "`model` is required."))?;
    if model != api.model_id {
        return Err(unknown_model(model));
    }
    if let Some(n) = f.integer("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!("`n` is {n}: this head generates one choice per request (n = 1)."),
        ));
    }
    // What the ring cannot do is refused by name rather than ignored.
    let unsupported = |param: &'static str, why: &str| {
        Err(ApiError::invalid(
            param,
            format!("`{param}` is not supported by this head{why}."),
        ))
    };
    for param in ["logprobs", "echo"] {
        if !matches!(f.get(param), None | Some(Value::Bool(false))) {
            return unsupported(param, "");
        }
    }
    for param in ["frequency_penalty", "presence_penalty"] {
        if f.number(param)?.is_some_and(|v| v != 0.0) {
            return unsupported(param, " (only 0)");
        }
    }
    for param in ["tools", "functions", "logit_bias", "suffix"] {
        let empty = match f.get(param) {
            None => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if !empty {
            return unsupported(param, "");
        }
    }
    if f.integer("best_of")?.is_some_and(|b| b != 1) {
        return unsupported("best_of", " (only 1)");
    }

    let prompt = match endpoint {
        Endpoint::Chat => PromptOf::Text(Prompt::Chat(messages(&f)?)),
        Endpoint::Completions => completion_prompt(&f)?,
    };
    let limit = |name: &'static str| -> Result<Option<usize>, ApiError> {
        match f.integer(name)? {
            None => Ok(None),
            Some(n) if n >= 1 => Ok(Some(n as usize)),
            Some(n) => Err(ApiError::invalid(
                name,
                format!("`{name}` is {n}: it must be at least 1."),
            )),
        }
    };
    let max_tokens = match endpoint {
        Endpoint::Chat => limit("max_completion_tokens")?.or(limit("max_tokens")?),
        Endpoint::Completions => Some(limit("max_tokens")?.unwrap_or(COMPLETIONS_MAX_TOKENS)),
    };
    let temperature = f.number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("`temperature` is {temperature}: it must be between 0 and 2."),
        ));
    }
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("`top_p` is {top_p}: it must be above 0 and at most 1."),
        ));
    }
    let seed = match f.integer("seed")? {
        Some(s) => s as u64,
        None => rand::random(),
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid("stop", "`stop` must be a string or strings."))?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "`stop` must be a string or strings.",
            ));
        }
    };
    StopScan::new(stop.clone()).map_err(|e| ApiError::invalid("stop", format!("`stop`: {e}.")))?;
    let json_output = match f.get("response_format") {
        None => false,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => false,
            Some("json_object") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!(
                        "`response_format` type `{other}` is not supported: `text` or \
                         `json_object`."
                    ),
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    "response_format",
                    "`response_format` must be an object with a `type`.",
                ));
            }
        },
    };
    let path = match f.string("path")? {
        None | Some("auto") => api.path,
        Some("cached") => ForwardPath::Cached,
        Some("full-window") => ForwardPath::FullWindow,
        Some(other) => {
            return Err(ApiError::invalid(
                "path",
                format!("`path` is `{other}`: `auto`, `cached` or `full-window`."),
            ));
        }
    };
    let stream = f.boolean("stream")?;
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).boolean("include_usage")?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object.",
            ));
        }
    };
    Ok(Checked {
        prompt,
        max_tokens,
        opts: TurnOptions {
            max_new_tokens: 0,
            ignore_eos: false,
            sampling: Sampling {
                temperature: temperature as f32,
                seed,
                top_p: top_p as f32,
            },
            path,
            json_output,
            lookahead: match f.get("lookahead") {
                None => api.lookahead,
                Some(_) if f.boolean("lookahead")? => daisy_engine::LOOKAHEAD_DRAFTS,
                Some(_) => 0,
            },
        },
        stop,
        stream,
        include_usage,
        verify: f.boolean("verify")?,
    })
}

/// `messages`: each a role and its text (a string, or text parts).
fn messages(f: &Fields<'_>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(items)) = f.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is required: an array of {role, content}.",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty."));
    }
    let mut out = Vec::new();
    for (i, m) in items.iter().enumerate() {
        let bad = |why: &str| ApiError::invalid("messages", format!("`messages[{i}]`: {why}."));
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`role` must be a string"))?;
        let role = match role {
            "system" | "user" | "assistant" => role,
            "developer" => "system",
            other => {
                return Err(bad(&format!(
                    "role `{other}` is not supported (system, developer, user or assistant)"
                )));
            }
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => return Err(bad("only text content parts are supported")),
                    }
                }
                text
            }
            Some(_) => return Err(bad("`content` must be a string or text parts")),
        };
        out.push(ChatMessage {
            role: role.into(),
            content,
        });
    }
    Ok(out)
}

/// `prompt` of `/v1/completions`: a string, one string in an array, or token ids.
fn completion_prompt(f: &Fields<'_>) -> Result<PromptOf, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, or token ids (one prompt per request).",
        )
    };
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(bad)
    };
    match f.get("prompt") {
        None => Err(ApiError::invalid("prompt", "`prompt` is required.")),
        Some(Value::String(s)) => Ok(PromptOf::Text(Prompt::Raw(s.clone()))),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(PromptOf::Text(Prompt::Raw(s.clone()))),
            [Value::Array(inner)] => Ok(PromptOf::Ids(ids(inner)?)),
            items if !items.is_empty() && items.iter().all(Value::is_number) => {
                Ok(PromptOf::Ids(ids(items)?))
            }
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

async fn chat_completions(State(api): State<Arc<Api>>, headers: HeaderMap, body: Body) -> Response {
    respond(Endpoint::Chat, api, headers, body).await
}

async fn completions(State(api): State<Arc<Api>>, headers: HeaderMap, body: Body) -> Response {
    respond(Endpoint::Completions, api, headers, body).await
}

async fn respond(endpoint: Endpoint, api: Arc<Api>, headers: HeaderMap, body: Body) -> Response {
    match start(endpoint, &api, &headers, body).await {
        Ok((checked, prompt_tokens, rx)) => {
            let fingerprint = api
                .model
                .get()
                .map(|m| m.fingerprint.clone())
                .unwrap_or_default();
            let reply = Reply {
                endpoint,
                id: reply_id(endpoint),
                created: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                model: api.model_id.clone(),
                fingerprint,
                include_usage: checked.include_usage,
                verify: checked.verify,
            };
            if checked.stream {
                stream_reply(reply, prompt_tokens, rx).into_response()
            } else {
                whole_reply(reply, rx).await
            }
        }
        Err(e) => e.into_response(),
    }
}

/// Check the request, tokenize its prompt and queue its turn.
async fn start(
    endpoint: Endpoint,
    api: &Arc<Api>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Checked, usize, mpsc::UnboundedReceiver<Streamed>), ApiError> {
    let body = read_body(headers, body).await?;
    let mut checked = check(endpoint, api, &body)?;
    let Some(model) = api.model.get() else {
        return Err(not_ready("The head is still opening its model."));
    };
    let ids = match std::mem::replace(&mut checked.prompt, PromptOf::Ids(Vec::new())) {
        PromptOf::Ids(ids) => ids,
        PromptOf::Text(prompt) => {
            let encoded = {
                let encoder = model.encoder.clone();
                tokio::task::spawn_blocking(move || encoder.encode(&prompt)).await
            };
            match encoded {
                Ok(Ok(ids)) => ids,
                Ok(Err(e)) => {
                    return Err(ApiError::invalid(
                        if endpoint == Endpoint::Chat {
                            "messages"
                        } else {
                            "prompt"
                        },
                        format!("The prompt could not be encoded: {e}."),
                    ));
                }
                Err(e) => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("The prompt's tokenizer stopped: {e}."),
                    ));
                }
            }
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "The prompt has no tokens."));
    }
    if let Some(id) = ids.iter().find(|&&id| id as usize >= model.vocab_size) {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "Token id {id} is not in the vocabulary ({} ids).",
                model.vocab_size
            ),
        ));
    }
    if ids.len() >= model.context {
        return Err(ApiError {
            param: Some(if endpoint == Endpoint::Chat {
                "messages"
            } else {
                "prompt"
            }),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "The prompt is {} tokens; this model's context is {} tokens, prompt and \
                     answer together.",
                    ids.len(),
                    model.context
                ),
            )
        }
        .code("context_length_exceeded"));
    }
    // The answer fits in what the context leaves.
    let room = model.context - ids.len();
    checked.opts.max_new_tokens = checked.max_tokens.unwrap_or(room).min(room);
    if !api.ready.load(Ordering::SeqCst) {
        return Err(not_ready(
            "No ring is ready yet: the head is waiting for its members (or forming the ring).",
        ));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = ids.len();
    let job = Job {
        prompt_ids: ids,
        opts: checked.opts.clone(),
        stop: checked.stop.clone(),
        verify: checked.verify,
        sink: Sink::Client(tx),
    };
    match api.jobs.try_send(Some(job)) {
        Ok(()) => Ok((checked, prompt_tokens, rx)),
        Err(mpsc::error::TrySendError::Full(_)) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "The head's queue of turns is full; try again shortly.",
        )
        .code("queue_full")
        .retry_after(RETRY_AFTER_S)),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The ring has stopped.",
        )
        .code("ring_stopped")),
    }
}

/// 503 with `Retry-After`: no ring takes turns yet.
fn not_ready(why: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", why)
        .code("ring_not_ready")
        .retry_after(RETRY_AFTER_S)
}

fn reply_id(endpoint: Endpoint) -> String {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    format!("{prefix}-{}", hex::encode(rand::random::<[u8; 12]>()))
}

/// What every chunk or reply of one request repeats.
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    include_usage: bool,
    verify: bool,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        })
    }

    /// A streamed piece of text (or the chat's first chunk, its role).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match text {
                    None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                    None => json!({}),
                    Some(t) => json!({"content": t}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }

    fn usage(&self, done: &Finished) -> Value {
        json!({
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.kept_positions},
        })
    }

    /// Verify's result as the reply carries it (when it was asked for).
    fn verify_value(&self, done: &Finished) -> Option<Value> {
        if !self.verify {
            return None;
        }
        Some(match (&done.verify, &done.verify_unavailable) {
            (Some(report), _) => json!({
                "matched": report.matched,
                "summary": report.summary(),
                "report": report,
            }),
            (None, why) => json!({"matched": null, "summary": why}),
        })
    }

    fn whole(&self, done: &Finished) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": done.text, "refusal": null},
                "logprobs": null,
                "finish_reason": done.finish.name(),
            }),
            Endpoint::Completions => json!({
                "index": 0,
                "text": done.text,
                "logprobs": null,
                "finish_reason": done.finish.name(),
            }),
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = self.usage(done);
        v["timings"] = timings(done);
        if let Some(verify) = self.verify_value(done) {
            v["verify"] = verify;
        }
        v
    }
}

/// The turn's speed (a field of the head's own, beside OpenAI's).
fn timings(done: &Finished) -> Value {
    json!({
        "decode_tokens_per_s": done.decode_tokens_per_s,
        "decode_lap_ms": done.lap_ms,
        "hop_ms": done.hop_ms,
        "hops": done.hops,
        "picture": done.picture,
        "laps": done.laps,
        "drafted": done.drafted,
        "accepted": done.accepted,
    })
}

/// The header that carries Verify's result: `match`, `mismatch; …` or `unavailable; …`.
fn verify_header(done: &Finished) -> String {
    let line = match (&done.verify, &done.verify_unavailable) {
        (Some(r), _) if r.matched => "match".to_string(),
        (Some(r), _) => format!("mismatch; {}", r.summary()),
        (None, Some(why)) => format!("unavailable; {why}"),
        (None, None) => "unavailable".to_string(),
    };
    // A header value is visible ASCII.
    line.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn turn_failed(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("The turn failed: {why}"),
    )
    .code("turn_failed")
}

async fn whole_reply(reply: Reply, mut rx: mpsc::UnboundedReceiver<Streamed>) -> Response {
    while let Some(event) = rx.recv().await {
        match event {
            Streamed::Started | Streamed::Text(_) => {}
            Streamed::Done(done) => {
                let mut response = json_response(StatusCode::OK, &reply.whole(&done));
                if reply.verify
                    && let Ok(v) = HeaderValue::from_str(&verify_header(&done))
                {
                    response.headers_mut().insert("x-daisy-verify", v);
                }
                return response;
            }
            Streamed::Failed(why) => return turn_failed(&why).into_response(),
        }
    }
    turn_failed("the head stopped before the turn ended").into_response()
}

/// Server-sent events: the chat's role first, a chunk per token's text, a final chunk with
/// `finish_reason` (and `verify`), the usage chunk when asked for, then `[DONE]`. Comments (which
/// clients ignore) tell the page that the turn waits (`: daisy {"queued":…}`) and when it starts.
fn stream_reply(
    reply: Reply,
    prompt_tokens: usize,
    rx: mpsc::UnboundedReceiver<Streamed>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut first = Vec::new();
    if reply.endpoint == Endpoint::Chat {
        first.push(Event::default().data(reply.chunk(None, None).to_string()));
    }
    first.push(Event::default().comment(format!(
        "daisy {}",
        json!({"queued": true, "prompt_tokens": prompt_tokens})
    )));
    let state = (reply, rx, Some(first), false);
    let events = futures_util::stream::unfold(state, |(reply, mut rx, first, ended)| async move {
        if ended {
            return None;
        }
        if let Some(first) = first {
            return Some((first, (reply, rx, None, false)));
        }
        let data = |v: Value| Event::default().data(v.to_string());
        let (events, ended) = match rx.recv().await {
            None => (
                vec![data(
                    turn_failed("the head stopped before the turn ended").body(),
                )],
                true,
            ),
            Some(Streamed::Started) => (
                vec![Event::default().comment(format!("daisy {}", json!({"started": true})))],
                false,
            ),
            Some(Streamed::Text(text)) => (vec![data(reply.chunk(Some(&text), None))], false),
            Some(Streamed::Done(done)) => {
                let mut last = reply.chunk(None, Some(done.finish.name()));
                last["timings"] = timings(&done);
                if let Some(verify) = reply.verify_value(&done) {
                    last["verify"] = verify;
                }
                let mut events = vec![data(last)];
                if reply.include_usage {
                    let mut usage = reply.envelope(true, json!([]));
                    usage["usage"] = reply.usage(&done);
                    events.push(data(usage));
                }
                events.push(Event::default().data("[DONE]"));
                (events, true)
            }
            Some(Streamed::Failed(why)) => (vec![data(turn_failed(&why).body())], true),
        };
        Some((events, (reply, rx, None, ended)))
    });
    Sse::new(
        events
            .map(|batch| futures_util::stream::iter(batch.into_iter().map(Ok)))
            .flatten(),
    )
}
