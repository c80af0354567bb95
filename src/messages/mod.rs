//! The wire contract: typed messages of every topic, their validation and the
//! keys they are published under. Field names are exactly the schemas' (schemas/).

pub mod decode;
mod failed;
mod hint;
pub mod keys;
mod ordered;
mod outcome;
mod scored;

pub use decode::{decode, DecodeError, DecodeLimits, Validate};
pub use failed::{ChatContent, ChatMessage, ContentBlock, FailedTrajectory};
pub use hint::{Hint, HintCategory, HintSource, Usage, DEFAULT_ARM};
pub use keys::{group_key, step_key};
pub use ordered::OrderedJson;
pub use outcome::HintOutcome;
pub use scored::{ScoredMessage, ScoredRollout, StepEnd};

/// The only `schema_version` this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The Kafka key a JSON message of any known kind is published under, read
/// from its own fields. Used by `hintstream produce`.
pub fn key_for(value: &serde_json::Value) -> Option<String> {
    let run_id = value.get("run_id")?.as_str()?;
    let step = value.get("step")?.as_i64()?;
    match (
        value.get("type").and_then(|t| t.as_str()),
        value.get("instance_id"),
    ) {
        (Some("scored_rollout") | Some("step_end"), _) => Some(step_key(run_id, step)),
        (_, Some(instance)) => Some(group_key(run_id, step, instance.as_str()?)),
        _ => Some(step_key(run_id, step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_groups_and_steps() {
        let failed = json!({"run_id": "r", "step": 3, "instance_id": "i-1"});
        assert_eq!(key_for(&failed).as_deref(), Some("r/3/i-1"));
        let row = json!({"type": "scored_rollout", "run_id": "r", "step": 3, "instance_id": "i"});
        assert_eq!(key_for(&row).as_deref(), Some("r/3"));
        assert_eq!(key_for(&json!({"step": 1})), None);
    }
}
