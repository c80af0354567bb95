//! The `[hints]` section: stage 1, `hintstream hints`: the common stage
//! settings, how long a group waits, which groups get a hint, and the hint
//! cache.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::arms::{default_refine_max, ArmEntry, ArmReward, ArmSelection, LearnOptions};
use super::error::{invalid, ConfigError};
use super::kafka::DrainBound;
use super::stage::{deny_unknown, StageConfig, UnknownKeys};
use super::topics;

/// The longest `hints.cache_ttl_secs` accepted (30 days): beyond it the
/// value is a typo, and exits 2 instead of failing at start-up.
pub const MAX_CACHE_TTL_SECS: u64 = 30 * 24 * 3600;

/// Stage 1's default byte bound: 2,000 groups' worth of typical (~250 KB)
/// trajectories, a small share of a 24 GiB machine.
pub const DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES: u64 = 512 * 1024 * 1024;

/// Stage 1's section: the common stage settings plus its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HintsConfig {
    #[serde(flatten)]
    pub stage: StageConfig,
    /// How long a group waits for its `group_size` trajectories (ms).
    pub group_wait_ms: u64,
    /// A group whose best reward is above this gets no LLM call and no hint
    /// (the reference trainer's `hint_reward_threshold`): it did not fail.
    pub reward_threshold: f64,
    /// How long a published hint is kept to answer a redelivered or late
    /// member of its group without an LLM call (seconds).
    pub cache_ttl_secs: u64,
    /// Bytes of published hints kept to answer redelivered or late
    /// members (`cache_ttl_secs`), counted as the memory they hold (each
    /// hint's message, its encoding, its id); the oldest go first.
    pub cache_max_bytes: u64,
    /// The arms that compete for failed groups (`[[hints.arms]]`); none:
    /// one implicit arm, `default`, and everything behaves as without arms.
    pub arms: Vec<ArmEntry>,
    /// How each failed group's arm is chosen.
    pub arm_selection: ArmSelection,
    /// What an arm earns from an outcome: `rescue` (its hint rescued the
    /// group) or `transfer` (what the policy keeps without the hint: the
    /// outcome's `transfer`, from the log-probs the trainer reports).
    pub arm_reward: ArmReward,
    /// Outcomes fade with this half-life in steps; unset: they never fade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_life_steps: Option<f64>,
    /// Most earlier unhelpful hints of a task shown to the LLM (0: none).
    pub refine_max: usize,
    /// What becomes of a hint that repeats, verbatim, a value the
    /// verifier output presents as expected (a literal of 3 characters or
    /// more after `expected`, `should be`, `==` or `!=`, in the
    /// accumulators or the errors). Either way the leak is counted, by
    /// arm and by what became of it (`hintstream_hints_hint_leaks_total`).
    pub on_leak: OnLeak,
    #[serde(flatten)]
    #[schemars(skip)]
    unknown: UnknownKeys,
}

/// What the leak guard does with a hint that states an expected value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnLeak {
    /// Publish it, flagged `leak: true`.
    #[default]
    Keep,
    /// Ask the model once more, naming the values it repeated as
    /// forbidden; if that hint repeats one too (or the model fails),
    /// publish the static hint with every expected value withheld. A
    /// static hint (no model, a static arm) that repeats one is published
    /// with the values withheld. Under `prompt_version = "reference"` the
    /// first request stays the reference's; the second adds our section of
    /// forbidden values after the reference's text.
    Regenerate,
}

/// Reads the failed trajectories, writes hints, serves metrics on 9464.
fn default_stage() -> StageConfig {
    StageConfig::new(
        "hintstream-hints",
        &topics::default_failed(),
        &topics::default_hints(),
        "127.0.0.1:9464",
        DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES,
    )
}

fn default_group_wait_ms() -> u64 {
    2000
}

fn default_reward_threshold() -> f64 {
    0.0
}

fn default_cache_ttl_secs() -> u64 {
    3600
}

fn default_cache_max_bytes() -> u64 {
    64 * 1024 * 1024
}

impl Default for HintsConfig {
    fn default() -> Self {
        HintsConfig {
            stage: default_stage(),
            group_wait_ms: default_group_wait_ms(),
            reward_threshold: default_reward_threshold(),
            cache_ttl_secs: default_cache_ttl_secs(),
            cache_max_bytes: default_cache_max_bytes(),
            arms: Vec::new(),
            arm_selection: ArmSelection::default(),
            arm_reward: ArmReward::default(),
            half_life_steps: None,
            refine_max: default_refine_max(),
            on_leak: OnLeak::default(),
            unknown: UnknownKeys::new(),
        }
    }
}

impl HintsConfig {
    /// The options that steer the arms.
    pub fn learn_options(&self) -> LearnOptions {
        LearnOptions {
            arm_selection: self.arm_selection,
            arm_reward: self.arm_reward,
            half_life_steps: self.half_life_steps,
            refine_max: self.refine_max,
        }
    }

    /// Whether `[[hints.arms]]` names any arm (outcomes then matter: the
    /// outcomes topic must exist).
    pub fn has_arms(&self) -> bool {
        !self.arms.is_empty()
    }

    /// The section's rules; `drain` as for [`StageConfig::validate`].
    pub fn validate(&self, drain: &DrainBound) -> Result<(), ConfigError> {
        if !self.reward_threshold.is_finite() {
            return invalid("hints.reward_threshold must be finite");
        }
        if !(1..=MAX_CACHE_TTL_SECS).contains(&self.cache_ttl_secs) {
            return invalid(format!(
                "hints.cache_ttl_secs = {} must be within 1..={MAX_CACHE_TTL_SECS} (30 days)",
                self.cache_ttl_secs
            ));
        }
        deny_unknown("hints", &self.unknown)?;
        self.stage.validate("hints", drain)
    }
}

impl std::ops::Deref for HintsConfig {
    type Target = StageConfig;
    fn deref(&self) -> &StageConfig {
        &self.stage
    }
}

impl std::ops::DerefMut for HintsConfig {
    fn deref_mut(&mut self) -> &mut StageConfig {
        &mut self.stage
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn arms_and_their_options_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hintstream.toml");
        std::fs::write(
            &path,
            r#"
[hints]
arm_selection = "fixed"
arm_reward = "transfer"
half_life_steps = 20.0
refine_max = 1
on_leak = "regenerate"

[[hints.arms]]
name = "sonnet"
models = ["claude-sonnet-4-5"]
weight = 3.0

[[hints.arms]]
name = "control"
static = true
min_share = 0.1
"#,
        )
        .unwrap();
        let config = Config::load(Some(&path), &Default::default()).unwrap();
        let h = &config.hints;
        assert!(h.has_arms());
        assert_eq!(h.arms.len(), 2);
        assert_eq!(h.arms[0].models, vec!["claude-sonnet-4-5".to_string()]);
        assert_eq!(
            (
                h.arms[0].weight,
                h.arms[0].min_share,
                h.arms[0].prompt_version.as_deref()
            ),
            (3.0, 0.05, None)
        );
        assert!(h.arms[1].is_static);
        let options = h.learn_options();
        assert_eq!(options.arm_selection, crate::config::ArmSelection::Fixed);
        assert_eq!(options.arm_reward, crate::config::ArmReward::Transfer);
        assert_eq!(
            Config::default().hints.learn_options().arm_reward,
            crate::config::ArmReward::Rescue
        );
        assert_eq!((options.half_life_steps, options.refine_max), (Some(20.0), 1));
        assert_eq!(h.on_leak, crate::config::OnLeak::Regenerate);
        assert!(!Config::default().hints.has_arms());
        assert_eq!(Config::default().hints.on_leak, crate::config::OnLeak::Keep);
    }

    #[test]
    fn rejects_drain_longer_than_session() {
        let mut config = Config::default();
        config.hints.drain_timeout_secs = 60;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("session.timeout.ms"), "{err}");
    }
}
