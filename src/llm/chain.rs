//! The chain walk, from a failed trajectory to a hint: each model of the
//! chain in turn, inside the hint's time budget (`llm.timeout_secs`), until
//! one answers, each with the prompt fitted to its window (`fitting`);
//! then the static hint built from the verifier's feedback.
//! The walk stops early when the budget is spent or the cassette lacks a
//! request in strict playback.

use std::time::{Duration, Instant};

use super::cap::cap_hint;
use super::client::LlmError;
use super::fitting::call_fitted;
use super::link::{Link, Turn};
use super::pricing::{cost_usd, price_of, uncached_cost_usd};
use super::prompt::Ask;
use super::shared::Shared;
use super::tally::Tally;
use crate::messages::{FailedTrajectory, HintCategory, Usage};

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
    /// Whether `hint` was cut to `llm.max_hint_chars`.
    pub hint_truncated: bool,
    /// What the prompt cache saved on this hint, in dollars: its cost with
    /// every prompt token at the input rate, less `cost_usd` (negative
    /// when cache writes outweighed reads; 0 without cache usage).
    pub cache_saved_usd: f64,
    /// Whether a hedged request's duplicate wrote `hint` (`llm.hedge`).
    pub hedged: bool,
}

/// A failure after which the next model is not tried: the cassette lacks
/// the request (strict playback), or the spend budget is spent.
fn ends_the_walk(error: &LlmError) -> bool {
    matches!(error, LlmError::NotInCassette { .. } | LlmError::BudgetExhausted)
}

/// The hint for `t`, the best trajectory of its group, from `chain` (empty:
/// the static hint), asking what `ask` asks beyond it (earlier hints that
/// did not help, values it must not state): its text cut to
/// `llm.max_hint_chars` at a sentence boundary, whoever wrote it.
pub(super) async fn synthesize(
    shared: &Shared,
    chain: &[Link],
    t: &FailedTrajectory,
    ask: Ask<'_>,
) -> Synthesis {
    let mut s = synthesize_whole(shared, chain, t, ask).await;
    let (hint, truncated) = cap_hint(std::mem::take(&mut s.hint), shared.config.max_hint_chars);
    s.hint = hint;
    s.hint_truncated = truncated;
    s
}

/// The hint for `t`, as long as its writer made it.
async fn synthesize_whole(shared: &Shared, chain: &[Link], t: &FailedTrajectory, ask: Ask<'_>) -> Synthesis {
    let started = Instant::now();
    if chain.is_empty() {
        return Synthesis {
            hint: shared.prompt.static_hint(t),
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
    let deadline = started + time_budget(shared);
    let mut tally = Tally::default();
    let mut last_error = LlmError::Timeout;
    for (i, link) in chain.iter().enumerate() {
        let turn = Turn {
            link,
            next: chain.get(i + 1),
        };
        // Boxed: a model call's future is large (the HTTP client's), and a
        // static or cached hint, which makes none, would otherwise carry
        // (and move) its space in every future around it.
        let call = Box::pin(call_fitted(shared, turn, t, ask, i == 0, deadline, &mut tally));
        let Some(result) = call.await else {
            break;
        };
        match result {
            Ok(text) => {
                let writer = tally.hedged_by.unwrap_or(link);
                return synthesized(shared, writer, text, tally, started);
            }
            Err(e) => {
                tracing::warn!(
                    model = %link.id, group = %t.group_key(), reason = %e.failure_reason(), error = %e,
                    "model failed; trying the next in the chain"
                );
                last_error = e;
            }
        }
        if Instant::now() >= deadline || ends_the_walk(&last_error) {
            break;
        }
    }
    fell_back(shared, chain, t, last_error, tally, started)
}

/// The time budget of one hint.
fn time_budget(shared: &Shared) -> Duration {
    // The config bounds timeout_secs; a value past Duration's range
    // would mean "no deadline", which the bound rules out.
    Duration::try_from_secs_f64(shared.config.timeout_secs).unwrap_or(Duration::from_secs(600))
}

/// The hint `link`'s model wrote.
fn synthesized(shared: &Shared, link: &Link, text: String, tally: Tally<'_>, started: Instant) -> Synthesis {
    let price = price_of(&shared.config, link);
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
fn fell_back(
    shared: &Shared,
    chain: &[Link],
    t: &FailedTrajectory,
    error: LlmError,
    tally: Tally<'_>,
    started: Instant,
) -> Synthesis {
    let price = chain.first().and_then(|l| price_of(&shared.config, l));
    let cost = cost_usd(price.as_ref(), &tally.usage);
    Synthesis {
        hint: shared.prompt.static_hint(t),
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
