//! From a failed trajectory to a hint: the model chain with retries inside a
//! per-hint time budget (exponential backoff with jitter, never shorter than
//! the server's `retry-after`), a concurrency bound on calls in flight,
//! optional request and token rate limits, and the static fallback. Each
//! HTTP attempt is an `llm_attempt` span (model, status, retry wait).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;
use tracing::field::Empty;
use tracing::Instrument;

use super::budget::{Remaining, SpendBudget};
use super::cassette::{request_key, Attempt, AttemptOutcome, Call, Cassette, CassetteMode};
use super::client::{
    ApiKey, Completion, Endpoint, LlmClient, LlmError, Provider, DEFAULT_ANTHROPIC_BASE_URL,
    DEFAULT_OPENAI_BASE_URL,
};
use super::prompt::{feedback, static_hint, user_prompt, PROMPT_VERSION, SYSTEM_PROMPT};
use crate::config::{LlmConfig, LlmProvider, ModelPrice};
use crate::messages::{FailedTrajectory, HintCategory, Usage};

pub const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-20250514";
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// What happened to one attempt, for metrics.
pub trait SynthObserver: Send + Sync {
    /// One HTTP attempt ended: `status` is `ok` or a failure reason.
    fn attempt(&self, model: &str, status: &str, latency: Duration);
    fn retry(&self, model: &str, reason: &str);
    fn calls_in_flight(&self, n: usize);
    /// What is left of the spend budgets, after each change.
    fn budget(&self, _remaining: Remaining) {}
}

/// The result of synthesis for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Synthesis {
    pub hint: String,
    pub category: HintCategory,
    pub model: Option<String>,
    pub usage: Usage,
    pub cost_usd: f64,
    pub failure_reason: Option<String>,
    pub latency_ms: u64,
}

/// Environment the endpoint is resolved from (the official SDKs' variables).
/// Its `Debug` shows whether a key is set, never the key.
#[derive(Clone, Default)]
pub struct LlmEnv {
    pub anthropic_api_key: Option<String>,
    pub anthropic_base_url: Option<String>,
    pub openai_api_key: Option<String>,
    pub openai_base_url: Option<String>,
    /// `OPENROUTER_API_KEY` and `OPENROUTER_BASE_URL` (default
    /// `https://openrouter.ai/api/v1`), as litellm reads them.
    pub openrouter_api_key: Option<String>,
    pub openrouter_base_url: Option<String>,
    /// `SSL_CERT_FILE`: a PEM file whose certificates the LLM client trusts
    /// besides the system store. A field rather than a read of the process
    /// environment at client construction, so one process can build clients
    /// with different roots (tests do).
    pub ssl_cert_file: Option<PathBuf>,
}

impl std::fmt::Debug for LlmEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = |k: &Option<String>| if k.is_some() { "<redacted>" } else { "<unset>" };
        f.debug_struct("LlmEnv")
            .field("anthropic_api_key", &key(&self.anthropic_api_key))
            .field("anthropic_base_url", &self.anthropic_base_url)
            .field("openai_api_key", &key(&self.openai_api_key))
            .field("openai_base_url", &self.openai_base_url)
            .field("openrouter_api_key", &key(&self.openrouter_api_key))
            .field("openrouter_base_url", &self.openrouter_base_url)
            .field("ssl_cert_file", &self.ssl_cert_file)
            .finish()
    }
}

impl LlmEnv {
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        LlmEnv {
            anthropic_api_key: var("ANTHROPIC_API_KEY"),
            anthropic_base_url: var("ANTHROPIC_BASE_URL"),
            openai_api_key: var("OPENAI_API_KEY"),
            openai_base_url: var("OPENAI_BASE_URL"),
            openrouter_api_key: var("OPENROUTER_API_KEY"),
            openrouter_base_url: var("OPENROUTER_BASE_URL"),
            ssl_cert_file: var("SSL_CERT_FILE").map(PathBuf::from),
        }
    }
}

/// One model of the chain: the id as configured, the name its API knows it
/// by, and the client of that API.
#[derive(Debug)]
struct Link {
    id: String,
    api_model: String,
    client: LlmClient,
}

/// The APIs a model id can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    Anthropic,
    Openai,
    Openrouter,
}

/// The default OpenRouter base URL (litellm's).
pub const DEFAULT_OPENROUTER_BASE_URL: &str = "https://openrouter.ai/api/v1";
/// The reference trainer's model, on OpenRouter.
pub const DEFAULT_OPENROUTER_MODEL: &str = "anthropic/claude-sonnet-4";

/// The API and model name of a litellm-style id (`openrouter/anthropic/
/// claude-sonnet-4`, `anthropic/claude-...`, `openai/gpt-...`); an id
/// without such a prefix goes to `default`.
fn route_of(id: &str, default: Option<Route>) -> Option<(Route, &str)> {
    [
        ("openrouter/", Route::Openrouter),
        ("anthropic/", Route::Anthropic),
        ("openai/", Route::Openai),
    ]
    .into_iter()
    .find_map(|(prefix, route)| id.strip_prefix(prefix).map(|rest| (route, rest)))
    .or_else(|| default.map(|route| (route, id)))
}

pub struct Synthesizer {
    /// Empty: static hints only.
    chain: Vec<Link>,
    /// The configured ids of the chain.
    models: Vec<String>,
    config: LlmConfig,
    calls: Arc<Semaphore>,
    requests: Option<DefaultDirectRateLimiter>,
    tokens: Option<Arc<DefaultDirectRateLimiter>>,
    observer: Option<Arc<dyn SynthObserver>>,
    cassette: Option<Arc<Cassette>>,
    budget: Option<SpendBudget>,
    /// Set once a model API answered anything (readiness).
    answered: AtomicBool,
}

/// Shows the client (its key redacted by `ApiKey`), the model chain and the
/// cassette; never a key.
impl std::fmt::Debug for Synthesizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Synthesizer")
            .field("chain", &self.chain)
            .field("models", &self.models)
            .field("concurrency", &self.config.concurrency)
            .field("cassette", &self.cassette)
            .field("budget", &self.budget.is_some())
            .finish_non_exhaustive()
    }
}

/// How long a synthesis took: the recorded time of calls played from a
/// cassette, plus real time when any call went to the API.
#[derive(Default)]
struct Clock {
    played_ms: u64,
    live: bool,
}

impl Clock {
    fn latency_ms(&self, started: Instant) -> u64 {
        let real = if self.live {
            started.elapsed().as_millis() as u64
        } else {
            0
        };
        self.played_ms + real
    }
}

impl Synthesizer {
    /// Resolves the model chain (each model's API, endpoint and key) from
    /// the config and env. With `provider = "auto"`, litellm-style ids pick
    /// their API (`openrouter/…`, `anthropic/…`, `openai/…`); with a named
    /// provider every id goes to it as written. A model whose API has no key
    /// is left out with a warning; an empty chain means static hints.
    pub fn new(config: &LlmConfig, env: &LlmEnv) -> Result<Self, LlmError> {
        let auto = config.provider == LlmProvider::Auto;
        let default = match config.provider {
            LlmProvider::Anthropic => Some(Route::Anthropic),
            LlmProvider::Openai => Some(Route::Openai),
            LlmProvider::Openrouter => Some(Route::Openrouter),
            LlmProvider::None => None,
            LlmProvider::Auto if env.anthropic_api_key.is_some() => Some(Route::Anthropic),
            LlmProvider::Auto if env.openrouter_api_key.is_some() => Some(Route::Openrouter),
            LlmProvider::Auto if env.openai_api_key.is_some() || env.openai_base_url.is_some() => {
                Some(Route::Openai)
            }
            LlmProvider::Auto => None,
        };
        let models = if !config.models.is_empty() {
            config.models.clone()
        } else {
            vec![match default {
                Some(Route::Openai) => DEFAULT_OPENAI_MODEL.to_string(),
                Some(Route::Openrouter) => DEFAULT_OPENROUTER_MODEL.to_string(),
                _ => DEFAULT_ANTHROPIC_MODEL.to_string(),
            }]
        };
        let mut clients: std::collections::HashMap<Route, LlmClient> = std::collections::HashMap::new();
        let mut chain = Vec::new();
        if config.provider != LlmProvider::None {
            for id in &models {
                let routed = if auto {
                    route_of(id, default)
                } else {
                    default.map(|r| (r, id.as_str()))
                };
                let Some((route, api_model)) = routed else {
                    continue;
                };
                let (key, env_url, default_url, provider) = match route {
                    Route::Anthropic => (
                        &env.anthropic_api_key,
                        &env.anthropic_base_url,
                        DEFAULT_ANTHROPIC_BASE_URL,
                        Provider::Anthropic,
                    ),
                    Route::Openai => (
                        &env.openai_api_key,
                        &env.openai_base_url,
                        DEFAULT_OPENAI_BASE_URL,
                        Provider::Openai,
                    ),
                    Route::Openrouter => (
                        &env.openrouter_api_key,
                        &env.openrouter_base_url,
                        DEFAULT_OPENROUTER_BASE_URL,
                        Provider::Openai,
                    ),
                };
                // A local OpenAI-compatible server needs no key; the hosted
                // APIs do.
                let usable = key.is_some()
                    || (route == Route::Openai && env_url.is_some())
                    || (route == Route::Openai && !config.base_url.is_empty());
                if !usable {
                    tracing::warn!(model = %id, api = ?route, "no API key for this model's API; leaving it out of the chain");
                    continue;
                }
                let client = match clients.get(&route) {
                    Some(c) => c.clone(),
                    None => {
                        // llm.base_url is for the provider the config names
                        // (or models without a prefix).
                        let configured = (Some(route) == default)
                            .then(|| config.base_url.clone())
                            .filter(|u| !u.is_empty());
                        let base_url = configured
                            .or_else(|| env_url.clone())
                            .unwrap_or_else(|| default_url.to_string());
                        let client = LlmClient::new(Endpoint {
                            provider,
                            base_url,
                            api_key: key.clone().map(ApiKey::new),
                            ssl_cert_file: env.ssl_cert_file.clone(),
                        })?;
                        clients.insert(route, client.clone());
                        client
                    }
                };
                chain.push(Link {
                    id: id.clone(),
                    api_model: api_model.to_string(),
                    client,
                });
            }
        }
        let per_minute = |n: u32| NonZeroU32::new(n).map(|n| RateLimiter::direct(Quota::per_minute(n)));
        Ok(Synthesizer {
            chain,
            models,
            config: config.clone(),
            calls: Arc::new(Semaphore::new(config.concurrency)),
            requests: per_minute(config.requests_per_minute),
            tokens: per_minute(config.tokens_per_minute).map(Arc::new),
            observer: None,
            cassette: None,
            budget: SpendBudget::new(config.budget_usd_per_hour, config.budget_tokens_per_hour),
            answered: AtomicBool::new(false),
        })
    }

    /// Whether hints can come from where they are configured to: a model
    /// API answered once (any HTTP response, from a synthesis or
    /// [`Synthesizer::probe`]), or there is no model (static hints).
    pub fn provider_answered(&self) -> bool {
        self.chain.is_empty() || self.answered.load(Ordering::Relaxed)
    }

    /// Asks each API of the chain for something free (its model list) until
    /// one answers, each within `timeout`; true once any API answered, now
    /// or before.
    pub async fn probe(&self, timeout: Duration) -> bool {
        if self.provider_answered() {
            return true;
        }
        let mut asked: Vec<Provider> = Vec::new();
        for link in &self.chain {
            // One client per API.
            if asked.contains(&link.client.provider()) {
                continue;
            }
            asked.push(link.client.provider());
            match link.client.probe(timeout).await {
                Ok(status) => {
                    tracing::info!(model = %link.id, status, "the LLM provider answered");
                    self.answered.store(true, Ordering::Relaxed);
                    return true;
                }
                Err(e) => {
                    tracing::debug!(model = %link.id, reason = %e.failure_reason(), error = %e, "the LLM provider did not answer")
                }
            }
        }
        false
    }

    pub fn with_observer(mut self, observer: Arc<dyn SynthObserver>) -> Self {
        if let Some(budget) = &self.budget {
            observer.budget(budget.remaining());
        }
        self.observer = Some(observer);
        self
    }

    /// Records calls into, or answers them from, `cassette`.
    pub fn with_cassette(mut self, cassette: Arc<Cassette>) -> Self {
        self.cassette = Some(cassette);
        self
    }

    /// Whether hints come from a model (false: static hints only).
    pub fn has_model(&self) -> bool {
        !self.chain.is_empty()
    }

    /// The model chain, in order, as configured (models left out for want
    /// of a key are not in it).
    pub fn models(&self) -> Vec<String> {
        self.chain.iter().map(|l| l.id.clone()).collect()
    }

    /// A human-readable line on where hints come from (no secrets).
    pub fn describe(&self) -> String {
        if self.chain.is_empty() {
            return "no API key set (ANTHROPIC_API_KEY / OPENROUTER_API_KEY / OPENAI_API_KEY): publishing static hints built from verifier feedback".into();
        }
        let links: Vec<String> = self
            .chain
            .iter()
            .map(|l| format!("{} ({:?} API)", l.id, l.client.provider()))
            .collect();
        format!("models {}, then static fallback", links.join(", "))
    }

    /// The deterministic id of a group's hint: the same group, prompt version
    /// and model chain give the same id, so redelivered work deduplicates.
    pub fn hint_id(&self, group_key: &str) -> String {
        use sha2::{Digest, Sha256};
        let chain = if self.chain.is_empty() {
            "static".into()
        } else {
            self.models.join(",")
        };
        let digest = Sha256::digest(format!("{group_key}\u{0}{PROMPT_VERSION}\u{0}{chain}").as_bytes());
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Synthesizes the hint for `t`, the best trajectory of its group.
    pub async fn synthesize(&self, t: &FailedTrajectory) -> Synthesis {
        let started = Instant::now();
        let fb = feedback(t);
        if self.chain.is_empty() {
            return Synthesis {
                hint: static_hint(&fb),
                category: HintCategory::StaticFallback,
                model: None,
                usage: Usage::default(),
                cost_usd: 0.0,
                failure_reason: None,
                latency_ms: started.elapsed().as_millis() as u64,
            };
        };
        // The config bounds timeout_secs; a value past Duration's range
        // would mean "no deadline", which the bound rules out.
        let budget =
            Duration::try_from_secs_f64(self.config.timeout_secs).unwrap_or(Duration::from_secs(600));
        let deadline = started + budget;
        let user = user_prompt(t, &fb);
        let mut usage = Usage::default();
        let mut clock = Clock::default();
        let mut last_error = LlmError::Timeout;
        for (i, link) in self.chain.iter().enumerate() {
            let first = i == 0;
            let model = &link.id;
            let Some(result) = self
                .call_model(link, &user, first, deadline, &mut usage, &mut clock)
                .await
            else {
                break;
            };
            match result {
                Ok(text) => {
                    return Synthesis {
                        hint: text,
                        category: HintCategory::LlmSynthesized,
                        model: Some(model.clone()),
                        cost_usd: self.cost(&usage, model),
                        usage,
                        failure_reason: None,
                        latency_ms: clock.latency_ms(started),
                    }
                }
                Err(e) => {
                    tracing::warn!(model = %model, reason = %e.failure_reason(), error = %e, "model failed; trying the next in the chain");
                    last_error = e;
                }
            }
            if Instant::now() >= deadline
                || matches!(
                    last_error,
                    LlmError::NotInCassette { .. } | LlmError::BudgetExhausted
                )
            {
                break;
            }
        }
        Synthesis {
            hint: static_hint(&fb),
            category: HintCategory::LlmFailedStaticFallback,
            model: None,
            cost_usd: self.cost(&usage, self.chain.first().map_or("", |l| l.id.as_str())),
            usage,
            failure_reason: Some(last_error.failure_reason()),
            latency_ms: clock.latency_ms(started),
        }
    }

    fn request<'a>(&'a self, model: &'a str, user: &'a str) -> Completion<'a> {
        Completion {
            model,
            system: SYSTEM_PROMPT,
            user,
            max_tokens: self.config.max_tokens,
            temperature: self.config.temperature,
        }
    }

    /// One model of the chain: from the cassette when it plays and holds the
    /// request, else from the API (recorded when a cassette is attached).
    /// `None` in playback when the cassette never saw a later model of the
    /// chain: the recorded run stopped there (its time budget ran out).
    #[allow(clippy::too_many_arguments)]
    async fn call_model(
        &self,
        link: &Link,
        user: &str,
        first: bool,
        deadline: Instant,
        usage: &mut Usage,
        clock: &mut Clock,
    ) -> Option<Result<String, LlmError>> {
        let (client, model) = (&link.client, link.id.as_str());
        let request = self.request(&link.api_model, user);
        let Some(cassette) = &self.cassette else {
            clock.live = true;
            return Some(
                self.call_with_retries(client, model, &request, deadline, usage, None)
                    .await,
            );
        };
        let key = request_key(client.provider(), &request);
        if cassette.plays() {
            if let Some(call) = cassette.play(&key) {
                return Some(self.replay(&call, usage, clock));
            }
            if !first {
                return None;
            }
            if cassette.mode() == CassetteMode::Strict {
                return Some(Err(LlmError::NotInCassette { model: model.into() }));
            }
        }
        clock.live = true;
        let started = Instant::now();
        let mut attempts = Vec::new();
        let result = self
            .call_with_retries(client, model, &request, deadline, usage, Some(&mut attempts))
            .await;
        let call = Call {
            key,
            provider: client.provider(),
            model: model.into(),
            attempts,
            elapsed_ms: started.elapsed().as_millis() as u64,
        };
        if let Err(e) = cassette.append(call) {
            tracing::warn!(cassette = %cassette.path().display(), error = %e, "cannot append to the cassette");
        }
        Some(result)
    }

    /// Replays a recorded call attempt by attempt: the same outcomes and
    /// retry decisions, the recorded time, no sleeping.
    fn replay(&self, call: &Call, usage: &mut Usage, clock: &mut Clock) -> Result<String, LlmError> {
        clock.played_ms += call.elapsed_ms;
        let mut last_error = LlmError::Timeout;
        for attempt in &call.attempts {
            let status = attempt.outcome.status();
            if let Some(o) = &self.observer {
                o.attempt(&call.model, &status, Duration::from_millis(attempt.latency_ms));
            }
            match &attempt.outcome {
                AttemptOutcome::Reply { text, usage: u, .. } => {
                    usage.input_tokens += u.input_tokens;
                    usage.output_tokens += u.output_tokens;
                    return Ok(text.clone());
                }
                AttemptOutcome::Error(e) => {
                    if attempt.retry_in_ms.is_some() {
                        if let Some(o) = &self.observer {
                            o.retry(&call.model, &status);
                        }
                    }
                    last_error = e.clone();
                }
            }
        }
        Err(last_error)
    }

    /// Calls one model until it answers, fails for good, runs out of retries
    /// or the deadline nears. When recording, every attempt is pushed onto
    /// `attempts`.
    async fn call_with_retries(
        &self,
        client: &LlmClient,
        // The model's configured id: metrics and prices go by it.
        model: &str,
        request: &Completion<'_>,
        deadline: Instant,
        usage: &mut Usage,
        mut attempts: Option<&mut Vec<Attempt>>,
    ) -> Result<String, LlmError> {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(8))
            .with_jitter()
            .with_max_times(self.config.max_retries as usize)
            .build();
        let mut attempt = 0u32;
        loop {
            // Waiting for the rate limits and for a free call slot is part
            // of the hint's time budget.
            if tokio::time::timeout_at(deadline.into(), self.wait_for_rate(request.user))
                .await
                .is_err()
            {
                return Err(LlmError::Timeout);
            }
            let permit = match tokio::time::timeout_at(deadline.into(), self.calls.acquire()).await {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed.
                Ok(Err(_)) => return Err(LlmError::Connect("shutting down".into())),
                Err(_) => return Err(LlmError::Timeout),
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(LlmError::Timeout);
            }
            let reservation = match &self.budget {
                None => None,
                Some(budget) => {
                    let tokens = self.estimate_tokens(request.user);
                    let usd = self.price(model).map_or(0.0, |p| {
                        (self.estimate_input_tokens(request.user) as f64 * p.input_per_mtok
                            + f64::from(self.config.max_tokens) * p.output_per_mtok)
                            / 1e6
                    });
                    match budget.reserve(usd, tokens) {
                        Ok(r) => Some(r),
                        Err(_) => {
                            self.observe_budget();
                            return Err(LlmError::BudgetExhausted);
                        }
                    }
                }
            };
            let attempt_started = Instant::now();
            attempt += 1;
            let span = tracing::info_span!(
                "llm_attempt",
                otel.kind = "client",
                otel.status_code = Empty,
                model,
                attempt = i64::from(attempt),
                status = Empty,
                retry_wait_ms = Empty,
            );
            self.observe_in_flight();
            let result = client.complete(request, remaining).instrument(span.clone()).await;
            drop(permit);
            self.observe_in_flight();
            if result.as_ref().err().is_none_or(LlmError::is_answer) {
                self.answered.store(true, Ordering::Relaxed);
            }
            if let Some(reservation) = reservation {
                match &result {
                    Ok(reply) => reservation.settle(
                        self.cost(&reply.usage, model),
                        reply.usage.input_tokens + reply.usage.output_tokens,
                    ),
                    // The API refused it: nothing was processed.
                    Err(LlmError::Status { .. } | LlmError::Connect(_)) => reservation.release(),
                    // Processed, maybe billed, cost unknown (an empty or
                    // malformed reply, a timeout after sending).
                    Err(_) => reservation.charge_estimate(),
                }
                self.observe_budget();
            }
            let status = result
                .as_ref()
                .map_or_else(LlmError::failure_reason, |_| "ok".to_string());
            span.record("status", status.as_str());
            if result.is_err() {
                span.record("otel.status_code", "error");
            }
            if let Some(o) = &self.observer {
                o.attempt(model, &status, attempt_started.elapsed());
            }
            if let Some(attempts) = attempts.as_deref_mut() {
                attempts.push(Attempt {
                    outcome: AttemptOutcome::from_result(&result),
                    latency_ms: attempt_started.elapsed().as_millis() as u64,
                    retry_in_ms: None,
                });
            }
            let error = match result {
                Ok(reply) => {
                    usage.input_tokens += reply.usage.input_tokens;
                    usage.output_tokens += reply.usage.output_tokens;
                    self.charge_tokens(reply.usage, request.user);
                    return Ok(reply.text);
                }
                Err(e) => e,
            };
            if !error.retryable() {
                return Err(error);
            }
            let Some(delay) = backoff.next() else {
                return Err(error);
            };
            // Never retry sooner than the server asked. (Compared with what
            // is left, not added to now: a server's wait may be huge.)
            let delay = error.retry_after().map_or(delay, |after| after.max(delay));
            if delay >= deadline.saturating_duration_since(Instant::now()) {
                return Err(error);
            }
            if let Some(o) = &self.observer {
                o.retry(model, &error.failure_reason());
            }
            if let Some(last) = attempts.as_deref_mut().and_then(|a| a.last_mut()) {
                last.retry_in_ms = Some(delay.as_millis() as u64);
            }
            span.record("retry_wait_ms", delay.as_millis() as i64);
            tracing::debug!(parent: &span, model, reason = %error.failure_reason(), delay_ms = delay.as_millis() as u64, "retrying LLM call");
            // The attempt ends here; the wait is not part of it.
            drop(span);
            tokio::time::sleep(delay).await;
        }
    }

    fn observe_in_flight(&self) {
        if let Some(o) = &self.observer {
            o.calls_in_flight(self.config.concurrency - self.calls.available_permits());
        }
    }

    /// Reports what is left of the spend budgets to the observer (the
    /// window rolls on while idle).
    pub fn report_budget(&self) {
        self.observe_budget();
    }

    fn observe_budget(&self) {
        if let (Some(budget), Some(o)) = (&self.budget, &self.observer) {
            o.budget(budget.remaining());
        }
    }

    /// The prompt's estimated size in tokens: 3 bytes a token, on the high
    /// side for code, JSON and non-Latin text (English prose is nearer 4),
    /// so that concurrent reservations do not overshoot a budget.
    fn estimate_input_tokens(&self, user: &str) -> u64 {
        ((user.len() + SYSTEM_PROMPT.len()) / 3) as u64
    }

    /// An attempt's estimated tokens: the prompt plus the output allowance.
    fn estimate_tokens(&self, user: &str) -> u64 {
        self.estimate_input_tokens(user) + u64::from(self.config.max_tokens)
    }

    /// Waits for the request limit, and for the token limit with the
    /// attempt's estimated tokens.
    async fn wait_for_rate(&self, user: &str) {
        if let Some(limiter) = &self.requests {
            limiter.until_ready().await;
        }
        if let Some(limiter) = &self.tokens {
            let estimate = self.estimate_tokens(user).min(u64::from(u32::MAX)) as u32;
            take_tokens(limiter, self.config.tokens_per_minute, estimate).await;
        }
    }

    /// After a reply, charges what the real usage exceeded the attempt's
    /// estimate by, as a debt later requests wait for: the reply that ran
    /// over is not held back (its hint has a deadline), the next calls are.
    fn charge_tokens(&self, real: Usage, user: &str) {
        if let Some(limiter) = &self.tokens {
            let real = real.input_tokens + real.output_tokens;
            let estimate = self.estimate_tokens(user);
            if real > estimate {
                let over = (real - estimate).min(u64::from(u32::MAX)) as u32;
                let (limiter, burst) = (limiter.clone(), self.config.tokens_per_minute);
                tokio::spawn(async move { take_tokens(&limiter, burst, over).await });
            }
        }
    }

    /// A model's price, by its configured id, else by the name its API
    /// knows it by.
    fn price(&self, model: &str) -> Option<&ModelPrice> {
        let prices: &BTreeMap<String, ModelPrice> = &self.config.prices;
        prices.get(model).or_else(|| {
            let api_model = self
                .chain
                .iter()
                .find(|l| l.id == model)
                .map(|l| l.api_model.as_str())?;
            prices.get(api_model)
        })
    }

    fn cost(&self, usage: &Usage, model: &str) -> f64 {
        self.price(model).map_or(0.0, |p| {
            (usage.input_tokens as f64 * p.input_per_mtok + usage.output_tokens as f64 * p.output_per_mtok)
                / 1e6
        })
    }
}

/// Waits until `n` tokens of a tokens-per-minute limiter with `burst` are
/// free and takes them (at most one minute's worth at once).
async fn take_tokens(limiter: &DefaultDirectRateLimiter, burst: u32, n: u32) {
    let Some(n) = NonZeroU32::new(n.clamp(1, burst.max(1))) else {
        return;
    };
    // `n` is clamped to the quota's burst, so it always fits.
    let _ = limiter.until_n_ready(n).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_KEY: &str = "sk-ant-api03-synth-unit-secret";
    const OPENAI_KEY: &str = "sk-proj-synth-unit-secret";

    fn env() -> LlmEnv {
        LlmEnv {
            anthropic_api_key: Some(ANTHROPIC_KEY.into()),
            anthropic_base_url: Some("http://127.0.0.1:9".into()),
            openai_api_key: Some(OPENAI_KEY.into()),
            ssl_cert_file: Some("/etc/gateway-ca.pem".into()),
            ..LlmEnv::default()
        }
    }

    #[test]
    fn llm_env_debug_hides_both_keys() {
        let shown = format!("{:?}", env());
        assert!(
            !shown.contains(ANTHROPIC_KEY) && !shown.contains(OPENAI_KEY),
            "{shown}"
        );
        assert!(
            shown.contains("<redacted>") && shown.contains("gateway-ca.pem"),
            "{shown}"
        );
    }

    #[test]
    fn synthesizer_debug_hides_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cassette = Cassette::open(&dir.path().join("c.jsonl"), CassetteMode::Record).unwrap();
        let env = LlmEnv {
            ssl_cert_file: None,
            ..env()
        };
        let synth = Synthesizer::new(&LlmConfig::default(), &env)
            .unwrap()
            .with_cassette(Arc::new(cassette));
        assert!(synth.has_model());
        let shown = format!("{synth:?}");
        assert!(
            !shown.contains(ANTHROPIC_KEY) && !shown.contains(OPENAI_KEY),
            "{shown}"
        );
        assert!(
            shown.contains("c.jsonl") && shown.contains("Anthropic"),
            "{shown}"
        );
    }
}
