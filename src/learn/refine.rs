//! Refinement: when a task fails again after hints that did not rescue it,
//! the LLM is shown up to `refine_max` of them, each with what it did (the
//! prompt shows them: `llm::prompt::earlier`).
//!
//! Unlike the arm, refinement uses every outcome known when the group is
//! hinted, the previous step's included (no two-step lag): a redelivery gets
//! its text from the hint cache, keyed by a `hint_id` that does not depend
//! on the refinement (see [`super::arms::hint_id`]). A refined hint carries
//! the ids it was shown in `refines` and the prompt version
//! `<version>+refine` ([`refined_prompt_version`]).

use super::state::LearnState;
use crate::messages::HintCategory;

/// Appended to an arm's prompt version on a refined hint.
pub const REFINE_SUFFIX: &str = "+refine";

/// An earlier hint of a task that did not rescue it, with its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierHint {
    pub hint_id: String,
    pub step: i64,
    pub arm: String,
    pub category: HintCategory,
    /// The text as remembered (cut at
    /// [`super::limits::MAX_REMEMBERED_HINT_BYTES`]).
    pub text: String,
    pub hinted_rollouts: i64,
    pub successes: i64,
}

/// What a refined hint's prompt and message take from earlier hints.
#[derive(Debug, Clone, PartialEq)]
pub struct Refinement {
    /// The earlier hints' ids, newest first: the Hint's `refines`.
    pub refines: Vec<String>,
    /// The earlier hints, newest first, for the LLM's user prompt.
    pub earlier: Vec<EarlierHint>,
}

impl LearnState {
    /// Up to `refine_max` hints of the task `(run_id, instance_id)` from
    /// steps before `before_step` whose known outcome did not rescue it,
    /// newest first. Hints without a known outcome are left out: nothing
    /// says they failed.
    pub fn earlier_unhelpful(
        &self,
        run_id: &str,
        instance_id: &str,
        before_step: i64,
        refine_max: usize,
    ) -> Vec<EarlierHint> {
        let Some(memory) = self.tasks.get(&(run_id.to_string(), instance_id.to_string())) else {
            return Vec::new();
        };
        memory
            .hints
            .iter()
            .rev()
            .filter(|h| h.step < before_step)
            .filter_map(|h| {
                let outcome = h.outcome?;
                (!outcome.rescued).then(|| EarlierHint {
                    hint_id: h.hint_id.clone(),
                    step: h.step,
                    arm: h.arm.clone(),
                    category: h.category,
                    text: h.text.clone(),
                    hinted_rollouts: outcome.hinted_rollouts,
                    successes: outcome.successes,
                })
            })
            .take(refine_max)
            .collect()
    }

    /// The refinement of a group of `(run_id, step, instance_id)` under the
    /// configured `refine_max`, or `None` when there is nothing to show.
    pub fn refinement(&self, run_id: &str, step: i64, instance_id: &str) -> Option<Refinement> {
        let earlier = self.earlier_unhelpful(run_id, instance_id, step, self.arms.options().refine_max);
        refinement(earlier)
    }
}

/// The [`Refinement`] of `earlier` (newest first), `None` when empty.
pub fn refinement(earlier: Vec<EarlierHint>) -> Option<Refinement> {
    if earlier.is_empty() {
        return None;
    }
    Some(Refinement {
        refines: earlier.iter().map(|h| h.hint_id.clone()).collect(),
        earlier,
    })
}

/// `<version>+refine`.
pub fn refined_prompt_version(version: &str) -> String {
    format!("{version}{REFINE_SUFFIX}")
}
