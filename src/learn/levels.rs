//! Graded hints: the level of a task's next hint under an arm with
//! `levels` (least specific first, e.g. `concept`, `plan`, `step`).
//!
//! The rule ([`next_level`]), from the task's previous hint under the same
//! arm (same `run_id` and `instance_id`, an earlier step):
//! - no previous hint: the first level;
//! - it did not rescue the task: one level up (the last level stays);
//! - it rescued the task: one level down (the first level stays);
//! - its outcome is not known yet: its level again;
//! - its level is not one of the arm's (a hint written before the arm had
//!   these levels): the first level.
//!
//! Everything comes from `rl.hints` (each hint's `level`) and
//! `rl.hints.outcomes`, as [`LearnState`] rebuilds them, so every worker,
//! a restarted one too, gives a task the same level from the same records.
//! A group whose hint is already on `rl.hints` (a redelivery, another
//! worker's late member) keeps that hint's level. Like refinement, the rule
//! uses every outcome known when the group is hinted (the step-read barrier
//! makes that the same on every worker; a hint written while its previous
//! hint's outcome was in flight may differ between two workers racing on
//! one group, and the hint cache then keeps one text per `hint_id`).

use std::collections::BTreeMap;

use super::state::LearnState;
use crate::messages::{HintCategory, HintLevel};

/// What the rule needs of a task's previous hint under the arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreviousHint {
    /// The level it was asked at (`None`: written without one).
    pub level: Option<HintLevel>,
    /// Whether it rescued the task; `None` while its outcome is unknown.
    pub rescued: Option<bool>,
}

/// The level of a task's next hint under an arm with `levels`, after
/// `previous` (see the module's rule); `None` when the arm has no levels.
pub fn next_level(levels: &[HintLevel], previous: Option<PreviousHint>) -> Option<HintLevel> {
    let first = *levels.first()?;
    let Some(previous) = previous else {
        return Some(first);
    };
    let Some(at) = previous
        .level
        .and_then(|level| levels.iter().position(|&l| l == level))
    else {
        return Some(first);
    };
    let next = match previous.rescued {
        Some(true) => at.saturating_sub(1),
        Some(false) => (at + 1).min(levels.len() - 1),
        None => at,
    };
    Some(levels[next])
}

impl LearnState {
    /// The level of the hint `hint_id` of the group `(run_id, step,
    /// instance_id)` under arm `arm` (an index into the arms' specs):
    /// `None` when the arm has no levels. A hint already read with that
    /// `hint_id` keeps its level; otherwise [`next_level`] after the task's
    /// latest hint under the arm from an earlier step.
    ///
    /// # Panics
    /// When `arm` is not below `arms().specs().len()` (indices come from
    /// [`LearnState::choose`], which never returns one out of range).
    pub fn level(
        &self,
        run_id: &str,
        step: i64,
        instance_id: &str,
        hint_id: &str,
        arm: usize,
    ) -> Option<HintLevel> {
        let spec = &self.arms.specs()[arm];
        if spec.levels.is_empty() {
            return None;
        }
        let memory = self.tasks.get(&(run_id.to_string(), instance_id.to_string()));
        let hints = memory.map_or(&[][..], |m| &m.hints[..]);
        if let Some(known) = hints
            .iter()
            .find(|h| h.hint_id == hint_id)
            .and_then(|h| h.level)
            .filter(|l| spec.levels.contains(l))
        {
            return Some(known);
        }
        // Remembered hints are kept oldest step first.
        let previous = hints
            .iter()
            .rev()
            .find(|h| h.step < step && h.arm == spec.name)
            .map(|h| PreviousHint {
                level: h.level,
                rescued: h.outcome.map(|o| o.rescued),
            });
        next_level(&spec.levels, previous)
    }
}

impl LearnState {
    /// One step's per-level metrics of the arms with levels, by their
    /// `rl.metrics` names: `hint/arm/<name>/level/<level>/count` (the
    /// step's hints the LLM wrote under the arm at that level whose outcome
    /// is known; a static fallback is left out, its text has no level) and
    /// `hint/arm/<name>/level/<level>/rescue_rate` (of those, the ones that
    /// rescued their group; absent when the count is 0). Read from the task
    /// memory, where a step's hints are the newest of their tasks (a task
    /// forgotten past [`super::StateLimits`]'s `max_tasks` is not counted).
    pub fn level_metrics(&self, run_id: &str, step: i64) -> BTreeMap<String, f64> {
        let mut counts: BTreeMap<(&str, HintLevel), (i64, i64)> = BTreeMap::new();
        for spec in self.arms.specs() {
            for &level in &spec.levels {
                counts.insert((spec.name.as_str(), level), (0, 0));
            }
        }
        let hints = self
            .tasks
            .iter()
            .filter(|((run, _), _)| run == run_id)
            .flat_map(|(_, memory)| &memory.hints)
            .filter(|h| h.step == step && h.category == HintCategory::LlmSynthesized);
        for h in hints {
            let (Some(level), Some(outcome)) = (h.level, h.outcome) else {
                continue;
            };
            if let Some((count, rescues)) = counts.get_mut(&(h.arm.as_str(), level)) {
                *count += 1;
                *rescues += i64::from(outcome.rescued);
            }
        }
        let mut out = BTreeMap::new();
        for ((arm, level), (count, rescues)) in counts {
            let name = format!("hint/arm/{arm}/level/{level}");
            out.insert(format!("{name}/count"), count as f64);
            if count > 0 {
                out.insert(format!("{name}/rescue_rate"), rescues as f64 / count as f64);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HintLevel::{Concept, Plan, Step};

    const ALL: [HintLevel; 3] = [Concept, Plan, Step];

    fn after(level: HintLevel, rescued: Option<bool>) -> Option<HintLevel> {
        next_level(
            &ALL,
            Some(PreviousHint {
                level: Some(level),
                rescued,
            }),
        )
    }

    #[test]
    fn a_task_s_first_hint_is_at_the_first_level() {
        assert_eq!(next_level(&ALL, None), Some(Concept));
        assert_eq!(next_level(&[Plan, Step], None), Some(Plan));
    }

    #[test]
    fn a_hint_that_did_not_rescue_sends_the_next_one_level_up() {
        assert_eq!(after(Concept, Some(false)), Some(Plan));
        assert_eq!(after(Plan, Some(false)), Some(Step));
    }

    #[test]
    fn a_rescue_sends_the_next_hint_one_level_down() {
        assert_eq!(after(Step, Some(true)), Some(Plan));
        assert_eq!(after(Plan, Some(true)), Some(Concept));
    }

    #[test]
    fn the_levels_are_clamped_at_both_ends() {
        assert_eq!(after(Step, Some(false)), Some(Step), "no level above the last");
        assert_eq!(after(Concept, Some(true)), Some(Concept), "none below the first");
        assert_eq!(
            next_level(
                &[Plan],
                Some(PreviousHint {
                    level: Some(Plan),
                    rescued: Some(false)
                })
            ),
            Some(Plan)
        );
    }

    #[test]
    fn an_unknown_outcome_keeps_the_level_and_an_unknown_level_starts_over() {
        assert_eq!(after(Plan, None), Some(Plan));
        assert_eq!(
            after(Concept, Some(false)).and_then(|l| after(l, None)),
            Some(Plan)
        );
        // Written before the arm had these levels, or at one it dropped.
        let previous = |level| {
            Some(PreviousHint {
                level,
                rescued: Some(false),
            })
        };
        assert_eq!(next_level(&ALL, previous(None)), Some(Concept));
        assert_eq!(next_level(&[Plan, Step], previous(Some(Concept))), Some(Plan));
    }

    #[test]
    fn an_arm_without_levels_has_no_level() {
        assert_eq!(next_level(&[], None), None);
        assert_eq!(after(Plan, Some(false)).and(next_level(&[], None)), None);
    }

    mod state {
        use super::*;
        use crate::learn::{ArmSpec, Arms, LearnOptions};
        use crate::messages::{group_key, Hint, HintOutcome};

        const RUN: &str = "run-1";

        fn arms() -> Arms {
            let mut graded = ArmSpec::llm("graded", &["m"]);
            graded.levels = ALL.to_vec();
            Arms::new(
                vec![graded, ArmSpec::llm("plain", &["m"])],
                LearnOptions::default(),
            )
            .unwrap()
        }

        /// The hint arm `arm` writes for the task at `step`, at the level
        /// the state gives it.
        fn hint(state: &LearnState, arm: usize, step: i64) -> Hint {
            hint_of(state, arm, step, "task")
        }

        fn hint_of(state: &LearnState, arm: usize, step: i64, task: &str) -> Hint {
            let id = state.arms().hint_id(arm, &group_key(RUN, step, task));
            let level = state.level(RUN, step, task, &id, arm);
            serde_json::from_value(serde_json::json!({
                "schema_version": 1, "hint_id": id, "run_id": RUN, "step": step,
                "instance_id": task, "trajectory_id": "t", "hint": "h",
                "category": "llm_synthesized", "model": "m", "prompt_version": "v3",
                "latency_ms": 1, "usage": {"input_tokens": 1, "output_tokens": 1},
                "cost_usd": 0.0, "failure_reason": null,
                "source": {"topic": "f", "partition": 0, "offset": step},
                "created_at": "2026-01-01T00:00:00Z",
                "arm": state.arms().specs()[arm].name, "level": level,
            }))
            .unwrap()
        }

        fn outcome(hint: &Hint, rescued: bool) -> HintOutcome {
            serde_json::from_value(serde_json::json!({
                "schema_version": 1, "hint_id": hint.hint_id, "run_id": RUN, "step": hint.step,
                "instance_id": hint.instance_id, "hinted_rollouts": 2, "successes": i64::from(rescued),
                "rescued": rescued, "mean_reward": 0.5, "created_at": "2026-01-01T00:00:00Z",
            }))
            .unwrap()
        }

        #[test]
        fn a_task_climbs_on_failures_and_steps_down_after_a_rescue_from_the_records_alone() {
            let mut state = LearnState::new(arms());
            let mut levels = Vec::new();
            let mut records = (Vec::new(), Vec::new());
            for (step, rescued) in [(1, false), (2, false), (3, false), (4, true), (5, false)] {
                let h = hint(&state, 0, step);
                levels.push(h.level);
                let o = outcome(&h, rescued);
                state.observe_hint(&h);
                state.observe_outcome(&o);
                records.0.push(h);
                records.1.push(o);
            }
            assert_eq!(
                levels,
                [Some(Concept), Some(Plan), Some(Step), Some(Step), Some(Plan)],
                "concept, plan, step, step (the top holds), then one down after the rescue"
            );
            // A worker that reads the same records (outcomes first, say)
            // gives the next hint and a redelivered one the same levels.
            let mut restarted = LearnState::new(arms());
            for o in &records.1 {
                restarted.observe_outcome(o);
            }
            for h in &records.0 {
                restarted.observe_hint(h);
            }
            assert_eq!(hint(&restarted, 0, 6).level, hint(&state, 0, 6).level);
            assert_eq!(hint(&restarted, 0, 6).level, Some(Step));
            assert_eq!(
                hint(&restarted, 0, 4).level,
                Some(Step),
                "a redelivery keeps its level"
            );
            // Another arm's hints do not move this arm's ladder; an arm
            // without levels has none.
            let other = hint(&state, 1, 6);
            assert_eq!(other.level, None);
            state.observe_hint(&other);
            state.observe_outcome(&outcome(&other, true));
            assert_eq!(hint(&state, 0, 7).level, Some(Step));
        }

        #[test]
        fn a_step_s_metrics_count_each_arm_s_graded_hints_by_level() {
            let mut state = LearnState::new(arms());
            // Step 1: three tasks at concept, two rescued; step 2: the one
            // not rescued at plan, its outcome not known yet.
            for (task, rescued) in [("a", true), ("b", true), ("c", false)] {
                let h = hint_of(&state, 0, 1, task);
                state.observe_hint(&h);
                state.observe_outcome(&outcome(&h, rescued));
            }
            let late = hint_of(&state, 0, 2, "c");
            assert_eq!(late.level, Some(Plan));
            state.observe_hint(&late);
            let m = state.level_metrics(RUN, 1);
            assert_eq!(m["hint/arm/graded/level/concept/count"], 3.0);
            assert!((m["hint/arm/graded/level/concept/rescue_rate"] - 2.0 / 3.0).abs() < 1e-12);
            assert_eq!(m["hint/arm/graded/level/plan/count"], 0.0);
            assert!(
                !m.contains_key("hint/arm/graded/level/plan/rescue_rate"),
                "undefined: absent"
            );
            assert!(!m.keys().any(|k| k.starts_with("hint/arm/plain/")), "{m:?}");
            let m = state.level_metrics(RUN, 2);
            assert_eq!(m["hint/arm/graded/level/plan/count"], 0.0, "no outcome yet");
            assert_eq!(m.len(), 3, "{m:?}");
        }

        #[test]
        fn a_hint_whose_outcome_is_unknown_keeps_its_level_for_the_next() {
            let mut state = LearnState::new(arms());
            let first = hint(&state, 0, 1);
            state.observe_hint(&first);
            state.observe_outcome(&outcome(&first, false));
            let second = hint(&state, 0, 2);
            assert_eq!(second.level, Some(Plan));
            state.observe_hint(&second);
            assert_eq!(hint(&state, 0, 3).level, Some(Plan), "no outcome yet: no move");
        }
    }
}
