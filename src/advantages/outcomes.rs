//! A step's `HintOutcome`s: from the step's scored rows, one outcome per
//! `hint_id` that its hinted rows name, for stage 2 to publish on
//! `rl.hints.outcomes` after the step (counts only; schemas/hint_outcome.schema.json).
//!
//! A row counts when it is hinted and names a hint; a raw row that names a
//! hint did not run with it and is left out. A hint's run, step and group
//! are its first row's. Outcomes come in the order their hints first appear
//! in the rows, so a step gives the same messages every time it is computed.
//!
//! `transfer` and `reliance` come from the hinted rows that carry both
//! log-probs ([`transfer_and_reliance`]); each is absent, never 0, when it has
//! no row to be a mean of.

use std::collections::HashMap;

use crate::batch::ScoredRows;
use crate::messages::{HintOutcome, SCHEMA_VERSION};
use crate::normalize::finite;

/// One outcome per `hint_id` of `rows` (see the module docs), stamped
/// `created_at` (RFC 3339). A success is a reward over
/// `success_threshold` (stage 2 passes `advantages.success_threshold`, as its
/// step metrics use).
pub fn hint_outcomes(rows: &ScoredRows, success_threshold: f64, created_at: &str) -> Vec<HintOutcome> {
    let mut order: Vec<&str> = Vec::new();
    // Each hint's counted rows, in row order (the first gives its group).
    let mut by_hint: HashMap<&str, Vec<usize>> = HashMap::new();
    for row in 0..rows.len() {
        let Some(hint_id) = rows.hint_id(row) else {
            continue;
        };
        if !rows.is_hinted[row] {
            continue;
        }
        by_hint
            .entry(hint_id)
            .or_insert_with(|| {
                order.push(hint_id);
                Vec::new()
            })
            .push(row);
    }
    order
        .into_iter()
        .filter_map(|hint_id| {
            let counted = by_hint.get(hint_id)?;
            let row = *counted.first()?;
            let rewards = counted.iter().map(|&i| rows.reward[i]);
            let successes = rewards.clone().filter(|&r| r > success_threshold).count() as i64;
            let (transfer, reliance) = transfer_and_reliance(rows, counted, success_threshold);
            Some(HintOutcome {
                schema_version: i64::from(SCHEMA_VERSION),
                hint_id: hint_id.to_string(),
                run_id: rows.run_id[row].to_string(),
                step: rows.step[row],
                instance_id: rows.instance_id[row].to_string(),
                hinted_rollouts: counted.len() as i64,
                successes,
                rescued: successes > 0,
                // Finite for finite rewards, even where their sum is not.
                mean_reward: finite::mean(rewards)?,
                transfer,
                reliance,
                created_at: created_at.to_string(),
            })
        })
        .collect()
}

/// `(transfer, reliance)` of `counted` rows of `rows`: the mean of
/// `success · ω` over the hinted rows with both log-probs, and the mean ρ
/// over those of them that succeeded (a success: a reward over
/// `success_threshold`); each `None` when it has no row. Summed in row
/// order ([`finite::mean`]).
pub fn transfer_and_reliance(
    rows: &ScoredRows,
    counted: &[usize],
    success_threshold: f64,
) -> (Option<f64>, Option<f64>) {
    let carried = counted.iter().filter_map(|&i| {
        let success = rows.reward[i] > success_threshold;
        Some((success, rows.ratio(i)?, rows.reliance(i)?))
    });
    let transfer = finite::mean(
        carried
            .clone()
            .map(|(success, w, _)| if success { w } else { 0.0 }),
    );
    let reliance = finite::mean(carried.filter(|&(success, _, _)| success).map(|(_, _, r)| r));
    (transfer, reliance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ScoredRollout, Validate};

    fn rows(spec: &[(&str, f64, bool, Option<&str>)]) -> ScoredRows {
        let mut r = ScoredRows::default();
        for (i, &(instance, reward, hinted, hint_id)) in spec.iter().enumerate() {
            r.push(&ScoredRollout {
                schema_version: 1,
                run_id: "run".into(),
                step: 4,
                instance_id: instance.into(),
                trajectory_id: format!("t{i}"),
                reward,
                is_hinted: hinted,
                hint_category: hinted.then(|| "llm_synthesized".into()),
                hint_id: hint_id.map(str::to_string),
                response_length: None,
                logprob_hinted: None,
                logprob_unhinted: None,
            });
        }
        r
    }

    #[test]
    fn one_outcome_per_hint_with_its_counts_in_first_seen_order() {
        let step = rows(&[
            ("b", 0.0, false, None),
            ("b", 1.0, true, Some("hb")),
            ("a", 0.0, true, Some("ha")),
            ("b", 0.0, true, Some("hb")),
            ("a", -1.0, true, Some("ha")),
            // A raw row naming a hint did not run with it.
            ("a", 1.0, false, Some("ha")),
            ("c", 0.0, false, None),
        ]);
        let out = hint_outcomes(&step, 0.0, "2026-01-01T00:00:00Z");
        let summary: Vec<_> = out
            .iter()
            .map(|o| {
                (
                    o.hint_id.as_str(),
                    o.instance_id.as_str(),
                    o.hinted_rollouts,
                    o.successes,
                    o.rescued,
                )
            })
            .collect();
        assert_eq!(summary, vec![("hb", "b", 2, 1, true), ("ha", "a", 2, 0, false)]);
        assert_eq!((out[0].mean_reward, out[1].mean_reward), (0.5, -0.5));
        assert_eq!(out[0].key(), "run/4/b");
        for o in &out {
            o.validate().unwrap();
        }
    }

    /// One hinted row of hint `h` with reward, log-probs and length.
    fn carrying(
        reward: f64,
        hinted: Option<f64>,
        unhinted: Option<f64>,
        length: Option<i64>,
    ) -> ScoredRollout {
        ScoredRollout {
            schema_version: 1,
            run_id: "run".into(),
            step: 4,
            instance_id: "a".into(),
            trajectory_id: "t".into(),
            reward,
            is_hinted: true,
            hint_category: None,
            hint_id: Some("h".into()),
            response_length: length,
            logprob_hinted: hinted,
            logprob_unhinted: unhinted,
        }
    }

    fn outcome_of(spec: &[ScoredRollout]) -> HintOutcome {
        let mut rows = ScoredRows::default();
        for r in spec {
            r.validate().unwrap();
            rows.push(r);
        }
        let out = hint_outcomes(&rows, 0.0, "2026-01-01T00:00:00Z");
        out[0].validate().unwrap();
        out[0].clone()
    }

    #[test]
    fn transfer_and_reliance_on_hand_computed_rows() {
        // Row 1: success, 10 tokens, the hint adds 20 nats: ω = e^-2, ρ = 2.
        // Row 2: failure, ω = 1 (capped), ρ = -1: counts 0 in transfer and
        // nothing in reliance. Row 3: success with one log-prob only: left
        // out of both. Row 4: success, ω = e^-0.5, ρ = 0.5.
        let o = outcome_of(&[
            carrying(1.0, Some(-5.0), Some(-25.0), Some(10)),
            carrying(0.0, Some(-9.0), Some(-5.0), Some(4)),
            carrying(1.0, Some(-1.0), None, Some(2)),
            carrying(1.0, Some(-1.0), Some(-2.0), Some(2)),
        ]);
        assert_eq!(o.hinted_rollouts, 4);
        let transfer = ((-2.0f64).exp() + 0.0 + (-0.5f64).exp()) / 3.0;
        assert!((o.transfer.unwrap() - transfer).abs() < 1e-15, "{o:?}");
        assert_eq!(o.reliance, Some((2.0 + 0.5) / 2.0));
        let json = serde_json::to_value(&o).unwrap();
        assert!(json["transfer"].is_f64() && json["reliance"].is_f64(), "{json}");
    }

    #[test]
    fn transfer_and_reliance_are_absent_when_undefined_never_0() {
        // No log-probs at all: both absent, and absent on the wire.
        let o = outcome_of(&[carrying(1.0, None, None, None)]);
        assert_eq!((o.transfer, o.reliance), (None, None));
        let json = serde_json::to_value(&o).unwrap();
        assert!(
            json.get("transfer").is_none() && json.get("reliance").is_none(),
            "{json}"
        );
        // Only one log-prob on each row: both absent.
        let o = outcome_of(&[
            carrying(1.0, Some(-1.0), None, Some(3)),
            carrying(1.0, None, Some(-1.0), Some(3)),
        ]);
        assert_eq!((o.transfer, o.reliance), (None, None));
        // Both log-probs but no success: transfer 0 (defined), reliance absent.
        let o = outcome_of(&[carrying(0.0, Some(-1.0), Some(-3.0), Some(2))]);
        assert_eq!((o.transfer, o.reliance), (Some(0.0), None));
    }

    #[test]
    fn the_success_threshold_decides_what_succeeded() {
        let step = rows(&[("a", 0.5, true, Some("h")), ("a", 0.9, true, Some("h"))]);
        let out = hint_outcomes(&step, 0.6, "2026-01-01T00:00:00Z");
        assert_eq!((out[0].successes, out[0].rescued), (1, true));
        let out = hint_outcomes(&step, 0.9, "2026-01-01T00:00:00Z");
        assert_eq!((out[0].successes, out[0].rescued), (0, false));
    }

    #[test]
    fn rewards_whose_sum_overflows_have_a_finite_mean_reward() {
        let step = rows(&[("a", 1.7e308, true, Some("h")), ("a", 1.7e308, true, Some("h"))]);
        let out = hint_outcomes(&step, 0.0, "2026-01-01T00:00:00Z");
        assert_eq!(out[0].mean_reward, 1.7e308);
        out[0].validate().unwrap();
        let json = serde_json::to_value(&out[0]).unwrap();
        assert_eq!(json["mean_reward"].as_f64(), Some(1.7e308), "never null: {json}");
    }

    #[test]
    fn a_step_without_hint_ids_has_no_outcomes() {
        let step = rows(&[("a", 1.0, true, None), ("a", 0.0, false, None)]);
        assert!(hint_outcomes(&step, 0.0, "2026-01-01T00:00:00Z").is_empty());
    }

    /// Equal JSON values, numbers compared as numbers (`1` equals `1.0`).
    fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        match (a, b) {
            (serde_json::Value::Number(x), serde_json::Value::Number(y)) => x.as_f64() == y.as_f64(),
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    /// The vectors both languages read (`schemas/vectors/outcomes.json`;
    /// python/tests/test_outcome_vectors.py holds `outcome_messages` to
    /// them): every field but `created_at`, and no field a case leaves out.
    #[test]
    fn outcomes_are_the_shared_vectors() {
        let vectors = crate::messages::vectors::shared("outcomes.json");
        let cases = vectors["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let name = case["case"].as_str().unwrap();
            let mut step = ScoredRows::default();
            for (i, row) in case["rows"].as_array().unwrap().iter().enumerate() {
                let mut row = row.clone();
                row["schema_version"] = 1.into();
                if row.get("trajectory_id").is_none() {
                    row["trajectory_id"] = format!("t{i}").into();
                }
                let rollout: ScoredRollout = serde_json::from_value(row).unwrap();
                rollout.validate().unwrap();
                step.push(&rollout);
            }
            let threshold = case["success_threshold"].as_f64().unwrap();
            let got: Vec<serde_json::Value> = hint_outcomes(&step, threshold, "2026-01-01T00:00:00Z")
                .iter()
                .map(|o| {
                    o.validate().unwrap();
                    let mut value = serde_json::to_value(o).unwrap();
                    value.as_object_mut().unwrap().remove("created_at");
                    value
                })
                .collect();
            let want = case["outcomes"].as_array().unwrap();
            assert!(
                got.len() == want.len() && got.iter().zip(want).all(|(g, w)| same(g, w)),
                "{name}:\n got {got:?}\nwant {want:?}"
            );
        }
    }
}
