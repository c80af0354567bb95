//! The `[llm]` section: which model API stage 1 calls, its model chain, its
//! time, rate and spend bounds, and the prices that spend is counted in.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, non_negative, ConfigError};

/// Which model API stage 1 calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// Anthropic when ANTHROPIC_API_KEY is set, else OpenRouter when
    /// OPENROUTER_API_KEY is, else an OpenAI-compatible server when
    /// OPENAI_API_KEY or OPENAI_BASE_URL is set, else static hints. Model ids
    /// may name their API litellm-style: `openrouter/anthropic/claude-sonnet-4`,
    /// `anthropic/claude-...`, `openai/gpt-...`.
    #[default]
    Auto,
    /// The Anthropic Messages API (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL).
    Anthropic,
    /// An OpenAI-compatible server (OPENAI_API_KEY, OPENAI_BASE_URL): vLLM,
    /// llama.cpp, Ollama, LiteLLM, SGLang.
    Openai,
    /// OpenRouter's OpenAI-compatible API (OPENROUTER_API_KEY).
    Openrouter,
    /// Static hints only.
    None,
}

/// The longest `llm.timeout_secs` accepted: one hint may not hold its group
/// (and its offsets) longer than this.
pub const MAX_LLM_TIMEOUT_SECS: f64 = 600.0;

/// The most `llm.concurrency` accepted: beyond it the value is a typo, and
/// exits 2 instead of failing at start-up.
pub const MAX_LLM_CONCURRENCY: usize = 10_000;

/// The default `llm.requests_per_minute`: above what 20 concurrent calls of
/// a few seconds each make (~300/min), so it never slows a healthy stage, and
/// low enough that a flood of input cannot buy unlimited calls.
pub const DEFAULT_REQUESTS_PER_MINUTE: u32 = 600;

/// The range of `llm.ledger_interval_ms`: often enough for a budget that
/// others see within a minute, seldom enough that the ledger stays small.
pub const LEDGER_INTERVAL_MS: std::ops::RangeInclusive<u64> = 50..=60_000;

/// The range of `llm.ledger_stale_secs`.
pub const LEDGER_STALE_SECS: std::ops::RangeInclusive<u64> = 1..=3600;

/// The default `llm.max_hint_chars`.
pub const DEFAULT_MAX_HINT_CHARS: usize = 4_000;

/// The most `llm.max_hint_chars` accepted. JSON writes one character in at
/// most 6 bytes (`\u001f` for a control character), so a hint of 100,000
/// characters takes at most 600,000 bytes of its message, leaving the rest
/// of librdkafka's default `message.max.bytes` (1,000,000) to the Hint's
/// other fields: every hint fits the output producer's default limit.
pub const MAX_HINT_CHARS: usize = 100_000;

/// Which model API stage 1 calls and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Which model API stage 1 calls. Keys come from the environment only
    /// (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`, `OPENROUTER_API_KEY`), never
    /// from this file, and are never logged.
    pub provider: LlmProvider,
    /// The model fallback chain, tried in order; empty = the provider's
    /// default (`claude-sonnet-4-20250514`, or `gpt-4o-mini`). After the last
    /// model fails, the static hint is used.
    pub models: Vec<String>,
    /// API base URL; empty = ANTHROPIC_BASE_URL / OPENAI_BASE_URL /
    /// OPENROUTER_BASE_URL, else the official endpoint.
    pub base_url: String,
    /// The most tokens the model may write for one hint (above 0).
    pub max_tokens: u32,
    /// The longest hint text, in characters (1 to 100,000, so that every
    /// hint fits the producer's default message size). A longer reply is cut
    /// at a sentence boundary (else a word boundary, else a character) and
    /// its Hint says `hint_truncated: true`.
    pub max_hint_chars: usize,
    /// The sampling temperature of the model calls (0 to 2).
    pub temperature: f64,
    /// Time budget of one hint in seconds (above 0, at most 600): all
    /// retries and models included, and the wait for a free call slot and
    /// the rate limits. Past it the hint is the static fallback
    /// (`failure_reason = "timeout"`).
    pub timeout_secs: f64,
    /// LLM calls in flight at once, per worker (1 to 10,000); at most the
    /// server's parallel slots for a self-hosted model.
    pub concurrency: usize,
    /// Retries of one model on 429/529/5xx, timeouts and broken
    /// connections (exponential backoff with jitter, never sooner than the
    /// server's `retry-after`), before the chain's next model.
    pub max_retries: u32,
    /// Requests per minute (0 = no limit), the consumer group's: each
    /// worker takes the share of the input partitions it holds. The default
    /// caps what a flood of input can buy at 600 calls a minute.
    pub requests_per_minute: u32,
    /// Tokens per minute, input + output, from the real `usage` (0 = no
    /// limit), the consumer group's like `requests_per_minute`.
    pub tokens_per_minute: u32,
    /// Dollars of LLM calls per rolling hour (0 = no budget), the consumer
    /// group's (counted over `[topics] spend`). When spent,
    /// hints are static with `failure_reason = "budget_exhausted"` until
    /// older spend leaves the window.
    pub budget_usd_per_hour: f64,
    /// Tokens (input + output) per rolling hour (0 = no budget).
    pub budget_tokens_per_hour: u64,
    /// How often each worker publishes its settled spend to `[topics]
    /// spend`, in milliseconds (50 to 60,000): the group's budget sees
    /// another worker's spend this late at most (plus a produce and a
    /// fetch).
    pub ledger_interval_ms: u64,
    /// How long a worker may go without reading `[topics] spend` (its
    /// leader stopped, the topic unreachable, its own records not
    /// acknowledged), in seconds (1 to 3,600, at least
    /// `ledger_interval_ms`), before it spends only its share of the budget
    /// (the input partitions it holds over all), logged once and shown by
    /// `hintstream_hints_llm_ledger_share_mode`. A failed read at start-up
    /// starts it in share mode at once.
    pub ledger_stale_secs: u64,
    /// Dollars per million tokens, by model id, for `cost_usd` and the
    /// budget. The default and the reference trainer's models have their
    /// list prices built in; with a dollar budget, every model a request can
    /// reach needs a price: `[llm] models`, `allowed_models` and every arm's
    /// `models` (else exit 2, naming the model and this key).
    #[schemars(extend("x-key" = "model id"))]
    pub prices: BTreeMap<String, ModelPrice>,
    /// The prompt the LLM is sent: ours (`v3`), which shows every text the
    /// failed attempt produced inside an `<untrusted>` element, or the
    /// reference trainer's own, byte for byte (`reference`), e.g. to compare
    /// hints with it; the reference's is not hardened against prompt
    /// injection.
    pub prompt_version: PromptVersion,
    /// Models a trainer may ask for on a failed trajectory (`hint_model`,
    /// the drop-in's `model`): such a request is served by that model
    /// alone when it is listed here and its API has a key. Empty: every
    /// request uses the configured chain (and is counted as ignored).
    pub allowed_models: Vec<String>,
    /// A text file appended to the system prompt of every call (an
    /// environment's tool documentation, a rubric); empty = none. A relative
    /// path is from the working directory. Read once at start-up: UTF-8,
    /// not empty, at most 256 KiB, else the stage exits 2.
    pub system_context_file: String,
    /// A directory of one file per `env_class`, `<dir>/<env_class>.md`,
    /// appended after `system_context_file` for a trajectory of that
    /// class; empty = none. Read once at start-up (other files are ignored;
    /// each as `system_context_file`, at most 1,000 files).
    pub system_context_dir: String,
    /// Provider prompt caching: Anthropic `cache_control` breakpoints on
    /// the system prompt (once it reaches `cache_min_tokens`) and on a task
    /// prompt that recurs; OpenAI's `prompt_cache_key`.
    pub prompt_cache: bool,
    /// How long an Anthropic cache entry lives: `"5m"` (a write costs 1.25x
    /// the input price) or `"1h"` (2x).
    pub cache_ttl: CacheTtl,
    /// The shortest prefix, in estimated tokens (a token per 4 bytes, which
    /// undercounts), that gets a cache breakpoint: the provider caches
    /// nothing shorter (1,024 for Claude Sonnet and Opus, 2,048 for Haiku).
    pub cache_min_tokens: u32,
    // Hedged requests (`llm::hedge`).
    /// Send one duplicate of a call still in flight after the model's
    /// observed p95 latency (default false).
    pub hedge: bool,
    /// Where the duplicate goes: the same model (`"same"`) or the chain's
    /// next model (`"next"`; the same model when there is none).
    pub hedge_to: HedgeTo,
    /// How many of a model's latest answered calls its p95 is taken over
    /// (20 to 10,000). No hedge before a model has 20 answered calls.
    pub hedge_window: usize,
    /// The shortest wait before a duplicate is sent, in milliseconds,
    /// whatever the observed p95.
    pub hedge_min_delay_ms: u64,
    /// The most duplicates, as a share of requests (0..=1): a token bucket
    /// earns this much per request and a duplicate takes a whole token.
    pub hedge_max_share: f64,
    /// Context windows in tokens, by model id (`"smollm2" = 8192`), for
    /// the models the built-in table lacks or has wrong (it knows
    /// `claude-sonnet-4-20250514`, `claude-3-5-haiku-20241022`,
    /// `gpt-4o-mini` and the reference trainer's model). The prompt is
    /// fitted so that it, `max_tokens` and a margin fit the window. Each
    /// window is at least 512, at most 100,000,000, and above `max_tokens`.
    #[schemars(extend("x-key" = "model id"))]
    pub context_tokens: BTreeMap<String, u32>,
    /// Ask an OpenAI-compatible server for the window of a model neither
    /// table knows (vLLM's `/v1/models` `max_model_len`, llama.cpp's
    /// `/props` `n_ctx`), once per model, within 5 s. Never while a cassette
    /// records or plays (a run must fit its prompts the same way again).
    pub discover_context: bool,
}

/// `llm.cache_ttl`: the lifetime of an Anthropic prompt cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum CacheTtl {
    #[default]
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

impl CacheTtl {
    /// The lifetime.
    pub fn duration(self) -> std::time::Duration {
        match self {
            CacheTtl::FiveMinutes => std::time::Duration::from_secs(300),
            CacheTtl::OneHour => std::time::Duration::from_secs(3600),
        }
    }

    /// What a cache write costs, as a multiple of the input price.
    pub fn write_multiplier(self) -> f64 {
        match self {
            CacheTtl::FiveMinutes => 1.25,
            CacheTtl::OneHour => 2.0,
        }
    }
}

/// The default `llm.cache_min_tokens`: Claude Sonnet's minimum.
pub const DEFAULT_CACHE_MIN_TOKENS: u32 = 1024;

/// Where a hedged request's duplicate goes (`llm.hedge_to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HedgeTo {
    /// The model of the first attempt.
    #[default]
    Same,
    /// The chain's next model (the same model when it is the last).
    Next,
}

/// The smallest `llm.hedge_window`: a p95 over fewer calls is noise.
pub const MIN_HEDGE_WINDOW: usize = 20;

/// The largest `llm.hedge_window` (a p95 is sorted out of it per call).
pub const MAX_HEDGE_WINDOW: usize = 10_000;

/// Which prompt stage 1 sends (`[llm] prompt_version`): ours (`v3`, the
/// default) or the reference trainer's own, byte for byte (`reference`).
/// The texts are in `llm::prompt`. `v2` is read as `v3`: every version of
/// ours delimits untrusted text, and v3 is v2 delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PromptVersion {
    #[default]
    V3,
    Reference,
}

impl PromptVersion {
    /// The name stamped on hints as `prompt_version`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PromptVersion::V3 => "v3",
            PromptVersion::Reference => "reference",
        }
    }
}

/// Stamped on every hint of our own prompt as `prompt_version`; change it
/// with the template (in `llm::prompt`).
pub const PROMPT_VERSION: &str = PromptVersion::V3.as_str();

impl std::fmt::Display for PromptVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `prompt_version` that names no prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown prompt_version {0:?}: expected \"v3\" or \"reference\"")]
pub struct UnknownPromptVersion(pub String);

/// Read as its name (see `FromStr`).
impl<'de> Deserialize<'de> for PromptVersion {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for PromptVersion {
    type Err = UnknownPromptVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            // v2 showed untrusted text undelimited; a config that names it
            // gets the same prompt delimited, as every version of ours is.
            "v3" | "v2" => Ok(PromptVersion::V3),
            "reference" => Ok(PromptVersion::Reference),
            other => Err(UnknownPromptVersion(other.to_string())),
        }
    }
}

/// What one model's tokens cost, in dollars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Dollars per million input tokens (at least 0).
    pub input_per_mtok: f64,
    /// Dollars per million output tokens (at least 0).
    pub output_per_mtok: f64,
    /// Dollars per million input tokens read from the prompt cache. Unset:
    /// 0.1x `input_per_mtok` on the Anthropic API, 0.5x on an
    /// OpenAI-compatible one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_mtok: Option<f64>,
    /// Dollars per million input tokens written to the prompt cache. Unset:
    /// 1.25x `input_per_mtok` on the Anthropic API with `cache_ttl = "5m"`,
    /// 2x with `"1h"`; 1x on an OpenAI-compatible one (no write premium).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<f64>,
}

impl ModelPrice {
    /// A price without cache rates (their defaults apply).
    pub const fn new(input_per_mtok: f64, output_per_mtok: f64) -> Self {
        ModelPrice {
            input_per_mtok,
            output_per_mtok,
            cache_read_per_mtok: None,
            cache_write_per_mtok: None,
        }
    }
}

fn default_max_tokens() -> u32 {
    300
}

fn default_temperature() -> f64 {
    0.3
}

fn default_timeout_secs() -> f64 {
    30.0
}

fn default_concurrency() -> usize {
    20
}

fn default_ledger_interval_ms() -> u64 {
    1000
}

fn default_ledger_stale_secs() -> u64 {
    10
}

fn default_max_retries() -> u32 {
    4
}

fn default_hedge_window() -> usize {
    200
}

fn default_hedge_min_delay_ms() -> u64 {
    500
}

fn default_hedge_max_share() -> f64 {
    0.05
}

/// The list prices of the default models and of the reference trainer's.
fn default_prices() -> BTreeMap<String, ModelPrice> {
    let price = ModelPrice::new;
    [
        ("claude-sonnet-4-20250514".to_string(), price(3.0, 15.0)),
        ("claude-3-5-haiku-20241022".to_string(), price(0.8, 4.0)),
        // OpenAI's published cached-input price: 0.5x.
        (
            "gpt-4o-mini".to_string(),
            ModelPrice {
                cache_read_per_mtok: Some(0.075),
                ..price(0.15, 0.6)
            },
        ),
        // The reference trainer's model, through OpenRouter.
        (
            "openrouter/anthropic/claude-sonnet-4".to_string(),
            price(3.0, 15.0),
        ),
        ("anthropic/claude-sonnet-4".to_string(), price(3.0, 15.0)),
    ]
    .into_iter()
    .collect()
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            provider: LlmProvider::Auto,
            models: vec![],
            base_url: String::new(),
            max_tokens: default_max_tokens(),
            max_hint_chars: DEFAULT_MAX_HINT_CHARS,
            temperature: default_temperature(),
            timeout_secs: default_timeout_secs(),
            concurrency: default_concurrency(),
            max_retries: default_max_retries(),
            requests_per_minute: DEFAULT_REQUESTS_PER_MINUTE,
            tokens_per_minute: 0,
            budget_usd_per_hour: 0.0,
            budget_tokens_per_hour: 0,
            ledger_interval_ms: default_ledger_interval_ms(),
            ledger_stale_secs: default_ledger_stale_secs(),
            prices: default_prices(),
            prompt_version: PromptVersion::default(),
            allowed_models: Vec::new(),
            system_context_file: String::new(),
            system_context_dir: String::new(),
            prompt_cache: true,
            cache_ttl: CacheTtl::default(),
            cache_min_tokens: DEFAULT_CACHE_MIN_TOKENS,
            hedge: false,
            hedge_to: HedgeTo::default(),
            hedge_window: default_hedge_window(),
            hedge_min_delay_ms: default_hedge_min_delay_ms(),
            hedge_max_share: default_hedge_max_share(),
            context_tokens: BTreeMap::new(),
            discover_context: true,
        }
    }
}

impl LlmConfig {
    /// With a dollar budget, every model a request can reach has a price
    /// (built in or under `[llm.prices]`): one without would be reserved
    /// and settled at $0, its spend unbounded. `models` are those of
    /// `where_` (`llm` for `[llm] models` and `allowed_models`, or an arm).
    pub fn every_model_priced<'a>(
        &self,
        models: impl IntoIterator<Item = &'a String>,
        where_: &str,
    ) -> Result<(), ConfigError> {
        if self.budget_usd_per_hour <= 0.0 {
            return Ok(());
        }
        match models.into_iter().find(|m| !self.prices.contains_key(*m)) {
            None => Ok(()),
            Some(model) => invalid(format!(
                "llm.budget_usd_per_hour is set, but model {model:?} ({where_}) has no price in \
                 [llm.prices]: its calls would cost $0 against the budget. Add llm.prices.\"{model}\" = \
                 {{ input_per_mtok = ..., output_per_mtok = ... }}"
            )),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_calls()?;
        super::llm_context::validate_context_tokens(&self.context_tokens, self.max_tokens)?;
        self.validate_spend()?;
        self.validate_hedge()
    }

    /// The hedging keys.
    fn validate_hedge(&self) -> Result<(), ConfigError> {
        if !(MIN_HEDGE_WINDOW..=MAX_HEDGE_WINDOW).contains(&self.hedge_window) {
            return invalid(format!(
                "llm.hedge_window = {} must be within {MIN_HEDGE_WINDOW}..={MAX_HEDGE_WINDOW} calls",
                self.hedge_window
            ));
        }
        if !(self.hedge_max_share.is_finite() && (0.0..=1.0).contains(&self.hedge_max_share)) {
            return invalid(format!(
                "llm.hedge_max_share = {} must be within 0..=1 (a share of requests)",
                self.hedge_max_share
            ));
        }
        Ok(())
    }

    /// The bounds of one call and of the calls in flight.
    fn validate_calls(&self) -> Result<(), ConfigError> {
        let timeout = self.timeout_secs;
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= MAX_LLM_TIMEOUT_SECS) {
            return invalid(format!(
                "llm.timeout_secs = {timeout} must be within 0 < t <= {MAX_LLM_TIMEOUT_SECS} seconds"
            ));
        }
        if self.concurrency == 0 || self.max_tokens == 0 {
            return invalid("llm.concurrency and llm.max_tokens must be > 0");
        }
        if !(1..=MAX_HINT_CHARS).contains(&self.max_hint_chars) {
            return invalid(format!(
                "llm.max_hint_chars = {} must be within 1..={MAX_HINT_CHARS} (a longer hint may not fit \
                 its message)",
                self.max_hint_chars
            ));
        }
        if self.concurrency > MAX_LLM_CONCURRENCY {
            return invalid(format!(
                "llm.concurrency = {} is over {MAX_LLM_CONCURRENCY}",
                self.concurrency
            ));
        }
        if self.cache_min_tokens == 0 {
            return invalid("llm.cache_min_tokens must be > 0 (the provider's minimum cacheable prefix)");
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return invalid(format!(
                "llm.temperature {} must be within 0..=2",
                self.temperature
            ));
        }
        Ok(())
    }

    /// The budget, and the prices it is counted in.
    fn validate_spend(&self) -> Result<(), ConfigError> {
        if !non_negative(self.budget_usd_per_hour) {
            return invalid(format!(
                "llm.budget_usd_per_hour = {} must be a finite number >= 0 (0 = no budget)",
                self.budget_usd_per_hour
            ));
        }
        if !LEDGER_INTERVAL_MS.contains(&self.ledger_interval_ms) {
            return invalid(format!(
                "llm.ledger_interval_ms = {} must be within {}..={} milliseconds",
                self.ledger_interval_ms,
                LEDGER_INTERVAL_MS.start(),
                LEDGER_INTERVAL_MS.end()
            ));
        }
        if !LEDGER_STALE_SECS.contains(&self.ledger_stale_secs)
            || self.ledger_stale_secs.saturating_mul(1000) < self.ledger_interval_ms
        {
            return invalid(format!(
                "llm.ledger_stale_secs = {} must be within {}..={} seconds and at least \
                 llm.ledger_interval_ms ({} ms)",
                self.ledger_stale_secs,
                LEDGER_STALE_SECS.start(),
                LEDGER_STALE_SECS.end(),
                self.ledger_interval_ms
            ));
        }
        self.every_model_priced(self.models.iter().chain(&self.allowed_models), "llm")?;
        for (model, price) in &self.prices {
            let cache_ok = [price.cache_read_per_mtok, price.cache_write_per_mtok]
                .into_iter()
                .flatten()
                .all(non_negative);
            if !(non_negative(price.input_per_mtok) && non_negative(price.output_per_mtok) && cache_ok) {
                return invalid(format!("llm.prices.\"{model}\" must have finite prices >= 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{Hint, HintCategory, HintSource, Usage};

    /// librdkafka's default `message.max.bytes`, the output producer's
    /// limit unless `[kafka]` raises it.
    const DEFAULT_PRODUCER_MESSAGE_MAX_BYTES: usize = 1_000_000;

    #[test]
    fn the_longest_hint_of_the_worst_characters_fits_its_message_with_its_envelope() {
        let id = "i".repeat(4096);
        let hint = Hint {
            schema_version: 1,
            hint_id: "0".repeat(32),
            run_id: id.clone(),
            step: i64::MAX,
            instance_id: id.clone(),
            trajectory_id: id.clone(),
            // A control character is the costliest in JSON: `\u0001`.
            hint: "\u{1}".repeat(MAX_HINT_CHARS),
            category: HintCategory::LlmSynthesized,
            model: Some("m".repeat(256)),
            prompt_version: "v".repeat(64),
            latency_ms: u64::MAX,
            usage: Usage {
                input_tokens: u64::MAX,
                output_tokens: u64::MAX,
                cache_read_input_tokens: Some(u64::MAX),
                cache_creation_input_tokens: Some(u64::MAX),
            },
            cost_usd: f64::MAX,
            failure_reason: Some("f".repeat(64)),
            source: HintSource {
                topic: "t".repeat(249),
                partition: i32::MAX,
                offset: i64::MAX,
            },
            created_at: "2026-01-01T00:00:00.000Z".into(),
            arm: "a".repeat(256),
            refines: vec!["0".repeat(32); 16],
            hint_truncated: true,
            hedged: true,
            leak: true,
            level: Some(crate::messages::HintLevel::Concept),
        };
        let bytes = serde_json::to_vec(&hint).unwrap();
        // The key (run_id/step/instance_id) and headers ride along.
        let message = bytes.len() + 2 * id.len() + 64 + 4096;
        assert!(
            message < DEFAULT_PRODUCER_MESSAGE_MAX_BYTES,
            "a hint of {MAX_HINT_CHARS} characters takes {message} bytes"
        );
        assert!(String::from_utf8(bytes)
            .unwrap()
            .contains("\"hint_truncated\":true"));
    }

    #[test]
    fn hedging_keys_are_bounded() {
        let bad = [
            LlmConfig {
                hedge_window: MIN_HEDGE_WINDOW - 1,
                ..LlmConfig::default()
            },
            LlmConfig {
                hedge_max_share: 1.5,
                ..LlmConfig::default()
            },
            LlmConfig {
                hedge_max_share: f64::NAN,
                ..LlmConfig::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        let d = LlmConfig::default();
        assert!(!d.hedge && d.hedge_to == HedgeTo::Same);
        assert_eq!((d.hedge_window, d.hedge_min_delay_ms), (200, 500));
        assert_eq!(d.hedge_max_share, 0.05);
    }

    #[test]
    fn max_hint_chars_is_bounded() {
        for bad in [0, MAX_HINT_CHARS + 1] {
            let config = LlmConfig {
                max_hint_chars: bad,
                ..LlmConfig::default()
            };
            assert!(config.validate().is_err(), "{bad}");
        }
        assert!(LlmConfig::default().validate().is_ok());
        assert_eq!(LlmConfig::default().max_hint_chars, 4_000);
    }
}
