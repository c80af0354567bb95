//! The `[llm]` section: which model API stage 1 calls, its model chain, its
//! time, rate and spend bounds, and the prices that spend is counted in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{invalid, non_negative, ConfigError};

/// Which model API stage 1 calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// Anthropic when ANTHROPIC_API_KEY is set, else OpenRouter when
    /// OPENROUTER_API_KEY is, else an OpenAI-compatible server when
    /// OPENAI_API_KEY or OPENAI_BASE_URL is set, else static hints. Model ids
    /// may name their API litellm-style: `openrouter/anthropic/claude-sonnet-4`,
    /// `anthropic/claude-...`, `openai/gpt-...`.
    #[default]
    Auto,
    Anthropic,
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

/// The default `llm.max_hint_chars`.
pub const DEFAULT_MAX_HINT_CHARS: usize = 4_000;

/// The most `llm.max_hint_chars` accepted. JSON writes one character in at
/// most 6 bytes (`\u001f` for a control character), so a hint of 100,000
/// characters takes at most 600,000 bytes of its message, leaving the rest
/// of librdkafka's default `message.max.bytes` (1,000,000) to the Hint's
/// other fields: every hint fits the output producer's default limit.
pub const MAX_HINT_CHARS: usize = 100_000;

/// Which model API stage 1 calls and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    pub provider: LlmProvider,
    /// The model fallback chain, tried in order; empty = the provider's
    /// default (`claude-sonnet-4-20250514`, or `gpt-4o-mini`). After the last
    /// model fails, the static hint is used.
    pub models: Vec<String>,
    /// API base URL; empty = ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else the
    /// official endpoint.
    pub base_url: String,
    pub max_tokens: u32,
    /// The longest hint text, in characters (at most [`MAX_HINT_CHARS`]). A
    /// longer reply is cut at a sentence boundary (else a word boundary,
    /// else a character) and its Hint says `hint_truncated: true`.
    pub max_hint_chars: usize,
    pub temperature: f64,
    /// Time budget of one hint, all retries and models included (seconds).
    pub timeout_secs: f64,
    /// LLM calls in flight at once.
    pub concurrency: usize,
    /// Retries of one model on 429/529/5xx/timeouts/broken connections.
    pub max_retries: u32,
    /// Requests per minute (0 = no limit). The default caps what a flood of
    /// input can buy at 600 calls a minute.
    pub requests_per_minute: u32,
    /// Tokens per minute, input + output, from the real `usage` (0 = no limit).
    pub tokens_per_minute: u32,
    /// Dollars of LLM calls per rolling hour (0 = no budget). When spent,
    /// hints are static with `failure_reason = "budget_exhausted"` until
    /// older spend leaves the window.
    pub budget_usd_per_hour: f64,
    /// Tokens (input + output) per rolling hour (0 = no budget).
    pub budget_tokens_per_hour: u64,
    /// Dollars per million input / output tokens, by model.
    pub prices: BTreeMap<String, ModelPrice>,
    /// The prompt the LLM is sent: ours (`v2`) or the reference trainer's
    /// own, byte for byte (`reference`), e.g. to compare hints with it.
    pub prompt_version: PromptVersion,
    /// Models a trainer may ask for on a failed trajectory (`hint_model`,
    /// the drop-in's `model`): such a request is served by that model
    /// alone when it is listed here and its API has a key. Empty: every
    /// request uses the configured chain (and is counted as ignored).
    pub allowed_models: Vec<String>,
    /// Context windows in tokens, by model id (`[llm.context_tokens]`,
    /// e.g. `"smollm2" = 8192`), for the models the built-in table
    /// (`BUILT_IN_CONTEXT_TOKENS`) lacks or has wrong. The prompt is fitted
    /// so that it and `max_tokens` fit the window (`llm::fit`).
    pub context_tokens: BTreeMap<String, u32>,
    /// Ask an OpenAI-compatible server for the window of a model neither
    /// table knows (vLLM's `/v1/models` `max_model_len`, llama.cpp's
    /// `/props` `n_ctx`), once per model, within 5 s. Never while a cassette
    /// records or plays (a run must fit its prompts the same way again).
    pub discover_context: bool,
}

/// Which prompt stage 1 sends (`[llm] prompt_version`): ours (`v2`, the
/// default) or the reference trainer's own, byte for byte (`reference`).
/// The texts are in `llm::prompt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVersion {
    #[default]
    V2,
    Reference,
}

impl PromptVersion {
    /// The name stamped on hints as `prompt_version`.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptVersion::V2 => "v2",
            PromptVersion::Reference => "reference",
        }
    }
}

impl std::fmt::Display for PromptVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `prompt_version` that names no prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown prompt_version {0:?}: expected \"v2\" or \"reference\"")]
pub struct UnknownPromptVersion(pub String);

impl std::str::FromStr for PromptVersion {
    type Err = UnknownPromptVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "v2" => Ok(PromptVersion::V2),
            "reference" => Ok(PromptVersion::Reference),
            other => Err(UnknownPromptVersion(other.to_string())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
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

fn default_max_retries() -> u32 {
    4
}

/// The list prices of the default models and of the reference trainer's.
fn default_prices() -> BTreeMap<String, ModelPrice> {
    let price = |input_per_mtok, output_per_mtok| ModelPrice {
        input_per_mtok,
        output_per_mtok,
    };
    [
        ("claude-sonnet-4-20250514".to_string(), price(3.0, 15.0)),
        ("claude-3-5-haiku-20241022".to_string(), price(0.8, 4.0)),
        ("gpt-4o-mini".to_string(), price(0.15, 0.6)),
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
            prices: default_prices(),
            prompt_version: PromptVersion::default(),
            allowed_models: Vec::new(),
            context_tokens: BTreeMap::new(),
            discover_context: true,
        }
    }
}

impl LlmConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_calls()?;
        super::llm_context::validate_context_tokens(&self.context_tokens, self.max_tokens)?;
        self.validate_spend()
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
        if self.budget_usd_per_hour > 0.0 {
            if let Some(model) = self.models.iter().find(|m| !self.prices.contains_key(*m)) {
                return invalid(format!(
                    "llm.budget_usd_per_hour is set, but model {model:?} has no price in [llm.prices]: \
                     its calls would cost $0 against the budget. Add llm.prices.\"{model}\" = \
                     {{ input_per_mtok = ..., output_per_mtok = ... }}"
                ));
            }
        }
        for (model, price) in &self.prices {
            if !(non_negative(price.input_per_mtok) && non_negative(price.output_per_mtok)) {
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
