//! Hints that learn: arms compete for failed groups by Thompson sampling on
//! their rescue rates, with a static control, and a task that fails again
//! after an unhelpful hint gets a refined one. The core, without Kafka.
//!
//! - [`arms`]: `[[hints.arms]]` entries, the `[hints]` options, their
//!   validation, and the `hint_id` an arm gives a group;
//! - [`sample`]: the group's seeded random stream and Beta draws;
//! - [`select`]: the arm of a group (pure; what is guaranteed);
//! - [`state`]: tallies, the hint/outcome join and task memory rebuilt from
//!   `rl.hints` and `rl.hints.outcomes` (the counting rules, memory bounds);
//! - [`refine`]: the earlier unhelpful hints a refined hint's prompt shows;
//! - [`levels`]: the level of a graded hint (an arm with `levels`);
//! - [`report`]: per-arm and per-step metrics;
//! - `lru`: the exact LRU map behind the bounds.
//!
//! # Wiring it into stage 1
//!
//! ```text
//! // build
//! let arms = Arms::from_config(config.arms, options, &configured_model_ids)?;
//! let state = Arc<Mutex<LearnState>>::new(LearnState::new(arms));
//! // a task reading rl.hints and rl.hints.outcomes by assignment (not in the
//! // group), from the beginning, decoding with messages::decode:
//! state.observe_hint(&hint);        // every record of rl.hints
//! state.observe_outcome(&outcome);  // every record of rl.hints.outcomes
//! // the stage is ready once both reached the end offsets seen at start.
//!
//! // per failed group (run_id, step, instance_id):
//! let choice = state.choose(run_id, step, instance_id);
//! let spec = &state.arms().specs()[choice.index];
//! // choice.hint_id keys the hint cache, as the hint_id does today.
//! let refinement = state.refinement(run_id, step, instance_id); // Option
//! // prompt: the arm's prompt_version and models; with a refinement, show
//! // refinement.earlier in the user prompt and stamp the Hint with
//! // prompt_version = refine::refined_prompt_version(&spec.prompt_version),
//! // refines = refinement.refines; always arm = spec.name.
//! // A static arm (spec.is_static) writes the static hint, no LLM call.
//! // An arm with levels: state.level(run_id, step, instance_id,
//! // &choice.hint_id, choice.index) is the prompt's level and the Hint's.
//!
//! // metrics: state.run_report(run_id) for Prometheus (pulls, rescues,
//! // posterior means, spend); state.step_metrics(run_id, step) for rl.metrics.
//! ```
//!
//! Stage 2 builds the outcomes with
//! [`crate::advantages::outcomes::hint_outcomes`].
//!
//! Without `[[hints.arms]]`, [`Arms::from_config`] gives the one implicit arm
//! `default`: [`LearnState::choose`] returns it without a draw and its
//! `hint_id` is exactly today's, so a stage that never reads outcomes
//! behaves as before.

pub mod arms;
pub mod levels;
pub mod limits;
mod lru;
pub mod refine;
pub mod report;
pub mod sample;
pub mod select;
pub mod state;

#[cfg(test)]
mod tests;

pub use arms::{hint_id, ArmConfigError, ArmReward, ArmSelection, ArmSpec, Arms, LearnOptions, STATIC_CHAIN};
pub use levels::{next_level, PreviousHint};
pub use limits::StateLimits;
pub use refine::{refined_prompt_version, EarlierHint, Refinement};
pub use report::{ArmReport, MeanTally, RunReport};
pub use select::{select_arm, ChoiceKind, Posterior};
pub use state::{ArmChoice, LearnState, OutcomeCounts, StateStats};
