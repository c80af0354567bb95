//! The chain walk, from a failed trajectory to a hint: each model of the
//! chain in turn, inside the hint's time budget (`llm.timeout_secs`), until
//! one answers, each with the prompt fitted to its window (`fitting`);
//! then the static hint built from the verifier's feedback.
//! The walk stops early when the budget is spent or the cassette lacks a
//! request in strict playback.

use std::time::{Duration, Instant};

use super::cap::cap_hint;
use super::client::LlmError;
use super::link::Link;
use super::pricing::{cost_usd, price_of, uncached_cost_usd};
use super::prompt_cache::PromptText;
use super::synth::{Synthesis, Synthesizer};
use super::tally::Tally;
use crate::messages::{FailedTrajectory, HintCategory, Usage};

/// A failure after which the next model is not tried: the cassette lacks
/// the request (strict playback), or the spend budget is spent.
fn ends_the_walk(error: &LlmError) -> bool {
    matches!(error, LlmError::NotInCassette { .. } | LlmError::BudgetExhausted)
}

impl Synthesizer {
    /// Synthesizes the hint for `t`, the best trajectory of its group: its
    /// text cut to `llm.max_hint_chars`, whoever wrote it.
    pub async fn synthesize(&self, t: &FailedTrajectory) -> Synthesis {
        self.synthesize_with(t, None).await
    }

    /// Synthesizes the hint for `t` with `extra` (earlier hints that did not
    /// help, for a refined hint) after the prompt's user message; a reply
    /// over `llm.max_hint_chars` is cut at a sentence boundary.
    pub async fn synthesize_with(&self, t: &FailedTrajectory, extra: Option<&str>) -> Synthesis {
        let mut s = self.synthesize_whole(t, extra).await;
        let (hint, truncated) = cap_hint(std::mem::take(&mut s.hint), self.config.max_hint_chars);
        s.hint = hint;
        s.hint_truncated = truncated;
        s
    }

    /// The hint for `t`, as long as its writer made it.
    async fn synthesize_whole(&self, t: &FailedTrajectory, extra: Option<&str>) -> Synthesis {
        let started = Instant::now();
        if self.chain.is_empty() {
            return Synthesis {
                hint: self.prompt.static_hint(t),
                category: HintCategory::StaticFallback,
                model: None,
                usage: Usage::default(),
                cost_usd: 0.0,
                failure_reason: None,
                latency_ms: started.elapsed().as_millis() as u64,
                hint_truncated: false,
                cache_saved_usd: 0.0,
                hedged: false,
            };
        };
        let deadline = started + self.time_budget();
        let mut tally = Tally::default();
        let mut last_error = LlmError::Timeout;
        for (i, link) in self.chain.iter().enumerate() {
            let Some(result) = self
                .call_fitted(link, t, extra, i == 0, deadline, &mut tally)
                .await
            else {
                break;
            };
            match result {
                Ok(text) => {
                    let writer = tally.hedged_by.and_then(|i| self.chain.get(i)).unwrap_or(link);
                    return self.synthesized(writer, text, tally, started);
                }
                Err(e) => {
                    tracing::warn!(model = %link.id, reason = %e.failure_reason(), error = %e, "model failed; trying the next in the chain");
                    last_error = e;
                }
            }
            if Instant::now() >= deadline || ends_the_walk(&last_error) {
                break;
            }
        }
        self.fell_back(t, last_error, tally, started)
    }

    /// The prompt for `t`: the version's system prompt with the context
    /// files (the common one, then `t`'s `env_class` one), and its user
    /// message with `extra` after it.
    pub(super) fn prompt_text(&self, t: &FailedTrajectory, user: String) -> PromptText {
        let contexts: Vec<&str> = self
            .context
            .common
            .as_deref()
            .into_iter()
            .chain(self.context.for_env_class(t.env_class.as_deref()))
            .collect();
        PromptText::new(self.prompt.system_prompt(), &contexts, user)
    }

    /// The time budget of one hint.
    fn time_budget(&self) -> Duration {
        // The config bounds timeout_secs; a value past Duration's range
        // would mean "no deadline", which the bound rules out.
        Duration::try_from_secs_f64(self.config.timeout_secs).unwrap_or(Duration::from_secs(600))
    }

    /// The hint `link`'s model wrote.
    fn synthesized(&self, link: &Link, text: String, tally: Tally, started: Instant) -> Synthesis {
        let price = price_of(&self.config, link);
        let cost = cost_usd(price.as_ref(), &tally.usage);
        Synthesis {
            hint: text,
            category: HintCategory::LlmSynthesized,
            model: Some(link.id.clone()),
            cost_usd: cost,
            cache_saved_usd: uncached_cost_usd(price.as_ref(), &tally.usage) - cost,
            latency_ms: tally.latency_ms(started),
            hedged: tally.hedged_by.is_some(),
            usage: tally.usage,
            failure_reason: None,
            hint_truncated: false,
        }
    }

    /// The static hint, after every model tried failed; what was spent is
    /// priced at the first model's price.
    fn fell_back(&self, t: &FailedTrajectory, error: LlmError, tally: Tally, started: Instant) -> Synthesis {
        let price = self.chain.first().and_then(|l| price_of(&self.config, l));
        let cost = cost_usd(price.as_ref(), &tally.usage);
        Synthesis {
            hint: self.prompt.static_hint(t),
            category: HintCategory::LlmFailedStaticFallback,
            model: None,
            cost_usd: cost,
            cache_saved_usd: uncached_cost_usd(price.as_ref(), &tally.usage) - cost,
            latency_ms: tally.latency_ms(started),
            usage: tally.usage,
            failure_reason: Some(error.failure_reason()),
            hint_truncated: false,
            hedged: false,
        }
    }
}
