//! A loopback HTTP server that speaks the Anthropic Messages API and OpenAI
//! chat completions, checks requests as the real APIs do (headers, body
//! shape), answers with their success and error bodies, and misbehaves on
//! cue: status codes with `retry-after`, hangs, empty text, malformed JSON,
//! connections broken mid-body. What it does is chosen per request by a
//! marker found in the request body (e.g. the trajectory's task prompt), in
//! sequence: the n-th request carrying a marker gets the n-th behaviour (the
//! last one repeats).
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub enum Behavior {
    /// 200 with this text, after a delay.
    Text(String, Duration),
    /// An error status with the API's error body and optional retry-after.
    Status(u16, &'static str, Option<u32>),
    /// Never answers.
    Hang,
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with no text.
    Empty,
    /// Sends half a body, then breaks the connection.
    Reset,
    /// 200 with a text derived from the request (its model and a hash of its
    /// body), after `base` times 1 to 5 by the same hash: every group gets
    /// its own hint and latency, the same ones for the same request.
    Derived(Duration),
}

/// FNV-1a, so derived answers need no extra dependency.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub at: Instant,
}

#[derive(Default)]
struct Script {
    by_marker: Vec<(String, Vec<Behavior>)>,
    counts: HashMap<String, usize>,
    default: Option<Behavior>,
}

#[derive(Clone)]
struct AppState {
    script: Arc<Mutex<Script>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    api_key: Option<String>,
}

pub struct LlmServer {
    pub addr: SocketAddr,
    state: AppState,
}

impl LlmServer {
    /// Starts on 127.0.0.1 with a free port. `api_key`: the key requests
    /// must carry (`x-api-key` or `Authorization: Bearer`).
    pub async fn start(api_key: Option<&str>) -> LlmServer {
        let state = AppState {
            script: Arc::new(Mutex::new(Script::default())),
            seen: Arc::new(Mutex::new(Vec::new())),
            api_key: api_key.map(str::to_string),
        };
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        LlmServer { addr, state }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests whose body contains `marker` get `behaviors` in turn.
    pub fn on(&self, marker: &str, behaviors: Vec<Behavior>) {
        self.state
            .script
            .lock()
            .unwrap()
            .by_marker
            .push((marker.to_string(), behaviors));
    }

    /// What requests without a marker get (default: a fixed text).
    pub fn default(&self, behavior: Behavior) {
        self.state.script.lock().unwrap().default = Some(behavior);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
}

fn pick(state: &AppState, body: &str) -> Behavior {
    let mut script = state.script.lock().unwrap();
    let found = script
        .by_marker
        .iter()
        .find(|(m, _)| body.contains(m.as_str()))
        .cloned();
    match found {
        Some((marker, behaviors)) => {
            let n = script.counts.entry(marker).or_insert(0);
            let b = behaviors[(*n).min(behaviors.len() - 1)].clone();
            *n += 1;
            b
        }
        None => script.default.clone().unwrap_or(Behavior::Text(
            "Run the failing test first.".into(),
            Duration::ZERO,
        )),
    }
}

fn record(state: &AppState, path: &str, headers: &HeaderMap, body: &Bytes) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    state.seen.lock().unwrap().push(Seen {
        path: path.into(),
        headers,
        body: value.clone(),
        at: Instant::now(),
    });
    Ok(value)
}

fn json_response(status: u16, body: Value, retry_after: Option<u32>) -> Response {
    let mut r = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(s) = retry_after {
        r = r.header("retry-after", s.to_string());
    }
    r.body(Body::from(body.to_string())).unwrap()
}

fn anthropic_error(status: u16, kind: &str, message: &str, retry_after: Option<u32>) -> Response {
    json_response(
        status,
        json!({"type": "error", "error": {"type": kind, "message": message}}),
        retry_after,
    )
}

fn openai_error(status: u16, kind: &str, message: &str, retry_after: Option<u32>) -> Response {
    json_response(
        status,
        json!({"error": {"message": message, "type": kind, "code": null}}),
        retry_after,
    )
}

/// Checks a request the way the Messages API does.
// The error is the response to send; boxing it buys nothing in a test server.
#[allow(clippy::result_large_err)]
fn check_anthropic(state: &AppState, headers: &HeaderMap, body: &Value) -> Result<(), Response> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(key) = &state.api_key {
        if header("x-api-key") != Some(key.as_str()) {
            return Err(anthropic_error(
                401,
                "authentication_error",
                "invalid x-api-key",
                None,
            ));
        }
    }
    if header("anthropic-version") != Some("2023-06-01") {
        return Err(anthropic_error(
            400,
            "invalid_request_error",
            "anthropic-version header is required",
            None,
        ));
    }
    let messages_ok = body["messages"].as_array().is_some_and(|m| {
        !m.is_empty()
            && m.iter()
                .all(|x| x["role"].is_string() && (x["content"].is_string() || x["content"].is_array()))
    });
    if !body["model"].is_string() || !body["max_tokens"].is_u64() || !messages_ok {
        return Err(anthropic_error(
            400,
            "invalid_request_error",
            "model, max_tokens and messages are required",
            None,
        ));
    }
    if !body["system"].is_null() && !body["system"].is_string() && !body["system"].is_array() {
        return Err(anthropic_error(
            400,
            "invalid_request_error",
            "system must be a string",
            None,
        ));
    }
    Ok(())
}

#[allow(clippy::result_large_err)]
fn check_openai(state: &AppState, headers: &HeaderMap, body: &Value) -> Result<(), Response> {
    if let Some(key) = &state.api_key {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        if auth != Some(format!("Bearer {key}").as_str()) {
            return Err(openai_error(
                401,
                "invalid_request_error",
                "Incorrect API key provided",
                None,
            ));
        }
    }
    let messages_ok = body["messages"]
        .as_array()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|x| x["role"].is_string()));
    if !body["model"].is_string() || !messages_ok {
        return Err(openai_error(
            400,
            "invalid_request_error",
            "model and messages are required",
            None,
        ));
    }
    Ok(())
}

async fn misbehave(b: &Behavior) -> Option<Response> {
    match b {
        Behavior::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            None
        }
        Behavior::Malformed => Some(
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from("{\"content\": [tru"))
                .unwrap(),
        ),
        Behavior::Reset => {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"{\"content\": [")),
                Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")),
            ];
            Some(
                Response::builder()
                    .status(200)
                    .body(Body::from_stream(futures::stream::iter(chunks)))
                    .unwrap(),
            )
        }
        Behavior::Text(_, delay) => {
            tokio::time::sleep(*delay).await;
            None
        }
        _ => None,
    }
}

/// The two wire protocols the server speaks.
#[derive(Clone, Copy)]
enum Api {
    Anthropic,
    OpenAi,
}

impl Api {
    fn path(self) -> &'static str {
        match self {
            Api::Anthropic => "/v1/messages",
            Api::OpenAi => "/v1/chat/completions",
        }
    }

    fn error(self, status: u16, kind: &str, message: &str, retry_after: Option<u32>) -> Response {
        match self {
            Api::Anthropic => anthropic_error(status, kind, message, retry_after),
            Api::OpenAi => openai_error(status, kind, message, retry_after),
        }
    }

    #[allow(clippy::result_large_err)]
    fn check(self, state: &AppState, headers: &HeaderMap, body: &Value) -> Result<(), Response> {
        match self {
            Api::Anthropic => check_anthropic(state, headers, body),
            Api::OpenAi => check_openai(state, headers, body),
        }
    }

    fn success(self, model: &Value, text: &str, request_len: usize) -> Value {
        match self {
            Api::Anthropic => {
                let content = if text.is_empty() {
                    json!([])
                } else {
                    json!([{"type": "text", "text": text}])
                };
                json!({
                    "id": "msg_loopback", "type": "message", "role": "assistant", "model": model,
                    "content": content, "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": request_len / 4, "output_tokens": text.len() / 4}
                })
            }
            Api::OpenAi => json!({
                "id": "chatcmpl-loopback", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": request_len / 4, "completion_tokens": text.len() / 4, "total_tokens": 0}
            }),
        }
    }
}

async fn respond(api: Api, state: AppState, headers: HeaderMap, body: Bytes) -> Response {
    let value = match record(&state, api.path(), &headers, &body) {
        Ok(v) => v,
        Err(e) => return api.error(400, "invalid_request_error", &e, None),
    };
    if let Err(r) = api.check(&state, &headers, &value) {
        return r;
    }
    let behavior = pick(&state, &String::from_utf8_lossy(&body));
    if let Some(r) = misbehave(&behavior).await {
        return r;
    }
    let text = match &behavior {
        Behavior::Text(t, _) => t.clone(),
        Behavior::Derived(base) => {
            let h = fnv(&body);
            tokio::time::sleep(*base * (1 + (h % 5) as u32)).await;
            format!(
                "[{}] Attempt {:08x} failed its checks: re-read the task statement, then test the edge case first.",
                value["model"].as_str().unwrap_or("?"),
                h as u32
            )
        }
        Behavior::Empty => String::new(),
        Behavior::Status(code, kind, retry) => return api.error(*code, kind, "scripted error", *retry),
        _ => unreachable!("handled by misbehave"),
    };
    json_response(200, api.success(&value["model"], &text, body.len()), None)
}

async fn anthropic(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    respond(Api::Anthropic, state, headers, body).await
}

async fn openai(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    respond(Api::OpenAi, state, headers, body).await
}

/// The SDK environment pointing the hint stage at `server` with key `key`.
pub fn anthropic_env(server: &LlmServer, key: &str) -> hintstream::llm::synth::LlmEnv {
    hintstream::llm::synth::LlmEnv {
        anthropic_api_key: Some(key.into()),
        anthropic_base_url: Some(server.base_url()),
        ..Default::default()
    }
}
