//! Messages of `rl.rollouts.scored`: one `scored_rollout` per rollout of a
//! step, then one `step_end` that says how many rows the step has.

use serde::{Deserialize, Serialize};

use super::decode::{rules, DecodeError, Validate};
use super::SCHEMA_VERSION;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredRollout {
    pub schema_version: i64,
    pub run_id: String,
    pub step: i64,
    pub instance_id: String,
    pub trajectory_id: String,
    pub reward: f64,
    pub is_hinted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_category: Option<String>,
    /// The hint the rollout ran with (hinted rows): stage 2 turns these
    /// into one `HintOutcome` per hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_id: Option<String>,
    /// The response's length in tokens (the reference's `response_mask`
    /// sum), an integer from 1 to [`MAX_RESPONSE_LENGTH`]; 1 when absent.
    /// Only `reinforce_pp` reads it: its mean and variance are over tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_length: Option<i64>,
}

/// The largest `response_length` accepted (u32's range, which the kernels
/// take).
pub const MAX_RESPONSE_LENGTH: i64 = u32::MAX as i64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEnd {
    pub schema_version: i64,
    pub run_id: String,
    pub step: i64,
    /// Rows in the step.
    pub count: i64,
}

/// Any JSON message of `rl.rollouts.scored`, told apart by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ScoredMessage {
    ScoredRollout(ScoredRollout),
    StepEnd(StepEnd),
}

impl Validate for ScoredRollout {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        rules::non_empty("instance_id", &self.instance_id)?;
        rules::non_empty("trajectory_id", &self.trajectory_id)?;
        if let Some(id) = &self.hint_id {
            rules::non_empty("hint_id", id)?;
        }
        if let Some(length) = self.response_length {
            if !(1..=MAX_RESPONSE_LENGTH).contains(&length) {
                return Err(DecodeError::invalid(
                    "response_length",
                    "must be an integer from 1 to 4294967295",
                ));
            }
        }
        rules::finite("reward", self.reward)
    }
}

impl Validate for StepEnd {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        if self.count < 0 {
            return Err(DecodeError::invalid("count", "must be >= 0"));
        }
        Ok(())
    }
}

impl Validate for ScoredMessage {
    fn validate(&self) -> Result<(), DecodeError> {
        match self {
            ScoredMessage::ScoredRollout(row) => row.validate(),
            ScoredMessage::StepEnd(end) => end.validate(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(response_length: Option<i64>) -> ScoredRollout {
        ScoredRollout {
            schema_version: i64::from(SCHEMA_VERSION),
            run_id: "r".into(),
            step: 0,
            instance_id: "i".into(),
            trajectory_id: "t".into(),
            reward: 1.0,
            is_hinted: false,
            hint_category: None,
            hint_id: None,
            response_length,
        }
    }

    #[test]
    fn response_length_is_optional_and_must_be_at_least_1() {
        for ok in [None, Some(1), Some(4096), Some(MAX_RESPONSE_LENGTH)] {
            rollout(ok).validate().unwrap();
        }
        for bad in [Some(0), Some(-1), Some(MAX_RESPONSE_LENGTH + 1)] {
            let err = rollout(bad).validate().unwrap_err().to_string();
            assert!(err.contains("response_length"), "{bad:?}: {err}");
        }
        // Absent on the wire when absent.
        let json = serde_json::to_value(rollout(None)).unwrap();
        assert!(json.get("response_length").is_none());
    }
}
