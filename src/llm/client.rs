//! The only module that speaks HTTP: the Anthropic Messages API and
//! OpenAI-compatible chat completions (OpenRouter, vLLM, LiteLLM, Ollama),
//! over reqwest, with errors sorted into the kinds the retry policy and the
//! `failure_reason` of a hint use.
//!
//! Hardening: redirects are never followed (the key must not reach another
//! host), bodies are read up to a cap, the trust roots are the system store
//! plus the PEM file in `SSL_CERT_FILE`, and keys never print.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::Method;
use serde_json::{json, Value};
use thiserror::Error;

use super::prompt_cache::CacheMarks;
use crate::messages::Usage;

/// The Anthropic API version header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Longest error body kept in an error message.
const MAX_ERROR_BODY_CHARS: usize = 300;
/// Largest success body read from a model API. A longer one (by its
/// `content-length`, or once that many bytes have streamed in) fails the
/// attempt with `malformed_response`, not retried; the rest is never read
/// and the connection is dropped, so memory stays bounded.
pub const MAX_RESPONSE_BODY_BYTES: usize = 1 << 20;
/// Largest part of an error body read: the message keeps its first
/// `MAX_ERROR_BODY_CHARS` characters, and the status decides the retry.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;
/// Largest body read when asking a server for a model's context window
/// (OpenRouter's model list is about a megabyte).
pub const MAX_DISCOVERY_BODY_BYTES: usize = 8 << 20;
/// The header the official SDKs read first: the wait in milliseconds.
const RETRY_AFTER_MS: &str = "retry-after-ms";

/// An API key. Its `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Anthropic,
    Openai,
}

/// Where and how to call a model API.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub provider: Provider,
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    /// A PEM file whose certificates are trusted besides the system store
    /// (`SSL_CERT_FILE`): the CA of a private gateway (LiteLLM, vLLM behind
    /// TLS).
    pub ssl_cert_file: Option<PathBuf>,
}

/// One completion request.
#[derive(Debug, Clone)]
pub struct Completion<'a> {
    pub model: &'a str,
    pub system: &'a str,
    pub user: &'a str,
    pub max_tokens: u32,
    pub temperature: f64,
    /// Where the request asks for prompt caching (none by default). Not
    /// part of the cassette key: the text sent is the same.
    pub cache: CacheMarks,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub usage: Usage,
    pub stop_reason: Option<String>,
}

#[derive(Debug, Error, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmError {
    #[error("timed out")]
    Timeout,
    #[error("HTTP {status} ({kind}): {message}")]
    Status {
        status: u16,
        /// `error.type` of the body (`rate_limit_error`, `overloaded_error`, ...).
        kind: String,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("connection failed: {0}")]
    Connect(String),
    /// The API answered with a success status, then the connection broke
    /// before the whole body came: the request was processed, and billed,
    /// at a cost the lost `usage` would have said. The spend budget
    /// charges it its reservation (the worst case); unlike `Connect`,
    /// which means the API never saw the request and costs nothing.
    #[error("the response body broke off after a success status: {0}")]
    BodyBroken(String),
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("the model returned no text")]
    Empty,
    /// Strict playback: the cassette has no call for this request.
    #[error("the cassette has no recorded call for this request (model {model}); record it first")]
    NotInCassette { model: String },
    /// The hourly spend budget (`llm.budget_usd_per_hour` or
    /// `llm.budget_tokens_per_hour`) is spent: no request was sent.
    #[error("the LLM spend budget for the rolling hour is spent")]
    BudgetExhausted,
    /// `SSL_CERT_FILE` cannot be read or holds no usable certificate: the
    /// client is not built (a start-up error, never a hint's).
    #[error("SSL_CERT_FILE {path}: {reason}")]
    CertFile { path: PathBuf, reason: String },
    /// `llm.system_context_file` or `llm.system_context_dir` cannot be
    /// used: the synthesizer is not built (a start-up error, never a
    /// hint's).
    #[error("{setting} {path}: {reason}")]
    Context {
        setting: String,
        path: PathBuf,
        reason: String,
    },
}

impl From<super::context::ContextError> for LlmError {
    fn from(e: super::context::ContextError) -> Self {
        LlmError::Context {
            setting: e.setting.to_string(),
            path: e.path,
            reason: e.reason,
        }
    }
}

impl LlmError {
    /// The short kind stamped on a hint's `failure_reason`.
    pub fn failure_reason(&self) -> String {
        match self {
            LlmError::Timeout => "timeout".into(),
            LlmError::Status {
                status: 300..=399, ..
            } => "http_3xx".into(),
            LlmError::Status { status: 429, .. } => "http_429".into(),
            e @ LlmError::Status { .. } if e.is_context_length() => "context_length".into(),
            LlmError::Status { status: 529, .. } => "http_529".into(),
            LlmError::Status { status, .. } if *status >= 500 => "http_5xx".into(),
            LlmError::Status { status, .. } => format!("http_{status}"),
            LlmError::Connect(_) => "connect".into(),
            LlmError::BodyBroken(_) => "body_broken".into(),
            LlmError::Malformed(_) => "malformed_response".into(),
            LlmError::Empty => "empty".into(),
            LlmError::NotInCassette { .. } => "cassette_miss".into(),
            LlmError::BudgetExhausted => "budget_exhausted".into(),
            LlmError::CertFile { .. } => "cert_file".into(),
            LlmError::Context { .. } => "system_context".into(),
        }
    }

    /// Whether the server refused the prompt as longer than the model's
    /// context window: OpenAI's and llama-cpp-python's
    /// `context_length_exceeded`, vLLM's 400 "maximum context length is N
    /// tokens", llama.cpp's `exceed_context_size_error` ("exceeds the
    /// available context size"), Anthropic's "prompt is too long".
    pub fn is_context_length(&self) -> bool {
        let LlmError::Status {
            status,
            kind,
            message,
            ..
        } = self
        else {
            return false;
        };
        if !matches!(status, 400 | 413 | 422) {
            return false;
        }
        let message = message.to_ascii_lowercase();
        kind == "context_length_exceeded"
            || kind == "exceed_context_size_error"
            || [
                "maximum context length",
                "context length",
                "context window",
                "context size",
                "prompt is too long",
            ]
            .iter()
            .any(|needle| message.contains(needle))
    }

    /// The window a context-length error names, when its message says it:
    /// "maximum context length is 2048 tokens" (OpenAI, vLLM,
    /// llama-cpp-python), "context window of 2048" (llama-cpp-python),
    /// `n_ctx` 2048 (llama.cpp).
    pub fn context_limit(&self) -> Option<u32> {
        let LlmError::Status { message, .. } = self else {
            return None;
        };
        let lower = message.to_ascii_lowercase();
        [
            "maximum context length is ",
            "context window of ",
            "context size (",
            "n_ctx = ",
            "n_ctx: ",
        ]
        .iter()
        .find_map(|lead| {
            let at = lower.find(lead)? + lead.len();
            let digits: String = lower[at..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
    }

    /// Worth retrying, as the official SDKs decide: request timeout (408),
    /// lock conflict (409), rate limits (429), overload and server errors
    /// (>= 500), timeouts and broken connections. Redirects (3xx), other
    /// 4xx (400, 401, 403, 404, 422, ...) and bad bodies are not.
    pub fn retryable(&self) -> bool {
        match self {
            LlmError::Timeout | LlmError::Connect(_) | LlmError::BodyBroken(_) => true,
            LlmError::Status { status, .. } => matches!(*status, 408 | 409 | 429) || *status >= 500,
            LlmError::Malformed(_)
            | LlmError::Empty
            | LlmError::NotInCassette { .. }
            | LlmError::BudgetExhausted
            | LlmError::CertFile { .. }
            | LlmError::Context { .. } => false,
        }
    }

    /// Whether the API answered (an HTTP response, whatever it said), as
    /// opposed to no answer (timeout, connection) or no request at all.
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            LlmError::Status { .. } | LlmError::BodyBroken(_) | LlmError::Malformed(_) | LlmError::Empty
        )
    }

    /// A mistake in the set-up the user fixes (exit 2), not a runtime one.
    pub fn is_config(&self) -> bool {
        matches!(self, LlmError::CertFile { .. } | LlmError::Context { .. })
    }

    /// The server's `retry-after`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A model API client.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    endpoint: Endpoint,
}

impl LlmClient {
    /// Builds the HTTP client: no redirects, trust roots from the system
    /// store (and webpki's) plus every certificate in
    /// `endpoint.ssl_cert_file`. A file that cannot be read or holds no
    /// certificate is `LlmError::CertFile`, naming it.
    pub fn new(endpoint: Endpoint) -> Result<Self, LlmError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            // A redirect would carry `x-api-key` or the bearer token to
            // wherever `Location` points: a 3xx is a failure instead.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = &endpoint.ssl_cert_file {
            for cert in extra_roots(path)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| match &endpoint.ssl_cert_file {
            // The extra roots are the part of the build that input decides.
            Some(path) => LlmError::CertFile {
                path: path.clone(),
                reason: without_url(&e),
            },
            None => LlmError::Connect(without_url(&e)),
        })?;
        Ok(LlmClient { http, endpoint })
    }

    pub fn provider(&self) -> Provider {
        self.endpoint.provider
    }

    /// A request to `path` of the API (under `/v1` for Anthropic, under the
    /// base URL as given for OpenAI-compatible servers) with the provider's
    /// authentication: `x-api-key` and `anthropic-version`, or a bearer
    /// token.
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let base = self.endpoint.base_url.trim_end_matches('/');
        let key = self.endpoint.api_key.as_ref();
        match self.endpoint.provider {
            Provider::Anthropic => {
                let b = self
                    .http
                    .request(method, format!("{base}/v1{path}"))
                    .header("anthropic-version", ANTHROPIC_VERSION);
                match key {
                    Some(key) => b.header("x-api-key", key.expose()),
                    None => b,
                }
            }
            Provider::Openai => {
                let b = self.http.request(method, format!("{base}{path}"));
                match key {
                    Some(key) => b.bearer_auth(key.expose()),
                    None => b,
                }
            }
        }
    }

    /// Asks the API for something free, its model list (`GET /v1/models`),
    /// within `timeout`: the HTTP status of the answer, whatever it is (a
    /// 401 or 404 still shows the provider is there), else why none came.
    /// The body is never read.
    pub async fn probe(&self, timeout: Duration) -> Result<u16, LlmError> {
        let request = self.request(Method::GET, "/models");
        match tokio::time::timeout(timeout, request.send()).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            Ok(Err(e)) => Err(transport_error(e)),
            Err(_) => Err(LlmError::Timeout),
        }
    }

    /// The context window an OpenAI-compatible server reports for `model`,
    /// in tokens, within `timeout` in all: `/models`' `max_model_len`
    /// (vLLM) or `context_length` (OpenRouter) of the entry named `model`
    /// (or of the only entry: llama.cpp serves one model under any name),
    /// else `/props`' `default_generation_settings.n_ctx` beside `/v1`
    /// (llama.cpp's server). `None` when the server says neither (OpenAI,
    /// Ollama, llama-cpp-python), fails or is slow; Anthropic is never
    /// asked. Bodies are read up to [`MAX_DISCOVERY_BODY_BYTES`].
    pub async fn context_window(&self, model: &str, timeout: Duration) -> Option<u32> {
        if self.endpoint.provider != Provider::Openai {
            return None;
        }
        tokio::time::timeout(timeout, self.discover(model))
            .await
            .ok()
            .flatten()
    }

    async fn discover(&self, model: &str) -> Option<u32> {
        let models = self.get_json(self.request(Method::GET, "/models")).await;
        if let Some(tokens) = models.as_ref().and_then(|v| model_window(v, model)) {
            return Some(tokens);
        }
        let base = self.endpoint.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let mut props = self.http.get(format!("{root}/props"));
        if let Some(key) = &self.endpoint.api_key {
            props = props.bearer_auth(key.expose());
        }
        let props = self.get_json(props).await?;
        let n_ctx = props
            .pointer("/default_generation_settings/n_ctx")
            .or_else(|| props.get("n_ctx"))?;
        n_ctx
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
    }

    /// A successful JSON answer to `request`, else `None`.
    async fn get_json(&self, request: reqwest::RequestBuilder) -> Option<Value> {
        let mut response = request.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let (body, complete) = read_body(&mut response, MAX_DISCOVERY_BODY_BYTES).await.ok()?;
        complete.then(|| serde_json::from_slice(&body).ok()).flatten()
    }

    /// One attempt, bounded by `timeout` (connect, send and body).
    pub async fn complete(&self, request: &Completion<'_>, timeout: Duration) -> Result<Reply, LlmError> {
        match tokio::time::timeout(timeout, self.attempt(request)).await {
            Ok(result) => result,
            Err(_) => Err(LlmError::Timeout),
        }
    }

    async fn attempt(&self, request: &Completion<'_>) -> Result<Reply, LlmError> {
        let (path, body) = self.body(request);
        let mut response = self
            .request(Method::POST, path)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(transport_error)?;
        if !response.status().is_success() {
            return Err(self.failed_status(&mut response).await);
        }
        let value = json_body(&mut response).await?;
        let reply = match self.endpoint.provider {
            Provider::Anthropic => anthropic_reply(&value)?,
            Provider::Openai => openai_reply(&value)?,
        };
        if reply.text.trim().is_empty() {
            return Err(LlmError::Empty);
        }
        Ok(reply)
    }

    /// The path and JSON body of a completion in the provider's shape.
    fn body(&self, request: &Completion<'_>) -> (&'static str, Value) {
        match self.endpoint.provider {
            Provider::Anthropic => (
                "/messages",
                json!({
                    "model": request.model,
                    "max_tokens": request.max_tokens,
                    "temperature": request.temperature,
                    "system": anthropic_system(request),
                    "messages": [{"role": "user", "content": anthropic_user(request)}],
                }),
            ),
            Provider::Openai => {
                let mut body = json!({
                    "model": request.model,
                    "max_tokens": request.max_tokens,
                    "temperature": request.temperature,
                    "messages": [
                        {"role": "system", "content": request.system},
                        {"role": "user", "content": request.user},
                    ],
                });
                if let Some(key) = &request.cache.key {
                    body["prompt_cache_key"] = json!(key);
                }
                ("/chat/completions", body)
            }
        }
    }

    /// The error of a response with a failure status, its message read from
    /// the start of the body with the key redacted.
    async fn failed_status(&self, response: &mut reqwest::Response) -> LlmError {
        let retry_after = retry_after(response.headers(), SystemTime::now());
        // The start of the body, for its message; the status decides the
        // kind, even when the body breaks off.
        let body = read_body(response, MAX_ERROR_BODY_BYTES)
            .await
            .map_or_else(|_| Vec::new(), |(body, _)| body);
        // Some gateways echo the key they refused: it is redacted before
        // the message is cut, so no part of it survives the cut.
        let secret = self.endpoint.api_key.as_ref().map(ApiKey::expose);
        status_error(response.status().as_u16(), &body, retry_after, secret)
    }
}

/// A successful response's body as JSON, at most
/// [`MAX_RESPONSE_BODY_BYTES`] of it.
async fn json_body(response: &mut reqwest::Response) -> Result<Value, LlmError> {
    // A declared length over the cap fails before a byte is read.
    let declared_over = response
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BODY_BYTES as u64);
    let (body, complete) = if declared_over {
        (Vec::new(), false)
    } else {
        // After a success status the API has processed the request: a body
        // that breaks off now (reset, closed, a broken chunk, which reqwest
        // may report as a decode error) is `BodyBroken` (billed), not
        // `Connect`.
        read_body(response, MAX_RESPONSE_BODY_BYTES)
            .await
            .map_err(|e| match e {
                LlmError::Connect(cause) | LlmError::Malformed(cause) => LlmError::BodyBroken(cause),
                other => other,
            })?
    };
    if !complete {
        return Err(LlmError::Malformed(format!(
            "response body over {MAX_RESPONSE_BODY_BYTES} bytes"
        )));
    }
    serde_json::from_slice(&body).map_err(|e| LlmError::Malformed(format!("body is not JSON: {e}")))
}

/// Every certificate in the PEM file `path`, read by us rather than left to
/// the native loader: `rustls-native-certs` reads `SSL_CERT_FILE` *instead
/// of* the system store, and the client reads it from `LlmEnv`, not from the
/// process environment.
fn extra_roots(path: &Path) -> Result<Vec<reqwest::Certificate>, LlmError> {
    let fail = |reason: String| LlmError::CertFile {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| fail(format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(fail("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// Reads the body as it streams in, up to `cap` bytes: its first bytes and
/// whether that was all of it. The rest of a longer body is never read.
async fn read_body(response: &mut reqwest::Response, cap: usize) -> Result<(Vec<u8>, bool), LlmError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > cap {
            let room = cap - body.len();
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

fn transport_error(e: reqwest::Error) -> LlmError {
    if e.is_timeout() {
        LlmError::Timeout
    } else if e.is_decode() {
        LlmError::Malformed(e.to_string())
    } else {
        // Refused, reset, closed mid-body: the connection broke.
        LlmError::Connect(without_url(&e))
    }
}

/// reqwest errors print the URL, which may carry credentials in a proxy
/// setup; keep the cause only.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<endpoint>");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The wait the server asked for, as the official SDKs read it:
/// `retry-after-ms` (milliseconds) first, else `retry-after` in seconds or
/// as an HTTP-date (one in the past means no wait). Unparsable, negative or
/// out-of-range values count as absent.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let seconds = |s: f64| {
        (s.is_finite() && s >= 0.0)
            .then(|| Duration::try_from_secs_f64(s).ok())
            .flatten()
    };
    if let Some(wait) = header(RETRY_AFTER_MS)
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = header(RETRY_AFTER.as_str())?;
    match value.parse::<f64>() {
        Ok(s) => seconds(s),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            Some(at.duration_since(now).unwrap_or(Duration::ZERO))
        }
    }
}

/// The error of a failure status from its body: the kind and message of
/// `{"error": {...}}`, else the body's text. `secret` (the API key) is
/// redacted from the whole message first, then the message is cut to
/// [`MAX_ERROR_BODY_CHARS`]: a key the cut would split never shows a part.
fn status_error(status: u16, body: &[u8], retry_after: Option<Duration>, secret: Option<&str>) -> LlmError {
    if (300..400).contains(&status) {
        return LlmError::Status {
            status,
            kind: "redirect".into(),
            message: "redirects are not followed: the API key must not reach another host".into(),
            retry_after: None,
        };
    }
    // Both APIs put `{"error": {"type"|"code", "message"}}` in error bodies.
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let kind = error
        .and_then(|e| e.get("type").or_else(|| e.get("code")))
        .and_then(|t| t.as_str().map(str::to_string).or_else(|| Some(t.to_string())))
        .unwrap_or_else(|| "unknown".into());
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let message = match secret {
        Some(secret) if !secret.is_empty() => message.replace(secret, "<redacted>"),
        _ => message,
    };
    LlmError::Status {
        status,
        kind,
        message: super::prompt::truncate_chars(&message, MAX_ERROR_BODY_CHARS),
        retry_after,
    }
}

/// The window of `model` in a `/models` answer: `max_model_len` (vLLM),
/// `context_length` (OpenRouter) or `meta.n_ctx` of the entry whose `id` is
/// `model`, or of the only entry.
fn model_window(v: &Value, model: &str) -> Option<u32> {
    let data = v.get("data")?.as_array()?;
    let entry = data
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
        .or(if data.len() == 1 { data.first() } else { None })?;
    ["/max_model_len", "/context_length", "/meta/n_ctx"]
        .iter()
        .find_map(|p| entry.pointer(p).and_then(Value::as_u64))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
}

fn usage_field(v: &Value, path: &[&str]) -> u64 {
    reported(v, path).unwrap_or(0)
}

/// A usage field when the API reported it (absent or `null`: `None`).
fn reported(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_u64)
}

/// Anthropic's `cache_control` for a breakpoint of `request`.
fn cache_control(request: &Completion<'_>) -> Value {
    if request.cache.one_hour {
        json!({"type": "ephemeral", "ttl": "1h"})
    } else {
        json!({"type": "ephemeral"})
    }
}

/// The `system` of a Messages request: the string, or text blocks split at
/// the breakpoints, each marked block ending at one.
fn anthropic_system(request: &Completion<'_>) -> Value {
    let breaks = &request.cache.system_breaks;
    if breaks.is_empty() {
        return json!(request.system);
    }
    let mut blocks = Vec::new();
    let mut start = 0;
    for &end in breaks {
        let Some(text) = request.system.get(start..end).filter(|t| !t.is_empty()) else {
            continue;
        };
        blocks.push(json!({"type": "text", "text": text, "cache_control": cache_control(request)}));
        start = end;
    }
    if let Some(rest) = request.system.get(start..).filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "text", "text": rest}));
    }
    Value::Array(blocks)
}

/// The user message's `content`: the string, or the task section as a
/// marked block and the rest after it.
fn anthropic_user(request: &Completion<'_>) -> Value {
    let split = request
        .cache
        .task_break
        .and_then(|end| Some((request.user.get(..end)?, request.user.get(end..)?)))
        .filter(|(task, rest)| !task.is_empty() && !rest.is_empty());
    match split {
        None => json!(request.user),
        Some((task, rest)) => json!([
            {"type": "text", "text": task, "cache_control": cache_control(request)},
            {"type": "text", "text": rest},
        ]),
    }
}

fn anthropic_reply(v: &Value) -> Result<Reply, LlmError> {
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::Malformed("no `content` array".into()))?;
    let text = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("");
    Ok(Reply {
        text: text.trim().to_string(),
        // `input_tokens` is the uncached input; the cache parts are apart.
        usage: Usage {
            input_tokens: usage_field(v, &["usage", "input_tokens"]),
            output_tokens: usage_field(v, &["usage", "output_tokens"]),
            cache_read_input_tokens: reported(v, &["usage", "cache_read_input_tokens"]),
            cache_creation_input_tokens: reported(v, &["usage", "cache_creation_input_tokens"]),
        },
        stop_reason: v.get("stop_reason").and_then(Value::as_str).map(str::to_string),
    })
}

fn openai_reply(v: &Value) -> Result<Reply, LlmError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| LlmError::Malformed("no `choices[0]`".into()))?;
    let text = choice
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(Reply {
        text: text.trim().to_string(),
        usage: openai_usage(v),
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// OpenAI's usage: `prompt_tokens` includes the cached
/// `prompt_tokens_details.cached_tokens`, which is taken out as a read.
/// OpenAI bills no cache write.
fn openai_usage(v: &Value) -> Usage {
    let prompt = usage_field(v, &["usage", "prompt_tokens"]);
    let cached = reported(v, &["usage", "prompt_tokens_details", "cached_tokens"]).map(|c| c.min(prompt));
    Usage {
        input_tokens: prompt - cached.unwrap_or(0),
        output_tokens: usage_field(v, &["usage", "completion_tokens"]),
        cache_read_input_tokens: cached,
        cache_creation_input_tokens: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-ant-api03-unit-test-secret";

    fn endpoint() -> Endpoint {
        Endpoint {
            provider: Provider::Anthropic,
            base_url: "http://127.0.0.1:9".into(),
            api_key: Some(ApiKey::new(KEY)),
            ssl_cert_file: None,
        }
    }

    #[test]
    fn api_key_debug_hides_the_key() {
        let key = ApiKey::new(KEY);
        let shown = format!("{key:?}");
        assert!(!shown.contains(KEY) && shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn endpoint_debug_hides_the_key() {
        let shown = format!("{:?}", endpoint());
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("127.0.0.1:9"), "{shown}");
    }

    #[test]
    fn client_debug_hides_the_key() {
        let client = LlmClient::new(endpoint()).unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("Endpoint"), "{shown}");
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn reads_retry_after_as_the_sdks_do() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let read = |pairs: &[(&'static str, &str)]| retry_after(&headers(pairs), now);
        assert_eq!(read(&[("retry-after", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(read(&[("retry-after", "0.5")]), Some(Duration::from_millis(500)));
        assert_eq!(
            read(&[("retry-after-ms", "1500")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            read(&[("retry-after-ms", "250"), ("retry-after", "30")]),
            Some(Duration::from_millis(250)),
            "retry-after-ms takes precedence"
        );
        assert_eq!(
            read(&[("retry-after-ms", "soon"), ("retry-after", "3")]),
            Some(Duration::from_secs(3)),
            "an unparsable retry-after-ms falls back to retry-after"
        );
        let in_ten = httpdate::fmt_http_date(now + Duration::from_secs(10));
        assert_eq!(read(&[("retry-after", &in_ten)]), Some(Duration::from_secs(10)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(10));
        assert_eq!(read(&[("retry-after", &past)]), Some(Duration::ZERO));
        for bad in ["-1", "NaN", "inf", "1e300", "tomorrow"] {
            assert_eq!(read(&[("retry-after", bad)]), None, "{bad}");
        }
        assert_eq!(read(&[]), None);
    }

    #[test]
    fn retries_what_the_official_sdks_retry() {
        for status in [408, 409, 429, 500, 502, 503, 529] {
            assert!(status_error(status, b"{}", None, None).retryable(), "{status}");
        }
        for status in [301, 302, 307, 308, 400, 401, 403, 404, 422] {
            assert!(!status_error(status, b"{}", None, None).retryable(), "{status}");
        }
    }

    #[test]
    fn every_redirect_is_one_failure_reason() {
        for status in [300, 301, 302, 303, 307, 308] {
            let e = status_error(status, b"<html>moved</html>", Some(Duration::from_secs(1)), None);
            assert_eq!(e.failure_reason(), "http_3xx", "{status}");
            assert_eq!(e.retry_after(), None);
        }
        assert_eq!(status_error(408, b"{}", None, None).failure_reason(), "http_408");
    }

    #[test]
    fn a_bad_ssl_cert_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing-ca.pem");
        let empty = dir.path().join("no-certs.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n@@@@\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // Valid PEM and base64, but not a certificate.
        let not_der = dir.path().join("not-der.pem");
        std::fs::write(
            &not_der,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        for path in [missing, empty, broken, not_der] {
            let err = LlmClient::new(Endpoint {
                ssl_cert_file: Some(path.clone()),
                ..endpoint()
            })
            .unwrap_err();
            assert!(matches!(err, LlmError::CertFile { .. }), "{err:?}");
            assert!(err.is_config());
            assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        }
    }

    #[test]
    fn sorts_errors_into_failure_reasons() {
        let e = status_error(
            429,
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
            Some(Duration::from_secs(2)),
            None,
        );
        assert_eq!(e.failure_reason(), "http_429");
        assert!(e.retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(status_error(529, b"{}", None, None).failure_reason(), "http_529");
        assert_eq!(
            status_error(503, b"oops", None, None).failure_reason(),
            "http_5xx"
        );
        let bad_request = status_error(
            400,
            br#"{"error":{"type":"invalid_request_error","message":"max_tokens"}}"#,
            None,
            None,
        );
        assert!(!bad_request.retryable());
        assert!(bad_request.to_string().contains("invalid_request_error"));
    }

    #[test]
    fn a_key_the_cut_would_split_is_redacted_whole() {
        // The key starts at char 290: cutting at 300 first would keep its
        // first 10 characters, which no longer match the key.
        let message = format!("{}{KEY} was refused", "x".repeat(290));
        let body = json!({"error": {"type": "authentication_error", "message": message}}).to_string();
        let LlmError::Status { message, .. } = status_error(401, body.as_bytes(), None, Some(KEY)) else {
            panic!("not a status error");
        };
        assert!(message.contains("<redacted>"), "{message}");
        assert!(
            !message.contains(&KEY[..8]),
            "a part of the key survived: {message}"
        );
        assert!(message.chars().count() <= MAX_ERROR_BODY_CHARS + 3, "{message}");
    }

    #[test]
    fn a_broken_body_after_a_success_is_its_own_billed_kind() {
        let e = LlmError::BodyBroken("reset".into());
        assert_eq!(e.failure_reason(), "body_broken");
        assert!(e.retryable() && e.is_answer());
    }

    #[test]
    fn context_length_errors_of_each_server_are_recognized_with_their_window() {
        let openai = status_error(
            400,
            br#"{"error":{"message":"This model's maximum context length is 2048 tokens. However, you requested 3000 tokens (2700 in the messages, 300 in the completion).","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            None,
            None,
        );
        assert!(openai.is_context_length());
        assert_eq!(openai.failure_reason(), "context_length");
        assert_eq!(openai.context_limit(), Some(2048));
        let vllm = status_error(
            400,
            br#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, Please reduce the length of the messages.","type":"BadRequestError","param":null,"code":400}"#,
            None,
            None,
        );
        assert!(vllm.is_context_length());
        assert_eq!(vllm.context_limit(), Some(4096));
        let llama_cpp = status_error(
            400,
            br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#,
            None,
            None,
        );
        assert!(llama_cpp.is_context_length());
        assert_eq!(llama_cpp.failure_reason(), "context_length");
        let other = status_error(
            400,
            br#"{"error":{"type":"invalid_request_error","message":"max_tokens"}}"#,
            None,
            None,
        );
        assert!(!other.is_context_length());
        assert_eq!(other.failure_reason(), "http_400");
        assert!(!status_error(500, b"context length", None, None).is_context_length());
    }

    #[test]
    fn reads_a_models_window_from_vllm_and_openrouter_lists() {
        let vllm = json!({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 32768}]});
        assert_eq!(model_window(&vllm, "b"), Some(32768));
        assert_eq!(model_window(&vllm, "c"), None, "two entries, none named");
        let one = json!({"data": [{"id": "served-as-anything", "meta": {"n_ctx": 2048}}]});
        assert_eq!(model_window(&one, "smollm2"), Some(2048));
        let openrouter = json!({"data": [{"id": "x/y", "context_length": 200000}]});
        assert_eq!(model_window(&openrouter, "x/y"), Some(200000));
        assert_eq!(model_window(&json!({"data": [{"id": "m"}]}), "m"), None);
    }

    #[test]
    fn reads_both_reply_shapes() {
        let a = anthropic_reply(&json!({"content": [{"type": "text", "text": " hi "}], "usage": {"input_tokens": 5, "output_tokens": 2}, "stop_reason": "end_turn"})).unwrap();
        assert_eq!(
            (a.text.as_str(), a.usage.input_tokens, a.usage.output_tokens),
            ("hi", 5, 2)
        );
        let o = openai_reply(&json!({"choices": [{"message": {"content": "yo"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})).unwrap();
        assert_eq!((o.text.as_str(), o.usage.input_tokens), ("yo", 3));
        assert!(matches!(
            anthropic_reply(&json!({"id": 1})),
            Err(LlmError::Malformed(_))
        ));
    }

    #[test]
    fn cache_usage_is_read_as_each_provider_reports_it() {
        let a = anthropic_reply(&json!({"content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 50, "output_tokens": 2, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 0}})).unwrap();
        assert_eq!(a.usage.input_tokens, 50);
        assert_eq!(a.usage.cache_read_input_tokens, Some(2000));
        assert_eq!(
            a.usage.cache_creation_input_tokens,
            Some(0),
            "a reported 0 stays 0"
        );
        let unreported = anthropic_reply(&json!({"content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 5, "output_tokens": 2}})).unwrap();
        assert_eq!(
            unreported.usage.cache_read_input_tokens, None,
            "absent is unknown, not 0"
        );
        let o = openai_reply(&json!({"choices": [{"message": {"content": "yo"}}], "usage": {"prompt_tokens": 1500, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 1280}}})).unwrap();
        assert_eq!(o.usage.input_tokens, 220, "prompt_tokens less the cached ones");
        assert_eq!(o.usage.cache_read_input_tokens, Some(1280));
        assert_eq!(o.usage.cache_creation_input_tokens, None);
    }

    fn completion<'a>(system: &'a str, user: &'a str, cache: CacheMarks) -> Completion<'a> {
        Completion {
            model: "m",
            system,
            user,
            max_tokens: 10,
            temperature: 0.0,
            cache,
        }
    }

    #[test]
    fn breakpoints_split_the_system_and_the_task_into_marked_blocks() {
        let plain = completion("sys", "## Task\nx\n\n## Rest", CacheMarks::default());
        assert_eq!(anthropic_system(&plain), json!("sys"));
        assert_eq!(anthropic_user(&plain), json!("## Task\nx\n\n## Rest"));
        let marks = CacheMarks {
            system_breaks: vec![4, 9],
            task_break: Some(9),
            one_hour: true,
            key: None,
        };
        let marked = completion("base ctx env", "## Task\nx\n\n## Rest", marks);
        let ephemeral = json!({"type": "ephemeral", "ttl": "1h"});
        assert_eq!(
            anthropic_system(&marked),
            json!([
                {"type": "text", "text": "base", "cache_control": ephemeral},
                {"type": "text", "text": " ctx ", "cache_control": ephemeral},
                {"type": "text", "text": "env"},
            ])
        );
        assert_eq!(
            anthropic_user(&marked),
            json!([
                {"type": "text", "text": "## Task\nx", "cache_control": ephemeral},
                {"type": "text", "text": "\n\n## Rest"},
            ])
        );
    }
}
