//! Refinement: when a task fails again after hints that did not rescue it,
//! the LLM is shown up to `refine_max` of them, each with what it did.
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

/// The heading of the prompt section that shows earlier hints.
pub const SECTION_HEADING: &str = "## Earlier hints that did not help";

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
    /// The section to add to the LLM's user prompt ([`prompt_section`]).
    pub prompt_section: String,
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
        refinement(&earlier)
    }
}

/// The [`Refinement`] of `earlier` (newest first), `None` when empty.
pub fn refinement(earlier: &[EarlierHint]) -> Option<Refinement> {
    if earlier.is_empty() {
        return None;
    }
    Some(Refinement {
        refines: earlier.iter().map(|h| h.hint_id.clone()).collect(),
        prompt_section: prompt_section(earlier),
    })
}

/// `<version>+refine`.
pub fn refined_prompt_version(version: &str) -> String {
    format!("{version}{REFINE_SUFFIX}")
}

/// "2 hinted retries, 0 succeeded".
pub fn outcome_line(hinted_rollouts: i64, successes: i64) -> String {
    let retries = if hinted_rollouts == 1 { "retry" } else { "retries" };
    format!("{hinted_rollouts} hinted {retries}, {successes} succeeded")
}

/// The prompt section that shows `earlier` to the LLM, newest first:
///
/// ```text
/// ## Earlier hints that did not help
/// These hints were given for this task at earlier steps, and the retries
/// that used them still failed. Do not repeat them; write guidance that
/// takes a different approach.
///
/// ### Hint from step 7 (2 hinted retries, 0 succeeded)
/// <its text>
/// ```
pub fn prompt_section(earlier: &[EarlierHint]) -> String {
    let mut out = format!(
        "{SECTION_HEADING}\nThese hints were given for this task at earlier steps, and the retries \
         that used them still failed. Do not repeat them; write guidance that takes a different \
         approach.\n"
    );
    for h in earlier {
        out.push_str(&format!(
            "\n### Hint from step {} ({})\n{}\n",
            h.step,
            outcome_line(h.hinted_rollouts, h.successes),
            h.text.trim_end()
        ));
    }
    out
}
