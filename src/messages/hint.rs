//! `Hint`: stage 1's answer for one failed group, published on `rl.hints`.

use serde::{Deserialize, Serialize};

use super::decode::{rules, DecodeError, Validate};
use super::level::HintLevel;
use super::SCHEMA_VERSION;

/// Where a hint's text came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HintCategory {
    /// The LLM wrote it.
    LlmSynthesized,
    /// No LLM was configured: built from the verifier feedback.
    StaticFallback,
    /// The LLM failed (timeout, error, empty): built from the verifier feedback.
    LlmFailedStaticFallback,
}

impl HintCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            HintCategory::LlmSynthesized => "llm_synthesized",
            HintCategory::StaticFallback => "static_fallback",
            HintCategory::LlmFailedStaticFallback => "llm_failed_static_fallback",
        }
    }
}

/// A hint's tokens. `input_tokens` is the input billed at the plain rate:
/// with prompt caching, the part neither read from nor written to the
/// cache. The cache fields are what the provider reported (Anthropic's
/// `cache_read_input_tokens` and `cache_creation_input_tokens`; OpenAI's
/// `prompt_tokens_details.cached_tokens` as a read), absent when it
/// reported none: absent is unknown, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
}

impl Usage {
    /// Plain input and output tokens, no cache fields.
    pub const fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Usage {
            input_tokens,
            output_tokens,
            cache_read_input_tokens: None,
            cache_creation_input_tokens: None,
        }
    }

    /// Adds `other`'s tokens; a cache field stays absent only when both
    /// are.
    pub fn add(&mut self, other: &Usage) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_input_tokens = sum(self.cache_read_input_tokens, other.cache_read_input_tokens);
        self.cache_creation_input_tokens = sum(
            self.cache_creation_input_tokens,
            other.cache_creation_input_tokens,
        );
    }

    /// Every input token the prompt took: plain, read from and written to
    /// the cache.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_read_input_tokens.unwrap_or(0))
            .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
    }

    /// Every token, input (cached or not) and output.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens().saturating_add(self.output_tokens)
    }
}

/// The failed-trajectory record a hint was built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintSource {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hint {
    pub schema_version: i64,
    /// Deterministic: a hash of group key, prompt version and model chain,
    /// and of the arm for arms other than [`DEFAULT_ARM`]
    /// (`learn::hint_id`).
    pub hint_id: String,
    pub run_id: String,
    pub step: i64,
    pub instance_id: String,
    pub trajectory_id: String,
    pub hint: String,
    pub category: HintCategory,
    pub model: Option<String>,
    pub prompt_version: String,
    pub latency_ms: u64,
    pub usage: Usage,
    pub cost_usd: f64,
    pub failure_reason: Option<String>,
    pub source: HintSource,
    pub created_at: String,
    /// The arm that wrote the hint; [`DEFAULT_ARM`] when no arms are
    /// configured (and for hints written before arms existed).
    #[serde(default = "default_arm")]
    pub arm: String,
    /// `hint_id`s of earlier hints for the same task that did not rescue it
    /// and were shown to the LLM; empty for a fresh hint.
    #[serde(default)]
    pub refines: Vec<String>,
    /// Whether `hint` was cut to `llm.max_hint_chars` (at a sentence
    /// boundary, else a word boundary, else a character). Written only when
    /// true; absent reads as false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hint_truncated: bool,
    /// Whether a hedged request's duplicate wrote the hint (`llm.hedge`:
    /// it answered before the first attempt). Written only when true;
    /// absent reads as false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hedged: bool,
    /// Whether `hint` repeats, verbatim, a value the verifier output
    /// presents as expected (the leak guard, `hints.on_leak`). Written
    /// only when true; absent reads as false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub leak: bool,
    /// The level a graded hint was asked at (`[[hints.arms]] levels`);
    /// absent when its arm has no levels, and then not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<HintLevel>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The name of the one implicit arm when no `[[hints.arms]]` are configured.
pub const DEFAULT_ARM: &str = "default";

fn default_arm() -> String {
    DEFAULT_ARM.to_string()
}

impl Validate for Hint {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("hint_id", &self.hint_id)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        rules::non_empty("instance_id", &self.instance_id)?;
        rules::non_empty("trajectory_id", &self.trajectory_id)?;
        rules::finite("cost_usd", self.cost_usd)?;
        rules::non_empty("arm", &self.arm)?;
        for (i, id) in self.refines.iter().enumerate() {
            rules::non_empty(&format!("refines[{i}]"), id)?;
        }
        rules::rfc3339("created_at", Some(&self.created_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_truncated_is_written_only_when_true_and_reads_as_false_when_absent() {
        let json = serde_json::json!({
            "schema_version": 1, "hint_id": "h", "run_id": "r", "step": 1, "instance_id": "i",
            "trajectory_id": "t", "hint": "x", "category": "llm_synthesized", "model": null,
            "prompt_version": "v", "latency_ms": 0, "usage": {"input_tokens": 0, "output_tokens": 0},
            "cost_usd": 0.0, "failure_reason": null,
            "source": {"topic": "t", "partition": 0, "offset": 0}, "created_at": "2026-01-01T00:00:00Z"
        });
        let mut hint: Hint = serde_json::from_value(json).unwrap();
        assert!(!hint.hint_truncated);
        assert!(!serde_json::to_string(&hint).unwrap().contains("hint_truncated"));
        hint.hint_truncated = true;
        let back: Hint = serde_json::from_str(&serde_json::to_string(&hint).unwrap()).unwrap();
        assert!(back.hint_truncated);
    }

    #[test]
    fn hedged_and_leak_are_written_only_when_true_and_read_as_false_when_absent() {
        let json = serde_json::json!({
            "schema_version": 1, "hint_id": "h", "run_id": "r", "step": 1, "instance_id": "i",
            "trajectory_id": "t", "hint": "x", "category": "llm_synthesized", "model": "m",
            "prompt_version": "v", "latency_ms": 0, "usage": {"input_tokens": 0, "output_tokens": 0},
            "cost_usd": 0.0, "failure_reason": null,
            "source": {"topic": "t", "partition": 0, "offset": 0}, "created_at": "2026-01-01T00:00:00Z"
        });
        type Flag = fn(&mut Hint) -> &mut bool;
        let flags: [(&str, Flag); 2] = [("hedged", |h| &mut h.hedged), ("leak", |h| &mut h.leak)];
        for (name, flag) in flags {
            let mut hint: Hint = serde_json::from_value(json.clone()).unwrap();
            assert!(!*flag(&mut hint), "{name}");
            assert!(!serde_json::to_string(&hint).unwrap().contains(name));
            *flag(&mut hint) = true;
            let text = serde_json::to_string(&hint).unwrap();
            assert!(text.contains(&format!("\"{name}\":true")), "{text}");
            let mut back = serde_json::from_str::<Hint>(&text).unwrap();
            assert!(*flag(&mut back), "{name}");
        }
    }
}
