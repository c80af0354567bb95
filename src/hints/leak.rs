//! The leak guard (`[hints] on_leak`): a hint that repeats, verbatim, a
//! value the verifier output presents as expected (see
//! [`crate::llm::prompt::leak`]) gives the answer away. With `keep` it is
//! published flagged `leak: true`. With `regenerate` an LLM-written hint
//! is asked for once more, the values it repeated named as forbidden; a
//! second hint that repeats one too (or a failed second request) gives way
//! to the static hint with every expected value withheld, and so does a
//! static hint that repeats one. Either way every leak found is counted, by arm and by
//! what became of it ([`LeakAction`]).

use crate::config::OnLeak;
use crate::learn::EarlierHint;
use crate::llm::prompt::leak::{expected_values, repeated};
use crate::llm::prompt::Ask;
use crate::llm::{Synthesis, Synthesizer};
use crate::messages::{FailedTrajectory, HintCategory};

/// The `failure_reason` of the static hint published because the
/// regenerated hint repeated an expected value too.
pub const LEAK_FAILURE_REASON: &str = "leak";

/// What became of a hint that repeated an expected value (the `action`
/// label of `hintstream_hints_hint_leaks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakAction {
    /// Published as written, flagged `leak: true` (`on_leak = "keep"`).
    Kept,
    /// A second request wrote a hint that repeats none of them.
    Regenerated,
    /// The second hint repeated one too, or its request failed: the static
    /// hint, the values withheld, was published.
    StaticFallback,
    /// A static hint repeated one: published with the values withheld.
    Withheld,
}

impl LeakAction {
    pub fn as_str(self) -> &'static str {
        match self {
            LeakAction::Kept => "kept",
            LeakAction::Regenerated => "regenerated",
            LeakAction::StaticFallback => "static_fallback",
            LeakAction::Withheld => "withheld",
        }
    }
}

/// The hint to publish after the guard looked at it.
#[derive(Debug, Clone, PartialEq)]
pub struct Guarded {
    pub synthesis: Synthesis,
    /// Whether the published hint repeats an expected value (the Hint's
    /// `leak`).
    pub leak: bool,
    /// What the guard did; `None` when the first hint repeated nothing.
    pub action: Option<LeakAction>,
}

/// Looks at `first`, the hint `synth` wrote for `t` (with `earlier` hints
/// shown), and acts on a leak as `on_leak` says. The spend of a second
/// request is added to the first's.
pub async fn guard(
    on_leak: OnLeak,
    synth: &Synthesizer,
    t: &FailedTrajectory,
    earlier: &[EarlierHint],
    first: Synthesis,
) -> Guarded {
    let values = expected_values(t);
    let forbidden = repeated(&first.hint, &values);
    if forbidden.is_empty() {
        return Guarded {
            synthesis: first,
            leak: false,
            action: None,
        };
    }
    if on_leak == OnLeak::Keep {
        return Guarded {
            synthesis: first,
            leak: true,
            action: Some(LeakAction::Kept),
        };
    }
    if first.category != HintCategory::LlmSynthesized {
        let (hint, truncated) = synth.static_hint_withholding(t, &values);
        return Guarded {
            synthesis: Synthesis {
                hint,
                hint_truncated: truncated,
                ..first
            },
            leak: false,
            action: Some(LeakAction::Withheld),
        };
    }
    tracing::debug!(instance = %t.instance_id, values = forbidden.len(), "the hint repeats an expected value; asking again");
    let ask = Ask {
        earlier,
        forbidden: &forbidden,
        level: None,
    };
    // Boxed: a model call's future is large, and the guard's is inside
    // every hint's, most of which never ask twice.
    let mut second = Box::pin(synth.synthesize_asking(t, ask)).await;
    add_spend(&mut second, &first);
    let again = repeated(&second.hint, &values);
    if second.category == HintCategory::LlmSynthesized && again.is_empty() {
        return Guarded {
            synthesis: second,
            leak: false,
            action: Some(LeakAction::Regenerated),
        };
    }
    let failure_reason = match second.category {
        HintCategory::LlmSynthesized => Some(LEAK_FAILURE_REASON.to_string()),
        _ => second.failure_reason.take(),
    };
    let (hint, truncated) = synth.static_hint_withholding(t, &values);
    Guarded {
        synthesis: Synthesis {
            hint,
            category: HintCategory::LlmFailedStaticFallback,
            model: None,
            failure_reason,
            hint_truncated: truncated,
            hedged: false,
            ..second
        },
        leak: false,
        action: Some(LeakAction::StaticFallback),
    }
}

/// Adds what `first` spent (tokens, dollars, time) to `second`'s.
fn add_spend(second: &mut Synthesis, first: &Synthesis) {
    second.usage.add(&first.usage);
    second.cost_usd += first.cost_usd;
    second.cache_saved_usd += first.cache_saved_usd;
    second.latency_ms = second.latency_ms.saturating_add(first.latency_ms);
}
