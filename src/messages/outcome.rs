//! `HintOutcome`: what one hint did for its group's hinted retries, published
//! on `rl.hints.outcomes` by stage 2 (or the trainer client) under the group's
//! key. Counts only: stage 1 joins it with its own hint record by `hint_id`.

use serde::{Deserialize, Serialize};

use super::decode::{rules, DecodeError, Validate};
use super::SCHEMA_VERSION;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HintOutcome {
    pub schema_version: i64,
    /// The hint the retries ran with.
    pub hint_id: String,
    pub run_id: String,
    /// The step of the hint's group.
    pub step: i64,
    pub instance_id: String,
    /// Rollouts of the step that ran with this hint (at least 1).
    pub hinted_rollouts: i64,
    /// Of those, the ones whose reward is over the success threshold.
    pub successes: i64,
    /// `successes > 0`: the hint rescued its group.
    pub rescued: bool,
    /// Mean reward of the hinted rollouts.
    pub mean_reward: f64,
    /// The mean of `success_i · ω_i` over the hinted rollouts that carry
    /// both log-probs (ω: the per-token ratio of the unhinted to the hinted
    /// likelihood, capped at 1; `normalize::offpolicy`), in [0, 1]: how much
    /// of the rescue the policy keeps without the hint. Absent (never 0)
    /// when no rollout carries both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<f64>,
    /// The mean reliance ρ (nats a token the hint adds) over those of them
    /// that succeeded. Absent (never 0) when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliance: Option<f64>,
    pub created_at: String,
}

impl HintOutcome {
    /// `run_id/step/instance_id`: the key of the hint's group, so that every
    /// outcome of one hint lands on one partition, in order.
    pub fn key(&self) -> String {
        super::group_key(&self.run_id, self.step, &self.instance_id)
    }
}

impl Validate for HintOutcome {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("hint_id", &self.hint_id)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        rules::non_empty("instance_id", &self.instance_id)?;
        if self.hinted_rollouts < 1 {
            return Err(DecodeError::invalid(
                "hinted_rollouts",
                format!("must be >= 1, got {}", self.hinted_rollouts),
            ));
        }
        if self.successes < 0 || self.successes > self.hinted_rollouts {
            return Err(DecodeError::invalid(
                "successes",
                format!(
                    "must be between 0 and hinted_rollouts ({}), got {}",
                    self.hinted_rollouts, self.successes
                ),
            ));
        }
        if self.rescued != (self.successes > 0) {
            return Err(DecodeError::invalid(
                "rescued",
                format!(
                    "must be successes > 0 ({} successes), got {}",
                    self.successes, self.rescued
                ),
            ));
        }
        rules::finite("mean_reward", self.mean_reward)?;
        if let Some(t) = self.transfer {
            if !(0.0..=1.0).contains(&t) {
                return Err(DecodeError::invalid(
                    "transfer",
                    format!("must be from 0 to 1, got {t}"),
                ));
            }
        }
        if let Some(r) = self.reliance {
            rules::finite("reliance", r)?;
        }
        rules::rfc3339("created_at", Some(&self.created_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{decode, DecodeLimits};

    fn outcome() -> serde_json::Value {
        serde_json::json!({
            "schema_version": 1,
            "hint_id": "3f2a9c",
            "run_id": "run/7",
            "step": 12,
            "instance_id": "task-41",
            "hinted_rollouts": 2,
            "successes": 1,
            "rescued": true,
            "mean_reward": 0.5,
            "created_at": "2026-11-29T10:00:02.120Z"
        })
    }

    fn decoded(v: &serde_json::Value) -> Result<HintOutcome, DecodeError> {
        decode::<HintOutcome>(v.to_string().as_bytes(), DecodeLimits::default())
    }

    #[test]
    fn a_valid_outcome_decodes_and_keys_like_its_group() {
        let o = decoded(&outcome()).unwrap();
        assert_eq!(o.key(), "run%2F7/12/task-41");
        assert_eq!(
            crate::messages::key_for(&outcome()).as_deref(),
            Some("run%2F7/12/task-41")
        );
    }

    #[test]
    fn inconsistent_counts_are_rejected_with_their_field() {
        for (field, value, want) in [
            ("hinted_rollouts", serde_json::json!(0), "hinted_rollouts"),
            ("successes", serde_json::json!(3), "successes"),
            ("successes", serde_json::json!(-1), "successes"),
            ("rescued", serde_json::json!(false), "rescued"),
            ("hint_id", serde_json::json!(" "), "hint_id"),
            ("step", serde_json::json!(-1), "step"),
            ("created_at", serde_json::json!("yesterday"), "created_at"),
        ] {
            let mut v = outcome();
            v[field] = value;
            let err = decoded(&v).unwrap_err();
            assert_eq!(err.field(), Some(want), "{field}: {err}");
        }
        let mut v = outcome();
        v.as_object_mut().unwrap().remove("mean_reward");
        assert_eq!(decoded(&v).unwrap_err().kind(), "missing_field");
    }
}
