//! The synthesizer: the model chain (see `routing`), what its calls share
//! (see `shared`: the limits, hedging, cassette, prompt cache), and what it
//! reports: readiness, the description of where hints come from, the
//! hints' ids and an observer for metrics. The walk from a trajectory to a
//! hint is `chain`'s, down a one-way pipeline: `fitting` (the prompt fitted
//! to a model's window), `call` (the cassette), `retry`, `hedge`, `send`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::cap::cap_hint;
use super::cassette::Cassette;
use super::chain;
use super::client::{LlmError, Provider};
use super::context::SystemContext;
use super::limits::GroupLimits;
use super::link::Link;
use super::prompt::leak::withhold;
use super::prompt::Ask;
use super::routing;
use super::shared::Shared;
use crate::config::{LlmConfig, PromptVersion};
use crate::learn::EarlierHint;
use crate::messages::{FailedTrajectory, HintLevel};

pub use super::chain::Synthesis;
pub use super::env::LlmEnv;
pub use super::observer::SynthObserver;
pub use super::routing::{
    DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL, DEFAULT_OPENROUTER_BASE_URL, DEFAULT_OPENROUTER_MODEL,
};

pub struct Synthesizer {
    /// Empty: static hints only.
    chain: Vec<Link>,
    /// The configured ids of the chain.
    models: Vec<String>,
    /// What its calls share, with every arm's synthesizer in part.
    shared: Shared,
}

/// Shows the client (its key redacted by `ApiKey`), the model chain and the
/// cassette; never a key.
impl std::fmt::Debug for Synthesizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Synthesizer")
            .field("chain", &self.chain)
            .field("models", &self.models)
            .field("concurrency", &self.shared.config.concurrency)
            .field("cassette", &self.shared.cassette)
            .field("budget", &self.shared.limits.has_budget())
            .finish_non_exhaustive()
    }
}

impl Synthesizer {
    /// Resolves the model chain (each model's API, endpoint and key) from
    /// the config and env. With `provider = "auto"`, litellm-style ids pick
    /// their API (`openrouter/…`, `anthropic/…`, `openai/…`); with a named
    /// provider every id goes to it as written. A model whose API has no key
    /// is left out with a warning; an empty chain means static hints. The
    /// context files are read here: one that cannot be used is
    /// `LlmError::Context` (a config error).
    pub fn new(config: &LlmConfig, env: &LlmEnv) -> Result<Self, LlmError> {
        let resolved = routing::resolve(config, env)?;
        let context = SystemContext::load(config)?;
        Ok(Synthesizer {
            chain: resolved.links,
            models: resolved.models,
            shared: Shared::new(config, context),
        })
    }

    /// The system context read at start-up.
    pub fn system_context(&self) -> &SystemContext {
        &self.shared.context
    }

    /// A synthesizer for one arm: its own model chain (empty: static hints)
    /// and prompt, sharing this one's limits, observer and cassette.
    pub fn for_arm(&self, models: &[String], prompt: PromptVersion, env: &LlmEnv) -> Result<Self, LlmError> {
        let config = LlmConfig {
            models: models.to_vec(),
            prompt_version: prompt,
            ..self.shared.config.clone()
        };
        let (chain, models) = if models.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let resolved = routing::resolve(&config, env)?;
            (resolved.links, resolved.models)
        };
        Ok(Synthesizer {
            chain,
            models,
            shared: self.shared.for_arm(config),
        })
    }

    /// This synthesizer asking for graded hints at `level` (its system
    /// prompt's ask and its instruction; see `prompt::levels`).
    pub fn at_level(mut self, level: HintLevel) -> Self {
        self.shared.level = Some(level);
        self
    }

    /// The level its prompt asks for, if any.
    pub fn level(&self) -> Option<HintLevel> {
        self.shared.level
    }

    /// Its limits (shared with every arm's synthesizer), for stage 1 to
    /// make them the consumer group's.
    pub fn group_limits(&self) -> GroupLimits {
        GroupLimits::new(self.shared.limits.clone())
    }

    /// The prompt version this synthesizer sends.
    pub fn prompt_version(&self) -> PromptVersion {
        self.shared.prompt
    }

    /// Synthesizes the hint for `t`, the best trajectory of its group: its
    /// text cut to `llm.max_hint_chars`, whoever wrote it.
    pub async fn synthesize(&self, t: &FailedTrajectory) -> Synthesis {
        self.synthesize_with(t, &[]).await
    }

    /// Synthesizes the hint for `t` showing `earlier` hints that did not
    /// help (a refined hint; newest first) in the prompt; a reply
    /// over `llm.max_hint_chars` is cut at a sentence boundary.
    pub async fn synthesize_with(&self, t: &FailedTrajectory, earlier: &[EarlierHint]) -> Synthesis {
        self.synthesize_asking(t, Ask::refining(earlier)).await
    }

    /// Synthesizes the hint for `t`, asking what `ask` asks beyond it:
    /// earlier hints that did not help, values the hint must not state
    /// (the leak guard's second request).
    pub async fn synthesize_asking(&self, t: &FailedTrajectory, ask: Ask<'_>) -> Synthesis {
        chain::synthesize(&self.shared, &self.chain, t, ask).await
    }

    /// The static hint for `t` with every verbatim repeat of `values`
    /// withheld (the leak guard's fallback), cut to `llm.max_hint_chars`,
    /// and whether it was cut.
    pub fn static_hint_withholding(&self, t: &FailedTrajectory, values: &[String]) -> (String, bool) {
        let hint = withhold(&self.shared.prompt.static_hint(t), values);
        cap_hint(hint, self.shared.config.max_hint_chars)
    }

    /// The model ids its `hint_id` covers: the configured chain, or none
    /// when hints are static (no model has a key).
    pub fn chain_ids(&self) -> Vec<String> {
        if self.chain.is_empty() {
            Vec::new()
        } else {
            self.models.clone()
        }
    }

    /// Whether hints can come from where they are configured to: a model
    /// API answered once (any HTTP response, from a synthesis or
    /// [`Synthesizer::probe`]), or there is no model (static hints).
    pub fn provider_answered(&self) -> bool {
        self.chain.is_empty() || self.shared.answered.load(Ordering::Relaxed)
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
                    self.shared.answered.store(true, Ordering::Relaxed);
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
        if let Some(remaining) = self.shared.limits.remaining() {
            observer.budget(remaining);
        }
        self.shared.observer = Some(observer);
        self
    }

    /// Records calls into, or answers them from, `cassette`.
    pub fn with_cassette(mut self, cassette: Arc<Cassette>) -> Self {
        self.shared.cassette = Some(cassette);
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
        let version = self.shared.prompt.as_str();
        let digest = Sha256::digest(format!("{group_key}\u{0}{version}\u{0}{chain}").as_bytes());
        hex::encode(&digest[..16])
    }

    /// Reports what is left of the spend budgets to the observer (the
    /// window rolls on while idle).
    pub fn report_budget(&self) {
        self.shared.observe_budget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::cassette::CassetteMode;

    const ANTHROPIC_KEY: &str = "sk-ant-api03-synth-unit-secret";
    const OPENAI_KEY: &str = "sk-proj-synth-unit-secret";

    #[test]
    fn synthesizer_debug_hides_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cassette = Cassette::open(&dir.path().join("c.jsonl"), CassetteMode::Record).unwrap();
        let env = LlmEnv {
            anthropic_api_key: Some(ANTHROPIC_KEY.into()),
            anthropic_base_url: Some("http://127.0.0.1:9".into()),
            openai_api_key: Some(OPENAI_KEY.into()),
            ssl_cert_file: None,
            ..LlmEnv::default()
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
