//! The only module that speaks HTTP: the Anthropic Messages API and
//! OpenAI-compatible chat completions (OpenRouter, vLLM, LiteLLM, Ollama),
//! over reqwest, with errors sorted into the kinds the retry policy and the
//! `failure_reason` of a hint use.
//!
//! - `endpoint`: where an API is, its key (never printed).
//! - `completion`: a request, with its cache marks, and its reply.
//! - `error`: [`LlmError`], the failure reasons and what is retried.
//! - `anthropic`, `openai`: each API's wire format.
//! - here: [`LlmClient`], the HTTP calls.
//!
//! Hardening: redirects are never followed (the key must not reach another
//! host), bodies are read up to a cap, the trust roots are the system store
//! plus the PEM file in `SSL_CERT_FILE`, and keys never print: no error a
//! client returns shows its key or its base URL's user, password or query.

mod anthropic;
mod completion;
mod endpoint;
mod error;
mod openai;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::Method;
use serde_json::Value;

pub use self::anthropic::ANTHROPIC_VERSION;
pub use self::completion::{CacheMarks, Completion, Reply};
pub use self::endpoint::{ApiKey, Endpoint, Provider, DEFAULT_ANTHROPIC_BASE_URL, DEFAULT_OPENAI_BASE_URL};
pub use self::error::LlmError;
use self::error::{retry_after, status_error, transport_error, without_url};

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

/// A model API client.
#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    endpoint: Endpoint,
    /// What its errors must not show (`Endpoint::secrets`).
    secrets: Arc<[String]>,
}

/// Shows the endpoint (see its `Debug`), never a secret.
impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
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
        let secrets: Arc<[String]> = endpoint.secrets().into();
        let http = builder.build().map_err(|e| match &endpoint.ssl_cert_file {
            // The extra roots are the part of the build that input decides.
            Some(path) => LlmError::CertFile {
                path: path.clone(),
                reason: without_url(&e),
            },
            None => LlmError::Connect(without_url(&e)).redacted(&secrets),
        })?;
        Ok(LlmClient {
            http,
            endpoint,
            secrets,
        })
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
            Ok(Err(e)) => Err(transport_error(e).redacted(&self.secrets)),
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
        if let Some(tokens) = models.as_ref().and_then(|v| openai::model_window(v, model)) {
            return Some(tokens);
        }
        let base = self.endpoint.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let mut props = self.http.get(format!("{root}/props"));
        if let Some(key) = &self.endpoint.api_key {
            props = props.bearer_auth(key.expose());
        }
        openai::props_window(&self.get_json(props).await?)
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
            Ok(result) => result.map_err(|e| e.redacted(&self.secrets)),
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
            Provider::Anthropic => anthropic::reply(&value)?,
            Provider::Openai => openai::reply(&value)?,
        };
        if reply.text.trim().is_empty() {
            return Err(LlmError::Empty);
        }
        Ok(reply)
    }

    /// The path and JSON body of a completion in the provider's shape.
    fn body(&self, request: &Completion<'_>) -> (&'static str, Value) {
        match self.endpoint.provider {
            Provider::Anthropic => (anthropic::PATH, anthropic::body(request)),
            Provider::Openai => (openai::PATH, openai::body(request)),
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
        // Some gateways echo the key they refused, or the request's URL:
        // they are redacted before the message is cut, so no part of them
        // survives the cut.
        status_error(response.status().as_u16(), &body, retry_after, &self.secrets)
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
    fn client_debug_hides_the_key() {
        let client = LlmClient::new(endpoint()).unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("Endpoint"), "{shown}");
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
}
