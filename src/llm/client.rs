//! The only module that speaks HTTP: the Anthropic Messages API and
//! OpenAI-compatible chat completions (OpenRouter, vLLM, LiteLLM, Ollama),
//! over reqwest, with errors sorted into the kinds the retry policy and the
//! `failure_reason` of a hint use.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde_json::{json, Value};
use thiserror::Error;

use crate::messages::Usage;

/// The Anthropic API version header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Longest error body kept in an error message.
const MAX_ERROR_BODY_CHARS: usize = 300;

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
}

/// One completion request.
#[derive(Debug, Clone)]
pub struct Completion<'a> {
    pub model: &'a str,
    pub system: &'a str,
    pub user: &'a str,
    pub max_tokens: u32,
    pub temperature: f64,
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
}

impl LlmError {
    /// The short kind stamped on a hint's `failure_reason`.
    pub fn failure_reason(&self) -> String {
        match self {
            LlmError::Timeout => "timeout".into(),
            LlmError::Status { status: 429, .. } => "http_429".into(),
            LlmError::Status { status: 529, .. } => "http_529".into(),
            LlmError::Status { status, .. } if *status >= 500 => "http_5xx".into(),
            LlmError::Status { status, .. } => format!("http_{status}"),
            LlmError::Connect(_) => "connect".into(),
            LlmError::Malformed(_) => "malformed_response".into(),
            LlmError::Empty => "empty".into(),
            LlmError::NotInCassette { .. } => "cassette_miss".into(),
            LlmError::BudgetExhausted => "budget_exhausted".into(),
        }
    }

    /// Worth retrying: rate limits, overload, server errors, timeouts and
    /// broken connections. 4xx other than 429 and bad bodies are not.
    pub fn retryable(&self) -> bool {
        match self {
            LlmError::Timeout | LlmError::Connect(_) => true,
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::Malformed(_)
            | LlmError::Empty
            | LlmError::NotInCassette { .. }
            | LlmError::BudgetExhausted => false,
        }
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
    pub fn new(endpoint: Endpoint) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| LlmError::Connect(e.to_string()))?;
        Ok(LlmClient { http, endpoint })
    }

    pub fn provider(&self) -> Provider {
        self.endpoint.provider
    }

    /// One attempt, bounded by `timeout` (connect, send and body).
    pub async fn complete(&self, request: &Completion<'_>, timeout: Duration) -> Result<Reply, LlmError> {
        match tokio::time::timeout(timeout, self.attempt(request)).await {
            Ok(result) => result,
            Err(_) => Err(LlmError::Timeout),
        }
    }

    async fn attempt(&self, request: &Completion<'_>) -> Result<Reply, LlmError> {
        let base = self.endpoint.base_url.trim_end_matches('/');
        let builder = match self.endpoint.provider {
            Provider::Anthropic => {
                let mut b = self
                    .http
                    .post(format!("{base}/v1/messages"))
                    .header("anthropic-version", ANTHROPIC_VERSION)
                    .header("content-type", "application/json");
                if let Some(key) = &self.endpoint.api_key {
                    b = b.header("x-api-key", key.expose());
                }
                b.body(
                    json!({
                        "model": request.model,
                        "max_tokens": request.max_tokens,
                        "temperature": request.temperature,
                        "system": request.system,
                        "messages": [{"role": "user", "content": request.user}],
                    })
                    .to_string(),
                )
            }
            Provider::Openai => {
                let mut b = self
                    .http
                    .post(format!("{base}/chat/completions"))
                    .header("content-type", "application/json");
                if let Some(key) = &self.endpoint.api_key {
                    b = b.bearer_auth(key.expose());
                }
                b.body(
                    json!({
                        "model": request.model,
                        "max_tokens": request.max_tokens,
                        "temperature": request.temperature,
                        "messages": [
                            {"role": "system", "content": request.system},
                            {"role": "user", "content": request.user},
                        ],
                    })
                    .to_string(),
                )
            }
        };
        let response = builder.send().await.map_err(transport_error)?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(transport_error)?;
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &body, retry_after));
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| LlmError::Malformed(format!("body is not JSON: {e}")))?;
        let reply = match self.endpoint.provider {
            Provider::Anthropic => anthropic_reply(&value)?,
            Provider::Openai => openai_reply(&value)?,
        };
        if reply.text.trim().is_empty() {
            return Err(LlmError::Empty);
        }
        Ok(reply)
    }
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

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

fn status_error(status: u16, body: &[u8], retry_after: Option<Duration>) -> LlmError {
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
    LlmError::Status {
        status,
        kind,
        message: super::prompt::truncate_chars(&message, MAX_ERROR_BODY_CHARS),
        retry_after,
    }
}

fn usage_field(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
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
        usage: Usage {
            input_tokens: usage_field(v, &["usage", "input_tokens"]),
            output_tokens: usage_field(v, &["usage", "output_tokens"]),
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
        usage: Usage {
            input_tokens: usage_field(v, &["usage", "prompt_tokens"]),
            output_tokens: usage_field(v, &["usage", "completion_tokens"]),
        },
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_never_prints() {
        let key = ApiKey::new("sk-ant-secret");
        assert!(!format!("{key:?}").contains("secret"));
        let endpoint = Endpoint {
            provider: Provider::Anthropic,
            base_url: "x".into(),
            api_key: Some(key),
        };
        assert!(!format!("{endpoint:?}").contains("secret"));
    }

    #[test]
    fn sorts_errors_into_failure_reasons() {
        let e = status_error(
            429,
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
            Some(Duration::from_secs(2)),
        );
        assert_eq!(e.failure_reason(), "http_429");
        assert!(e.retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(status_error(529, b"{}", None).failure_reason(), "http_529");
        assert_eq!(status_error(503, b"oops", None).failure_reason(), "http_5xx");
        let bad_request = status_error(
            400,
            br#"{"error":{"type":"invalid_request_error","message":"max_tokens"}}"#,
            None,
        );
        assert!(!bad_request.retryable());
        assert!(bad_request.to_string().contains("invalid_request_error"));
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
}
