//! `[[hints.arms]]` and the `[hints]` options that steer them: what an arm
//! is (a prompt version x a model chain, or static hints as the control) as
//! the file writes it. The rules that span the arms (unique names, one
//! control, floors adding up to at most 1) are checked where the arms are
//! built (`learn::Arms::new`), at stage start-up (exit 2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::messages::HintLevel;

/// One `[[hints.arms]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArmEntry {
    /// Unique; letters, digits, `_`, `-` and `.` only (it names metrics).
    pub name: String,
    /// The prompt version the arm's LLM calls use; unset: `llm.prompt_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_version: Option<String>,
    /// The model chain, tried in order (then the static fallback). Empty for
    /// the static arm.
    #[serde(default)]
    pub models: Vec<String>,
    /// The control: static hints built from the verifier feedback, no LLM.
    /// At most one arm is static.
    #[serde(default, rename = "static")]
    pub is_static: bool,
    /// The arm's share under `arm_selection = "fixed"` (relative to the
    /// other arms' weights); unused by Thompson sampling.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// A floor on the probability that a group goes to this arm, per step.
    /// The floors of all arms add up to at most 1.
    #[serde(default = "default_min_share")]
    pub min_share: f64,
    /// The Beta prior of the arm's rescue rate: its pseudo-rescues (with
    /// `prior_beta`, its pseudo-failures).
    #[serde(default = "default_prior")]
    pub prior_alpha: f64,
    /// The Beta prior of the arm's rescue rate: its pseudo-failures (with
    /// `prior_alpha`, its pseudo-rescues).
    #[serde(default = "default_prior")]
    pub prior_beta: f64,
    /// Graded hints: the levels a task's hints under this arm climb, from
    /// the least specific (`concept`: the missing knowledge or principle,
    /// never the answer; `plan`: the approach in a few steps; `step`: the
    /// next concrete action), in that order, e.g. `["concept", "plan",
    /// "step"]`. A task's first hint is at the first level; after a hint
    /// that did not rescue it, the next goes one level up, after a rescue
    /// one level down. Empty: one prompt, no level. Needs an LLM arm with
    /// `prompt_version = "v3"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<HintLevel>,
}

pub fn default_weight() -> f64 {
    1.0
}

pub fn default_min_share() -> f64 {
    0.05
}

pub fn default_prior() -> f64 {
    1.0
}

pub fn default_refine_max() -> usize {
    2
}

/// How each failed group's arm is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArmSelection {
    /// Thompson sampling on each arm's Beta posterior of `rescued`.
    #[default]
    Thompson,
    /// The arms' `weight`s as fixed shares: a plain A/B test.
    Fixed,
}

/// What an arm's Beta posterior counts as its reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArmReward {
    /// Each outcome is one trial: a success when its hint rescued the
    /// group (any hinted retry succeeded).
    #[default]
    Rescue,
    /// Each outcome is a fractional trial by its `transfer` (the mean of
    /// success times the per-token ratio of the unhinted to the hinted
    /// likelihood): α += transfer, β += 1 − transfer, so a hint the policy
    /// succeeds with only while it reads the hint earns little. An outcome
    /// without `transfer` (its trainer reports no log-probs) counts as
    /// rescue, and is counted (`learn_outcomes_without_transfer`).
    Transfer,
}

/// The `[hints]` options that steer the arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnOptions {
    #[serde(default)]
    pub arm_selection: ArmSelection,
    /// What the posteriors count.
    #[serde(default)]
    pub arm_reward: ArmReward,
    /// An outcome `n` steps older than the group being hinted weighs
    /// `0.5^(n / half_life_steps)`; unset: every outcome weighs 1.
    #[serde(default)]
    pub half_life_steps: Option<f64>,
    /// Most earlier unhelpful hints of a task shown to the LLM (0: no
    /// refinement).
    #[serde(default = "default_refine_max")]
    pub refine_max: usize,
}

impl Default for LearnOptions {
    fn default() -> Self {
        LearnOptions {
            arm_selection: ArmSelection::default(),
            arm_reward: ArmReward::default(),
            half_life_steps: None,
            refine_max: default_refine_max(),
        }
    }
}
