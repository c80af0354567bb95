//! The `Hint` message for a group, from its best trajectory and what the
//! synthesis produced. Stage 1 publishes it; `eval` reports it.

use crate::kafka::RecordMeta;
use crate::llm::prompt::PROMPT_VERSION;
use crate::llm::Synthesis;
use crate::messages::{FailedTrajectory, Hint, HintSource, SCHEMA_VERSION};

/// The Hint for a group, from its best trajectory and the synthesis.
pub fn build_hint(hint_id: String, best: &FailedTrajectory, source: &RecordMeta, s: Synthesis) -> Hint {
    Hint {
        schema_version: i64::from(SCHEMA_VERSION),
        hint_id,
        run_id: best.run_id.clone(),
        step: best.step,
        instance_id: best.instance_id.clone(),
        trajectory_id: best.trajectory_id.clone(),
        hint: s.hint,
        category: s.category,
        model: s.model,
        prompt_version: PROMPT_VERSION.to_string(),
        latency_ms: s.latency_ms,
        usage: s.usage,
        cost_usd: s.cost_usd,
        failure_reason: s.failure_reason,
        source: HintSource {
            topic: source.topic.clone(),
            partition: source.partition,
            offset: source.offset,
        },
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        arm: crate::messages::DEFAULT_ARM.to_string(),
        refines: Vec::new(),
        hint_truncated: s.hint_truncated,
    }
}
