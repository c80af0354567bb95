//! What the hints did in training: stage 2's computation and step metrics
//! over recorded scored rollouts, step by step, with the outcomes by hint
//! category and the groups whose learning signal a hint rescued.

use std::path::Path;

use super::error::EvalError;
use super::input::read_scored;
use super::report::{outcomes_by_category, Outcomes, StepOutcome};
use crate::advantages::compute_step;
use crate::advantages::step_metrics::{step_metrics, MetricOptions};
use crate::config::Config;

/// Stage 2's computation and step metrics over recorded scored rollouts.
pub(super) fn outcomes(path: &Path, config: Config) -> Result<Outcomes, EvalError> {
    let scored = read_scored(path, config.decode_limits())?;
    let options = config.normalize.options();
    let mut steps = Vec::new();
    let mut rows = 0u64;
    for step_rows in scored.steps {
        let (run_id, step) = (step_rows.run_id[0].to_string(), step_rows.step[0]);
        rows += step_rows.len() as u64;
        let result =
            compute_step(step_rows, &options, config.normalize.device).map_err(|e| EvalError::Outcomes {
                step: crate::messages::step_key(&run_id, step),
                reason: e.to_string(),
            })?;
        let metrics = step_metrics(
            &result.rows,
            &result.groups,
            &result.advantages,
            &MetricOptions::from(&config.advantages),
        );
        steps.push(StepOutcome {
            run_id,
            step,
            rows: result.rows.len(),
            metrics,
        });
    }
    let signal_rescued = steps
        .iter()
        .map(|s| s.metrics.get("hint/signal_rescued_count").copied().unwrap_or(0.0) as u64)
        .sum();
    Ok(Outcomes {
        rows,
        rejected: scored.rejected,
        by_category: outcomes_by_category(&steps),
        steps,
        signal_rescued,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        step: i64,
        instance: &str,
        id: &str,
        reward: f64,
        hinted: Option<&str>,
    ) -> crate::messages::ScoredRollout {
        crate::messages::ScoredRollout {
            schema_version: 1,
            run_id: "r".into(),
            step,
            instance_id: instance.into(),
            trajectory_id: id.into(),
            reward,
            is_hinted: hinted.is_some(),
            hint_category: hinted.map(str::to_string),
            hint_id: None,
            response_length: None,
            logprob_hinted: None,
            logprob_unhinted: None,
        }
    }

    #[test]
    fn outcomes_come_from_json_rows_and_arrow_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scored.jsonl");
        // Step 1 as JSON rows: g1's raw rows failed and its hinted row
        // succeeded (signal rescued); g2's hinted row failed too.
        let mut lines: Vec<String> = [
            row(1, "g1", "a", 0.0, None),
            row(1, "g1", "b", 0.0, None),
            row(1, "g1", "c", 1.0, Some("llm_synthesized")),
            row(1, "g2", "d", 0.0, None),
            row(1, "g2", "e", 0.0, Some("static_fallback")),
        ]
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap();
            v["type"] = "scored_rollout".into();
            v.to_string()
        })
        .collect();
        lines.push(
            r#"{"type": "step_end", "schema_version": 1, "run_id": "r", "step": 1, "count": 5}"#.into(),
        );
        lines.push("{broken".into());
        // Step 2 as one recorded Arrow message: g3 rescued by an LLM hint.
        let mut rows = crate::batch::ScoredRows::default();
        for r in [
            row(2, "g3", "f", 0.0, None),
            row(2, "g3", "g", 1.0, Some("llm_synthesized")),
            row(2, "g3", "h", 0.0, Some("llm_synthesized")),
        ] {
            rows.push(&r);
        }
        let arrow = crate::batch::ipc::encode_stream(&[rows.to_batch().unwrap()]).unwrap();
        lines.push(
            crate::tools::RecordedMessage {
                topic: "rl.rollouts.scored".into(),
                partition: 0,
                offset: 9,
                timestamp: None,
                key: crate::tools::recorded::Bytes::new(Some(b"r/2".to_vec())),
                value: crate::tools::recorded::Bytes::new(Some(arrow)),
                headers: vec![],
            }
            .to_line(),
        );
        std::fs::write(&path, lines.join("\n")).unwrap();

        let o = outcomes(&path, Config::default()).unwrap();
        assert_eq!(o.rows, 8);
        assert_eq!(o.rejected.get("not_json"), Some(&1));
        assert_eq!(o.steps.len(), 2);
        assert_eq!(o.signal_rescued, 2);
        assert_eq!(o.steps[0].metrics["hint/signal_rescued_count"], 1.0);
        assert_eq!(o.steps[0].metrics["hint/signal_rescued"], 0.5, "g1 of g1 and g2");
        let llm = o.by_category["llm_synthesized"];
        assert_eq!((llm.hinted_rollouts, llm.successes), (3, 2));
        let fallback = o.by_category["static_fallback"];
        assert_eq!((fallback.hinted_rollouts, fallback.successes), (1, 0));
    }
}
