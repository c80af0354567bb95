//! A loopback HTTP server that speaks the Anthropic Messages API and OpenAI
//! chat completions, checks requests as the real APIs do (headers, body
//! shape), answers with their success and error bodies, and misbehaves on
//! cue: status codes with `retry-after` (or any headers), redirects, hangs,
//! empty text, malformed JSON, oversized or endless bodies, connections
//! broken mid-body. It serves plain HTTP, or HTTPS with a given certificate.
//! What it does is chosen per request by a
//! marker found in the request body (e.g. the trajectory's task prompt), in
//! sequence: the n-th request carrying a marker gets the n-th behaviour (the
//! last one repeats). Prompt caching is reported as the providers do (see
//! `PromptCacheSim`): a cache write on the first request of a marked
//! prefix of 1,024+ tokens, reads after.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Sends half a body, then breaks the connection (so fast that the
    /// client sees no response: a broken connection).
    Reset,
    /// 200 and its headers and the start of a body, flushed; then, after a
    /// pause, the connection breaks: a body broken after a success status.
    BreakAfter200,
    /// 200 with a text derived from the request (its model and a hash of its
    /// body), after `base` times 1 to 5 by the same hash: every group gets
    /// its own hint and latency, the same ones for the same request.
    Derived(Duration),
    /// An error status with the API's error body and these headers (e.g.
    /// `retry-after-ms`, an HTTP-date `retry-after`).
    StatusWith(u16, &'static str, Vec<(&'static str, String)>),
    /// A redirect: this status with `Location` set to this URL.
    Redirect(u16, String),
    /// 200 with a valid Messages/chat reply of this many bytes (the text
    /// pads it), with `content-length`.
    Huge(usize),
    /// 200 without `content-length` (chunked): this many bytes of a reply
    /// that never ends; the body stays open.
    Endless(usize),
    /// 401 whose message echoes the key the request carried, as some
    /// gateways do.
    EchoKey,
    /// 401 whose message echoes the key after this many characters of
    /// padding (where an error message's cut may fall).
    EchoKeyAt(usize),
    /// 200 with this text, after a delay, billed at the worst case a
    /// request can be: one input token per byte of its prompt text (system
    /// and messages) and the whole `max_tokens` of output; three times the
    /// input of a bytes/3 estimate.
    Billed(String, Duration),
    /// 200 with a fixed hint, after a delay drawn from this latency
    /// process (see [`Latency`]); its usage is added to
    /// [`LlmServer::timed_usage`] as the request arrives.
    Timed(Latency),
    /// A model with a context window, as vLLM and llama.cpp enforce it
    /// (see `window_reply`): a request whose prompt text, at
    /// `bytes_per_token`, plus its `max_tokens` is over `context_tokens`
    /// gets OpenAI's 400 `context_length_exceeded`; one that fits gets
    /// `text`, billed at that many prompt tokens.
    Window {
        context_tokens: u64,
        bytes_per_token: u64,
        text: String,
    },
    /// A server with one slot, as llama.cpp's by default: requests with
    /// this behaviour are answered one at a time (one slot per test
    /// binary), each taking this long, with this text; the others wait.
    OneSlot(String, Duration),
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
    cache: Arc<Mutex<PromptCacheSim>>,
    timing: Arc<Mutex<Timing>>,
}

pub struct LlmServer {
    pub addr: SocketAddr,
    state: AppState,
    scheme: &'static str,
    /// TLS handshakes that failed (HTTPS only).
    tls_rejected: Arc<AtomicUsize>,
}

impl LlmServer {
    /// Starts on 127.0.0.1 with a free port. `api_key`: the key requests
    /// must carry (`x-api-key` or `Authorization: Bearer`).
    pub async fn start(api_key: Option<&str>) -> LlmServer {
        let (state, app) = Self::app(api_key);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        LlmServer {
            addr,
            state,
            scheme: "http",
            tls_rejected: Arc::default(),
        }
    }

    /// Starts HTTPS on 127.0.0.1 with a free port, presenting the PEM
    /// certificate chain `cert` with its PEM private key `key`.
    pub async fn start_tls(api_key: Option<&str>, cert: &Path, key: &Path) -> LlmServer {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let tls =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
        let (state, app) = Self::app(api_key);
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let tls_rejected = Arc::new(AtomicUsize::new(0));
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
            rejected: tls_rejected.clone(),
        };
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        LlmServer {
            addr,
            state,
            scheme: "https",
            tls_rejected,
        }
    }

    fn app(api_key: Option<&str>) -> (AppState, Router) {
        let state = AppState {
            script: Arc::new(Mutex::new(Script::default())),
            seen: Arc::new(Mutex::new(Vec::new())),
            api_key: api_key.map(str::to_string),
            cache: Arc::default(),
            timing: Arc::new(Mutex::new(Timing::seeded(0))),
        };
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .with_state(state.clone());
        (state, app)
    }

    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// TLS handshakes that failed so far (HTTPS only).
    pub fn tls_rejected(&self) -> usize {
        self.tls_rejected.load(Ordering::SeqCst)
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

    /// Restarts the latency draws of [`Behavior::Timed`] from `seed` and
    /// zeroes its tally: two runs seeded alike see one latency process.
    pub fn seed_latency(&self, seed: u64) {
        *self.state.timing.lock().unwrap() = Timing::seeded(seed);
    }

    /// What [`Behavior::Timed`] requests were billed since the last seed:
    /// (requests, input tokens, output tokens), every request that arrived
    /// billed in full, cancelled ones included, as a provider that
    /// finishes a dropped request bills it.
    pub fn timed_usage(&self) -> (u64, u64, u64) {
        let t = self.state.timing.lock().unwrap();
        (t.requests, t.input_tokens, t.output_tokens)
    }
}

// Latency modes (Behavior::Timed) -------------------------------------------

/// A latency process for [`Behavior::Timed`].
#[derive(Debug, Clone, Copy)]
pub enum Latency {
    /// Lognormal: `median * exp(sigma * z)`, z standard normal.
    Lognormal { median: Duration, sigma: f64 },
    /// Lognormal, and a `share` of the calls (stragglers) `factor` times
    /// slower.
    Stragglers {
        median: Duration,
        sigma: f64,
        share: f64,
        factor: f64,
    },
}

/// The seeded draws of the latency modes and what they billed.
struct Timing {
    rng: rand::rngs::StdRng,
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Timing {
    fn seeded(seed: u64) -> Timing {
        use rand::SeedableRng;
        Timing {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
        }
    }

    /// One draw of `latency`.
    fn draw(&mut self, latency: Latency) -> Duration {
        use rand::Rng;
        let mut lognormal = |median: Duration, sigma: f64| {
            // Box-Muller.
            let (u1, u2): (f64, f64) = (self.rng.random_range(1e-12..1.0), self.rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            median.mul_f64((sigma * z).exp())
        };
        match latency {
            Latency::Lognormal { median, sigma } => lognormal(median, sigma),
            Latency::Stragglers {
                median,
                sigma,
                share,
                factor,
            } => {
                let base = lognormal(median, sigma);
                if self.rng.random_bool(share) {
                    base.mul_f64(factor)
                } else {
                    base
                }
            }
        }
    }
}

/// The text a [`Behavior::Timed`] request is answered with.
const TIMED_HINT: &str = "Check the output format first, then rerun the failing test alone.";

/// Draws the delay of a [`Behavior::Timed`] request and bills its reply
/// (the usage it reports) as it arrives; the reply and the delay.
fn timed_reply(
    api: Api,
    state: &AppState,
    latency: Latency,
    model: &Value,
    body_len: usize,
) -> (Value, Duration) {
    let reply = api.success(model, TIMED_HINT, body_len);
    let usage = &reply["usage"];
    let input = usage["input_tokens"]
        .as_u64()
        .or_else(|| usage["prompt_tokens"].as_u64())
        .unwrap_or(0);
    let output = usage["output_tokens"]
        .as_u64()
        .or_else(|| usage["completion_tokens"].as_u64())
        .unwrap_or(0);
    let mut timing = state.timing.lock().unwrap();
    timing.requests += 1;
    timing.input_tokens += input;
    timing.output_tokens += output;
    let delay = timing.draw(latency);
    (reply, delay)
}

/// TLS over a TCP listener, for `axum::serve`: a failed handshake is
/// counted and the next connection accepted.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    rejected: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            match self.acceptor.accept(tcp).await {
                Ok(tls) => return (tls, addr),
                Err(_) => {
                    self.rejected.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A listener that only counts the connections it gets (then closes
/// them): the place a redirect points to, which must see none.
pub struct ConnectionCounter {
    pub addr: SocketAddr,
    count: Arc<AtomicUsize>,
}

impl ConnectionCounter {
    pub async fn start() -> ConnectionCounter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        ConnectionCounter { addr, count }
    }

    pub fn connections(&self) -> usize {
        self.count.load(Ordering::SeqCst)
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

/// A success body of the API `api` of at least `len` bytes (a few more at
/// most): valid JSON, its text padded with `a`s.
fn reply_of_len(api: Api, len: usize) -> Vec<u8> {
    let reply = |n: usize| serde_json::to_vec(&api.success(&json!("m"), &"a".repeat(n), 0)).unwrap();
    let mut n = 0;
    loop {
        let body = reply(n);
        if body.len() >= len {
            return body;
        }
        n += len - body.len();
    }
}

async fn misbehave(api: Api, headers: &HeaderMap, b: &Behavior) -> Option<Response> {
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
        Behavior::BreakAfter200 => {
            let chunks = futures::stream::unfold(0u8, |n| async move {
                match n {
                    0 => Some((Ok(Bytes::from_static(b"{\"content\": [")), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Some((
                            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")),
                            2,
                        ))
                    }
                    _ => None,
                }
            });
            Some(
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(chunks))
                    .unwrap(),
            )
        }
        Behavior::Text(_, delay) => {
            tokio::time::sleep(*delay).await;
            None
        }
        Behavior::StatusWith(status, kind, extra) => {
            let mut r = api.error(*status, kind, "scripted error", None);
            for (name, value) in extra {
                r.headers_mut().insert(*name, value.parse().unwrap());
            }
            Some(r)
        }
        Behavior::Redirect(status, location) => Some(
            Response::builder()
                .status(*status)
                .header("location", location.as_str())
                .body(Body::empty())
                .unwrap(),
        ),
        Behavior::Huge(len) => Some(
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from(reply_of_len(api, *len)))
                .unwrap(),
        ),
        Behavior::Endless(len) => {
            let body = reply_of_len(api, len + 1024);
            let chunks: Vec<Result<Bytes, std::io::Error>> = body[..*len]
                .chunks(64 << 10)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let endless =
                futures::StreamExt::chain(futures::stream::iter(chunks), futures::stream::pending());
            Some(
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(endless))
                    .unwrap(),
            )
        }
        Behavior::EchoKeyAt(padding) => {
            let key = headers
                .get("x-api-key")
                .or_else(|| headers.get("authorization"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            Some(api.error(
                401,
                "authentication_error",
                &format!("{}{key} is not a valid key", "x".repeat(*padding)),
                None,
            ))
        }
        Behavior::Billed(_, delay) => {
            tokio::time::sleep(*delay).await;
            None
        }
        Behavior::EchoKey => {
            let key = headers
                .get("x-api-key")
                .or_else(|| headers.get("authorization"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            Some(api.error(
                401,
                "authentication_error",
                &format!("invalid x-api-key: {key}"),
                None,
            ))
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

    /// Sets a success reply's usage to these tokens.
    fn bill(self, reply: &mut Value, input_tokens: u64, output_tokens: u64) {
        match self {
            Api::Anthropic => {
                reply["usage"] = json!({"input_tokens": input_tokens, "output_tokens": output_tokens});
            }
            Api::OpenAi => {
                reply["usage"] = json!({
                    "prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                    "total_tokens": input_tokens + output_tokens
                });
            }
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
    if let Behavior::Timed(latency) = behavior {
        let (reply, delay) = timed_reply(api, &state, latency, &value["model"], body.len());
        tokio::time::sleep(delay).await;
        return json_response(200, reply, None);
    }
    if let Some(r) = window_reply(api, &value, &behavior) {
        return r;
    }
    if let Some(r) = one_slot_reply(api, &value, &behavior).await {
        return r;
    }
    let cache_bill = state.cache.lock().unwrap().arrive(api, &value);
    if let Some(r) = misbehave(api, &headers, &behavior).await {
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
        Behavior::Billed(text, _) => {
            let mut reply = api.success(&value["model"], text, body.len());
            api.bill(
                &mut reply,
                prompt_text_bytes(&value),
                value["max_tokens"].as_u64().unwrap_or(0),
            );
            return json_response(200, reply, None);
        }
        _ => unreachable!("handled by misbehave"),
    };
    let mut reply = api.success(&value["model"], &text, body.len());
    state.cache.lock().unwrap().answer(cache_bill, &mut reply);
    json_response(200, reply, None)
}

/// [`Behavior::Window`]'s answer: the context-length error of a request
/// over the window, in OpenAI's shape (which vLLM's and llama-cpp-python's
/// servers copy), else the reply billed at the prompt's tokens.
fn window_reply(api: Api, request: &Value, behavior: &Behavior) -> Option<Response> {
    let Behavior::Window {
        context_tokens,
        bytes_per_token,
        text,
    } = behavior
    else {
        return None;
    };
    let prompt_tokens = prompt_text_bytes(request).div_ceil((*bytes_per_token).max(1));
    let max_tokens = request["max_tokens"].as_u64().unwrap_or(0);
    if prompt_tokens + max_tokens > *context_tokens {
        let message = format!(
            "This model's maximum context length is {context_tokens} tokens. However, you requested {} \
             tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the \
             length of the messages or completion.",
            prompt_tokens + max_tokens
        );
        return Some(json_response(
            400,
            json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                             "code": "context_length_exceeded"}}),
            None,
        ));
    }
    let mut reply = api.success(&request["model"], text, 0);
    api.bill(&mut reply, prompt_tokens, (text.len() as u64).div_ceil(4));
    Some(json_response(200, reply, None))
}

/// [`Behavior::OneSlot`]'s answer, after the requests before it.
async fn one_slot_reply(api: Api, request: &Value, behavior: &Behavior) -> Option<Response> {
    static SLOT: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    let Behavior::OneSlot(text, each) = behavior else {
        return None;
    };
    let _slot = SLOT.get_or_init(|| tokio::sync::Mutex::new(())).lock().await;
    tokio::time::sleep(*each).await;
    Some(json_response(200, api.success(&request["model"], text, 0), None))
}

/// The bytes of a request's prompt text: its system prompt and the text of
/// every message.
pub fn prompt_text_bytes(body: &Value) -> u64 {
    let text_len = |v: &Value| match v {
        Value::String(s) => s.len(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .map(str::len)
            .sum(),
        _ => 0,
    };
    let messages: usize = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().map(|m| text_len(&m["content"])).sum());
    (text_len(&body["system"]) + messages) as u64
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

// ---------------------------------------------------------------------------
// Prompt caching, as the providers report it.
// ---------------------------------------------------------------------------

/// The shortest cacheable prefix, in tokens (Claude Sonnet's, and
/// OpenAI's): a breakpoint on a shorter prefix caches nothing.
pub const CACHE_MIN_TOKENS: u64 = 1024;
/// OpenAI caches prefixes in steps of this many tokens past the minimum.
pub const OPENAI_CACHE_STEP_TOKENS: u64 = 128;
/// How long an OpenAI cache entry lives without use.
const OPENAI_CACHE_TTL: Duration = Duration::from_secs(600);
/// Bytes per token, in the server's count of prefixes.
const CACHE_BYTES_PER_TOKEN: u64 = 4;

/// The server's prompt cache. A request's input is `body bytes / 4`
/// tokens, as without caching; its prefixes are counted at a token per 4
/// bytes of text.
///
/// Anthropic: the prompt is the system blocks, then each message's
/// blocks, in order; a block with `cache_control` ends a prefix. The
/// longest marked prefix found in the cache is a read; from there to the
/// last marked prefix of [`CACHE_MIN_TOKENS`]+ tokens is a write; both
/// then live `ttl` (5 minutes, or 1 hour with `"ttl": "1h"`) from now.
/// `usage` gets `cache_read_input_tokens` and
/// `cache_creation_input_tokens` (the rest stays `input_tokens`) when the
/// request marked any block. (The real API reports both on every reply;
/// here unmarked requests keep the usage they had.)
///
/// OpenAI: every prompt of [`CACHE_MIN_TOKENS`]+ tokens is cached in
/// [`OPENAI_CACHE_STEP_TOKENS`] steps, unasked; the longest step found is
/// `prompt_tokens_details.cached_tokens`, included in `prompt_tokens`.
/// Reported when some tokens were cached or the request set
/// `prompt_cache_key`. No write is billed.
#[derive(Default)]
pub struct PromptCacheSim {
    /// Prefix hash -> when the entry expires.
    entries: HashMap<u64, Instant>,
}

/// A marked prefix of an Anthropic request.
struct Breakpoint {
    hash: u64,
    tokens: u64,
    ttl: Duration,
}

/// The text blocks of a `system` or `content` value (a string is one
/// unmarked block).
fn blocks(v: &Value) -> Vec<(String, Option<Duration>)> {
    let ttl = |b: &Value| {
        b.get("cache_control").filter(|c| c.is_object()).map(|c| {
            if c["ttl"] == "1h" {
                Duration::from_secs(3600)
            } else {
                Duration::from_secs(300)
            }
        })
    };
    match v {
        Value::String(s) => vec![(s.clone(), None)],
        Value::Array(items) => items
            .iter()
            .map(|b| (b["text"].as_str().unwrap_or_default().to_string(), ttl(b)))
            .collect(),
        _ => Vec::new(),
    }
}

/// What a request reads from and writes to the cache, decided when it
/// arrives (a prefix written by a request still in flight is not yet
/// readable, as on the real APIs); its entries go in when it is answered.
pub struct CacheBill {
    api: Api,
    read: u64,
    written: u64,
    /// Whether the reply reports cache fields.
    report: bool,
    /// Prefixes cached by this request, and how long they live.
    entries: Vec<(u64, Duration)>,
}

impl PromptCacheSim {
    fn live(&self, hash: u64, now: Instant) -> bool {
        self.entries.get(&hash).is_some_and(|until| *until > now)
    }

    /// What the request `body` reads and writes, by the cache as it is now.
    fn arrive(&self, api: Api, body: &Value) -> CacheBill {
        let now = Instant::now();
        match api {
            Api::Anthropic => self.arrive_anthropic(body, now),
            Api::OpenAi => self.arrive_openai(body, now),
        }
    }

    /// Stores `bill`'s prefixes and sets the cache fields of the success
    /// `reply`.
    fn answer(&mut self, bill: CacheBill, reply: &mut Value) {
        let now = Instant::now();
        for (hash, ttl) in &bill.entries {
            self.entries.insert(*hash, now + *ttl);
        }
        if !bill.report {
            return;
        }
        let usage = &mut reply["usage"];
        match bill.api {
            Api::Anthropic => {
                let total = usage["input_tokens"].as_u64().unwrap_or(0);
                usage["input_tokens"] = json!(total.saturating_sub(bill.read + bill.written));
                usage["cache_read_input_tokens"] = json!(bill.read);
                usage["cache_creation_input_tokens"] = json!(bill.written);
            }
            Api::OpenAi => {
                usage["prompt_tokens_details"] = json!({"cached_tokens": bill.read});
            }
        }
    }

    fn arrive_anthropic(&self, body: &Value, now: Instant) -> CacheBill {
        let model = body["model"].as_str().unwrap_or_default();
        let mut parts = blocks(&body["system"]);
        for m in body["messages"].as_array().into_iter().flatten() {
            parts.extend(blocks(&m["content"]));
        }
        let mut hash = fnv(model.as_bytes());
        let mut bytes = 0u64;
        let mut marks = Vec::new();
        for (text, ttl) in &parts {
            hash = fnv(&[hash.to_le_bytes().as_slice(), text.as_bytes()].concat());
            bytes += text.len() as u64;
            if let Some(ttl) = ttl {
                marks.push(Breakpoint {
                    hash,
                    tokens: bytes / CACHE_BYTES_PER_TOKEN,
                    ttl: *ttl,
                });
            }
        }
        let cacheable: Vec<&Breakpoint> = marks.iter().filter(|b| b.tokens >= CACHE_MIN_TOKENS).collect();
        let read = cacheable
            .iter()
            .rev()
            .find(|b| self.live(b.hash, now))
            .map_or(0, |b| b.tokens);
        let last = cacheable.last().map_or(0, |b| b.tokens);
        CacheBill {
            api: Api::Anthropic,
            read,
            written: last.saturating_sub(read),
            report: !marks.is_empty(),
            entries: cacheable.iter().map(|b| (b.hash, b.ttl)).collect(),
        }
    }

    fn arrive_openai(&self, body: &Value, now: Instant) -> CacheBill {
        let model = body["model"].as_str().unwrap_or_default();
        let mut text = Vec::new();
        for m in body["messages"].as_array().into_iter().flatten() {
            text.extend_from_slice(m["role"].as_str().unwrap_or_default().as_bytes());
            text.push(0);
            for (t, _) in blocks(&m["content"]) {
                text.extend_from_slice(t.as_bytes());
            }
            text.push(0);
        }
        let text_tokens = text.len() as u64 / CACHE_BYTES_PER_TOKEN;
        let mut read = 0;
        let mut entries = Vec::new();
        let mut step = CACHE_MIN_TOKENS;
        while step <= text_tokens {
            let end = (step * CACHE_BYTES_PER_TOKEN) as usize;
            let hash = fnv(&[model.as_bytes(), &[0], &text[..end]].concat());
            if self.live(hash, now) {
                read = step;
            }
            entries.push((hash, OPENAI_CACHE_TTL));
            step += OPENAI_CACHE_STEP_TOKENS;
        }
        CacheBill {
            api: Api::OpenAi,
            read,
            written: 0,
            report: read > 0 || body.get("prompt_cache_key").is_some(),
            entries,
        }
    }
}
