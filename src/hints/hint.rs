//! The `Hint` message for a group, from its best trajectory and what the
//! synthesis produced. Stage 1 publishes it; `eval` reports it.

use crate::kafka::RecordMeta;
use crate::llm::Synthesis;
use crate::messages::{FailedTrajectory, Hint, HintLevel, HintSource, DEFAULT_ARM, SCHEMA_VERSION};

/// What a hint was written with, beyond the synthesis: the arm, the
/// prompt version (`<version>+refine` for a refined hint), the earlier
/// hints it refines and its level (a graded hint).
#[derive(Debug, Clone, PartialEq)]
pub struct HintLabels {
    pub arm: String,
    pub prompt_version: String,
    pub refines: Vec<String>,
    /// The level a graded hint was asked at; `None` when its arm has none.
    pub level: Option<HintLevel>,
}

impl HintLabels {
    /// The implicit arm's labels: a fresh hint of `prompt_version`.
    pub fn default_arm(prompt_version: &str) -> HintLabels {
        HintLabels {
            arm: DEFAULT_ARM.to_string(),
            prompt_version: prompt_version.to_string(),
            refines: Vec::new(),
            level: None,
        }
    }
}

/// The Hint for a group, from its best trajectory and the synthesis;
/// `leak` false (the leak guard sets it).
pub fn build_hint(
    hint_id: String,
    best: &FailedTrajectory,
    source: &RecordMeta,
    s: Synthesis,
    labels: HintLabels,
) -> Hint {
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
        prompt_version: labels.prompt_version,
        latency_ms: s.latency_ms,
        usage: s.usage,
        cost_usd: s.cost_usd,
        failure_reason: s.failure_reason,
        source: HintSource {
            topic: source.topic.to_string(),
            partition: source.partition,
            offset: source.offset,
        },
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        arm: labels.arm,
        refines: labels.refines,
        hint_truncated: s.hint_truncated,
        hedged: s.hedged,
        leak: false,
        level: labels.level,
    }
}
