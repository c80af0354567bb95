//! The error taxonomy of a model call: the kinds the retry policy and a
//! hint's `failure_reason` use, the server's `retry-after`, and the errors
//! of failure statuses and transports, with secrets kept out of them: the
//! endpoint's (its key, its base URL's user, password and query) wherever
//! they appear, and the user info and query of any URL.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde_json::Value;
use thiserror::Error;

use crate::config::{redact_urls, REDACTED};
use crate::llm::context::ContextError;
use crate::llm::prompt::truncate_chars;

/// Longest error body kept in an error message.
const MAX_ERROR_BODY_CHARS: usize = 300;
/// The header the official SDKs read first: the wait in milliseconds.
const RETRY_AFTER_MS: &str = "retry-after-ms";

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

impl From<ContextError> for LlmError {
    fn from(e: ContextError) -> Self {
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

    /// This error with `secrets` (and URLs' user info and queries) taken
    /// out of its text: every error a client returns passes here.
    pub(super) fn redacted(self, secrets: &[String]) -> LlmError {
        match self {
            LlmError::Status {
                status,
                kind,
                message,
                retry_after,
            } => LlmError::Status {
                status,
                kind: redact(&kind, secrets),
                message: redact(&message, secrets),
                retry_after,
            },
            LlmError::Connect(text) => LlmError::Connect(redact(&text, secrets)),
            LlmError::BodyBroken(text) => LlmError::BodyBroken(redact(&text, secrets)),
            LlmError::Malformed(text) => LlmError::Malformed(redact(&text, secrets)),
            other => other,
        }
    }
}

/// `text` with each of `secrets` (longest first) replaced by the redaction
/// marker, then the user info and query of every URL in it.
pub(super) fn redact(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), REDACTED);
        }
    }
    redact_urls(&text).into_owned()
}

/// The error of a request that got no complete answer, its text without
/// the request's URL (see [`without_url`]) whatever its kind.
pub(super) fn transport_error(e: reqwest::Error) -> LlmError {
    if e.is_timeout() {
        LlmError::Timeout
    } else if e.is_decode() {
        LlmError::Malformed(without_url(&e))
    } else {
        // Refused, reset, closed mid-body: the connection broke.
        LlmError::Connect(without_url(&e))
    }
}

/// reqwest errors print the URL, whose query may carry a secret (its user
/// info, moved to a header, would not; a proxy's URL may carry both): the
/// cause only, with the user info and query of any URL left in it (a
/// proxy's) redacted.
pub(super) fn without_url(e: &reqwest::Error) -> String {
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
    redact_urls(&text).into_owned()
}

/// The wait the server asked for, as the official SDKs read it:
/// `retry-after-ms` (milliseconds) first, else `retry-after` in seconds or
/// as an HTTP-date (one in the past means no wait). Unparsable, negative or
/// out-of-range values count as absent.
pub(super) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
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
/// `{"error": {...}}`, else the body's text. `secrets` (the endpoint's:
/// see `Endpoint::secrets`) are redacted from the whole message first,
/// then the message is cut to [`MAX_ERROR_BODY_CHARS`]: a secret the cut
/// would split never shows a part.
pub(super) fn status_error(
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
    secrets: &[String],
) -> LlmError {
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
    LlmError::Status {
        status,
        kind: redact(&kind, secrets),
        message: truncate_chars(&redact(&message, secrets), MAX_ERROR_BODY_CHARS),
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const KEY: &str = "sk-ant-api03-unit-test-secret";

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
            assert!(status_error(status, b"{}", None, &[]).retryable(), "{status}");
        }
        for status in [301, 302, 307, 308, 400, 401, 403, 404, 422] {
            assert!(!status_error(status, b"{}", None, &[]).retryable(), "{status}");
        }
    }

    #[test]
    fn every_redirect_is_one_failure_reason() {
        for status in [300, 301, 302, 303, 307, 308] {
            let e = status_error(status, b"<html>moved</html>", Some(Duration::from_secs(1)), &[]);
            assert_eq!(e.failure_reason(), "http_3xx", "{status}");
            assert_eq!(e.retry_after(), None);
        }
        assert_eq!(status_error(408, b"{}", None, &[]).failure_reason(), "http_408");
    }

    #[test]
    fn sorts_errors_into_failure_reasons() {
        let e = status_error(
            429,
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
            Some(Duration::from_secs(2)),
            &[],
        );
        assert_eq!(e.failure_reason(), "http_429");
        assert!(e.retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(status_error(529, b"{}", None, &[]).failure_reason(), "http_529");
        assert_eq!(status_error(503, b"oops", None, &[]).failure_reason(), "http_5xx");
        let bad_request = status_error(
            400,
            br#"{"error":{"type":"invalid_request_error","message":"max_tokens"}}"#,
            None,
            &[],
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
        let LlmError::Status { message, .. } = status_error(401, body.as_bytes(), None, &[KEY.to_string()])
        else {
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
    fn an_echoed_url_and_its_user_password_and_query_are_redacted() {
        let secrets = vec![
            "hs-pass-word".to_string(),
            "sig=q-s3cret".to_string(),
            "q-s3cret".to_string(),
            "hs-user".to_string(),
        ];
        let body = br#"{"error":{"type":"not_found","message":"no route POST /v1?sig=q-s3cret for hs-user (http://hs-user:hs-pass-word@gw/v1?sig=q-s3cret); see https://docs/x?token=T0K"}}"#;
        let e = status_error(404, body, None, &secrets);
        let shown = e.to_string();
        for secret in ["hs-pass-word", "hs-user", "q-s3cret", "T0K"] {
            assert!(!shown.contains(secret), "{secret}: {shown}");
        }
        assert!(
            shown.contains("no route POST /v1?<redacted> for <redacted>"),
            "{shown}"
        );
        let e = LlmError::Malformed(
            "error decoding response body for url (http://gw/v1?key=abcd): hs-user".into(),
        );
        assert_eq!(
            e.redacted(&secrets).to_string(),
            "malformed response: error decoding response body for url (http://gw/v1?<redacted>): <redacted>"
        );
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
            &[],
        );
        assert!(openai.is_context_length());
        assert_eq!(openai.failure_reason(), "context_length");
        assert_eq!(openai.context_limit(), Some(2048));
        let vllm = status_error(
            400,
            br#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, Please reduce the length of the messages.","type":"BadRequestError","param":null,"code":400}"#,
            None,
            &[],
        );
        assert!(vllm.is_context_length());
        assert_eq!(vllm.context_limit(), Some(4096));
        let llama_cpp = status_error(
            400,
            br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#,
            None,
            &[],
        );
        assert!(llama_cpp.is_context_length());
        assert_eq!(llama_cpp.failure_reason(), "context_length");
        let other = status_error(
            400,
            br#"{"error":{"type":"invalid_request_error","message":"max_tokens"}}"#,
            None,
            &[],
        );
        assert!(!other.is_context_length());
        assert_eq!(other.failure_reason(), "http_400");
        assert!(!status_error(500, b"context length", None, &[]).is_context_length());
    }
}
