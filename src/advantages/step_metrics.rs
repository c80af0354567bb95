//! The per-step metrics published on `rl.metrics`. Names shared with the
//! reference trainer (SkyRL-Fleet's generator and trainer) mean what they
//! mean there; a metric that is undefined for a step is absent, never 0.
//!
//! | name | meaning | present when |
//! |---|---|---|
//! | `hint/total_hinted_rollouts` | hinted rows | the step has hinted rows |
//! | `hint/hint_success_rate` | hinted rows that succeeded / hinted rows | the step has hinted rows |
//! | `hint/prompts_hinted` | groups (instance_ids) with a hinted row | the step has hinted rows |
//! | `hint/signal_rescued` | hinted groups with a successful hinted row / hinted groups | the step has hinted rows |
//! | `hint/signal_rescued_count` | hinted groups with a successful hinted row | the step has hinted rows |
//! | `hint/zero_signal_rescued_count` | hinted groups whose raw rows all failed and a hinted row succeeded (GRPO signal that would otherwise be zero) | the step has hinted rows |
//! | `hint/category_llm_synthesized_count`, `_success_rate` | hinted rows of that category; their successes / count | that category has rows |
//! | `hint/category_static_fallback_count`, `_success_rate` | hinted rows whose category ends in `fallback` (both fallback kinds) | such rows exist |
//! | `hint/transfer_rate` | mean of success · ω over hinted rows with both log-probs (ω = min(1, exp((logprob_unhinted − logprob_hinted) / response_length))) | a hinted row carries both log-probs |
//! | `hint/reliance` | mean of ρ = (logprob_hinted − logprob_unhinted) / response_length over those rows that succeeded, in nats a token | such a row succeeded |
//! | `reward/avg_pass_at_<n>` | groups with any successful row, hinted rows included / groups (the reference's definition; n = `advantages.samples_per_prompt`, else the largest raw group) | always |
//! | `reward/pass_at_<k>` | the unbiased pass@k estimator 1 − C(n−c,k)/C(n,k) over raw rows, averaged over groups with ≥ k raw rows | some group has ≥ k raw rows |
//! | `reward/avg_raw_reward` | mean reward over all rows, hinted included (the reference's name) | always |
//! | `reward/mean_positive_reward` | mean of max(reward, 0) over all rows | always |
//! | `advantage/extreme_count` | rows with abs(advantage) > 1e3 | always |
//! | `advantage/rows` | rows in the step | always |
//!
//! A row succeeded when its reward is above `advantages.success_threshold`
//! (0 by default, the reference's `> 0`). The service adds `step` and
//! `advantage/duplicate_rows`. Every value is finite: means of rewards whose
//! sum overflows are taken on rescaled rewards (`normalize::finite`).

use std::collections::BTreeMap;

use super::outcomes::transfer_and_reliance;
use crate::batch::ScoredRows;
use crate::config::AdvantagesConfig;
use crate::messages::HintCategory;
use crate::normalize::{finite, Advantages, DenseGroups, EXTREME_ADVANTAGE};

/// Flat metric name → value.
pub type StepMetrics = BTreeMap<String, f64>;

/// Rows and their successes. Counts of 32 bits: a step holds fewer than
/// 2^32 rows (its rows are numbered so).
#[derive(Default, Clone, Copy)]
struct Tally {
    count: u32,
    successes: u32,
}

impl Tally {
    fn add(&mut self, success: bool) {
        self.count += 1;
        self.successes += u32::from(success);
    }

    /// Successes / count; `None` for an empty tally (undefined, not 0).
    fn rate(&self) -> Option<f64> {
        (self.count > 0).then(|| self.successes as f64 / self.count as f64)
    }
}

/// What the step metrics are computed with.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricOptions<'a> {
    /// A row succeeded when its reward is above this.
    pub success_threshold: f64,
    /// The k of `reward/pass_at_<k>`.
    pub pass_at_k: &'a [u32],
    /// The n of `reward/avg_pass_at_<n>` (the trainer's samples per
    /// prompt); `None` = the largest raw group of the step.
    pub samples_per_prompt: Option<u32>,
}

impl<'a> From<&'a AdvantagesConfig> for MetricOptions<'a> {
    /// The metrics `[advantages]` asks for (`samples_per_prompt = 0`: the
    /// largest raw group).
    fn from(config: &'a AdvantagesConfig) -> Self {
        MetricOptions {
            success_threshold: config.success_threshold,
            pass_at_k: &config.pass_at_k,
            samples_per_prompt: (config.samples_per_prompt > 0).then_some(config.samples_per_prompt),
        }
    }
}

/// A step's rows counted: per group, (raw rows, hinted rows); the hinted
/// rows; the hinted rows in all and by category; and the sums of the rows'
/// rewards and of their positive parts, in row order.
struct Tallies {
    groups: Vec<(Tally, Tally)>,
    hinted_rows: Vec<usize>,
    sums: [f64; 2],
    hinted: Tally,
    llm: Tally,
    fallback: Tally,
}

impl Tallies {
    /// One pass over every row (a random access a row into a table of 16
    /// bytes a group, the raw and hinted tallies side by side and chosen
    /// without a branch; the sums' additions overlap its misses), then the
    /// hinted rows' categories on their own.
    fn of(rows: &ScoredRows, dense: &DenseGroups, success_threshold: f64) -> Self {
        let success = |i: usize| rows.reward[i] > success_threshold;
        let mut groups = vec![[Tally::default(); 2]; dense.n_groups];
        let mut hinted_rows = Vec::new();
        let mut sums = [-0.0, -0.0];
        let columns = dense.ids.iter().zip(&rows.reward).zip(&rows.is_hinted);
        for (i, ((&group, &reward), &is_hinted)) in columns.enumerate() {
            groups[group as usize][usize::from(is_hinted)].add(reward > success_threshold);
            sums[0] += reward;
            sums[1] += reward.max(0.0);
            if is_hinted {
                hinted_rows.push(i);
            }
        }
        let groups = groups.into_iter().map(|[raw, hinted]| (raw, hinted)).collect();
        let (mut hinted, mut llm, mut fallback) = (Tally::default(), Tally::default(), Tally::default());
        for &i in &hinted_rows {
            hinted.add(success(i));
            match rows.hint_category[i].as_deref() {
                Some(c) if c == HintCategory::LlmSynthesized.as_str() => llm.add(success(i)),
                Some(c) if c.ends_with("fallback") => fallback.add(success(i)),
                _ => {}
            }
        }
        Tallies {
            groups,
            hinted_rows,
            sums,
            hinted,
            llm,
            fallback,
        }
    }
}

/// Computes the step's metrics (see the module docs for each one). `dense`:
/// the rows' `instance_id` groups, a dense id a row ([`StepResult::groups`]).
///
/// [`StepResult::groups`]: super::StepResult::groups
pub fn step_metrics(
    rows: &ScoredRows,
    dense: &DenseGroups,
    advantages: &Advantages,
    options: &MetricOptions<'_>,
) -> StepMetrics {
    let mut m = row_metrics(rows, dense, options);
    m.insert("advantage/extreme_count".into(), extreme_count(advantages) as f64);
    m
}

/// The step's metrics that need no advantages: all but
/// `advantage/extreme_count` ([`extreme_count`]). A step's worker counts
/// these while its kernel runs.
pub fn row_metrics(rows: &ScoredRows, dense: &DenseGroups, options: &MetricOptions<'_>) -> StepMetrics {
    let Tallies {
        groups,
        hinted_rows,
        sums: [reward_sum, positive_sum],
        hinted,
        llm,
        fallback,
    } = Tallies::of(rows, dense, options.success_threshold);

    let mut m = StepMetrics::new();
    if hinted.count > 0 {
        let prompts_hinted = groups.iter().filter(|(_, h)| h.count > 0).count();
        let rescued = groups.iter().filter(|(_, h)| h.successes > 0).count();
        let rescued_from_zero = groups
            .iter()
            .filter(|(raw, h)| h.successes > 0 && raw.successes == 0)
            .count();
        m.insert("hint/total_hinted_rollouts".into(), hinted.count as f64);
        m.extend(hinted.rate().map(|r| ("hint/hint_success_rate".into(), r)));
        m.insert("hint/prompts_hinted".into(), prompts_hinted as f64);
        m.insert(
            "hint/signal_rescued".into(),
            rescued as f64 / prompts_hinted as f64,
        );
        m.insert("hint/signal_rescued_count".into(), rescued as f64);
        m.insert("hint/zero_signal_rescued_count".into(), rescued_from_zero as f64);
        for (name, tally) in [("llm_synthesized", &llm), ("static_fallback", &fallback)] {
            if let Some(rate) = tally.rate() {
                m.insert(format!("hint/category_{name}_count"), tally.count as f64);
                m.insert(format!("hint/category_{name}_success_rate"), rate);
            }
        }
        let (transfer, reliance) = transfer_and_reliance(rows, &hinted_rows, options.success_threshold);
        m.extend(transfer.map(|t| ("hint/transfer_rate".into(), t)));
        m.extend(reliance.map(|r| ("hint/reliance".into(), r)));
    }

    if !rows.is_empty() {
        let n = options
            .samples_per_prompt
            .unwrap_or_else(|| groups.iter().map(|(raw, _)| raw.count).max().unwrap_or(0));
        let passed = groups
            .iter()
            .filter(|(raw, h)| raw.successes + h.successes > 0)
            .count();
        m.insert(
            format!("reward/avg_pass_at_{n}"),
            passed as f64 / groups.len() as f64,
        );
        m.insert(
            "reward/avg_raw_reward".into(),
            mean(reward_sum, rows.reward.iter().copied()),
        );
        m.insert(
            "reward/mean_positive_reward".into(),
            mean(positive_sum, rows.reward.iter().map(|r| r.max(0.0))),
        );
    }
    for &k in options.pass_at_k {
        let estimates: Vec<f64> = groups
            .iter()
            .filter(|(raw, _)| raw.count >= k)
            .map(|(raw, _)| pass_at_k_estimate(raw.count.into(), raw.successes.into(), k.into()))
            .collect();
        if !estimates.is_empty() {
            m.insert(
                format!("reward/pass_at_{k}"),
                estimates.iter().sum::<f64>() / estimates.len() as f64,
            );
        }
    }
    m.insert("advantage/rows".into(), rows.len() as f64);
    // Never the case (means are finite, rates are ratios of counts): a
    // value that is not finite is left out, as an undefined one is.
    m.retain(|_, v| v.is_finite());
    m
}

/// `advantage/extreme_count`: the advantages beyond [`EXTREME_ADVANTAGE`]
/// in absolute value.
pub fn extreme_count(advantages: &Advantages) -> usize {
    advantages
        .advantage
        .iter()
        .filter(|a| a.abs() > EXTREME_ADVANTAGE)
        .count()
}

/// The mean of at least one finite value, given their `sum` in order: that
/// sum over their count, or where it overflows, [`finite::mean`] (always
/// finite).
fn mean(sum: f64, values: impl ExactSizeIterator<Item = f64> + Clone) -> f64 {
    if sum.is_finite() {
        return sum / values.len() as f64;
    }
    finite::mean(values).unwrap_or(0.0)
}

/// 1 − C(n−c, k) / C(n, k), computed as a running product (no overflow).
pub fn pass_at_k_estimate(n: u64, c: u64, k: u64) -> f64 {
    if n.saturating_sub(c) < k {
        return 1.0;
    }
    let mut fail_all = 1.0;
    for i in (n - c + 1)..=n {
        fail_all *= 1.0 - k as f64 / i as f64;
    }
    1.0 - fail_all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::ScoredRollout;

    fn rows(spec: &[(&str, f64, Option<&str>)]) -> ScoredRows {
        let mut r = ScoredRows::default();
        for (i, (group, reward, category)) in spec.iter().enumerate() {
            r.push(&ScoredRollout {
                schema_version: 1,
                run_id: "r".into(),
                step: 1,
                instance_id: (*group).into(),
                trajectory_id: format!("t{i}"),
                reward: *reward,
                is_hinted: category.is_some(),
                hint_category: category.map(str::to_string),
                hint_id: None,
                response_length: None,
                logprob_hinted: None,
                logprob_unhinted: None,
            });
        }
        r
    }

    fn metrics(r: &ScoredRows) -> StepMetrics {
        let advantages = Advantages {
            advantage: vec![0.0; r.len()],
            ..Default::default()
        };
        step_metrics(
            r,
            &DenseGroups::from_strings(r.instance_id.iter()),
            &advantages,
            &MetricOptions {
                success_threshold: 0.0,
                pass_at_k: &[1, 4, 8],
                samples_per_prompt: None,
            },
        )
    }

    #[test]
    fn transfer_rate_and_reliance_come_from_rows_with_both_log_probs() {
        let plain = rows(&[("a", 0.0, None), ("a", 1.0, Some("llm_synthesized"))]);
        let m = metrics(&plain);
        assert!(
            !m.contains_key("hint/transfer_rate") && !m.contains_key("hint/reliance"),
            "{m:?}"
        );
        // Hinted rows: a success with ω = e^-1, ρ = 1 (2 tokens, 2 nats); a
        // failure with ω = 1; a success with one log-prob (left out).
        let mut r = rows(&[("a", 0.0, None)]);
        for (reward, hinted, unhinted) in [
            (1.0, Some(-1.0), Some(-3.0)),
            (0.0, Some(-2.0), Some(-1.0)),
            (1.0, Some(-1.0), None),
        ] {
            r.push(&ScoredRollout {
                schema_version: 1,
                run_id: "r".into(),
                step: 1,
                instance_id: "a".into(),
                trajectory_id: "h".into(),
                reward,
                is_hinted: true,
                hint_category: Some("llm_synthesized".into()),
                hint_id: None,
                response_length: Some(2),
                logprob_hinted: hinted,
                logprob_unhinted: unhinted,
            });
        }
        let m = metrics(&r);
        assert_eq!(m["hint/transfer_rate"], (-1.0f64).exp() / 2.0);
        assert_eq!(m["hint/reliance"], 1.0);
    }

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        // n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6.
        assert!((pass_at_k_estimate(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k_estimate(4, 0, 2), 0.0);
        assert_eq!(pass_at_k_estimate(4, 3, 2), 1.0);
        // k=1 is the success rate.
        assert!((pass_at_k_estimate(8, 3, 1) - 3.0 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn signal_rescued_is_the_reference_fraction() {
        let llm = Some("llm_synthesized");
        let r = rows(&[
            // a: raw all failed, a hinted success: rescued from zero.
            ("a", 0.0, None),
            ("a", 0.0, None),
            ("a", 1.0, llm),
            // b: a raw success and a hinted success: rescued, not from zero.
            ("b", 1.0, None),
            ("b", 0.0, None),
            ("b", 1.0, Some("static_fallback")),
            // c: hinted, never succeeded.
            ("c", 0.0, None),
            ("c", 0.0, Some("llm_failed_static_fallback")),
            // d: not hinted.
            ("d", 0.5, None),
        ]);
        let m = metrics(&r);
        assert_eq!(m["hint/prompts_hinted"], 3.0);
        assert_eq!(m["hint/signal_rescued"], 2.0 / 3.0);
        assert_eq!(m["hint/signal_rescued_count"], 2.0);
        assert_eq!(m["hint/zero_signal_rescued_count"], 1.0);
        assert_eq!(m["hint/total_hinted_rollouts"], 3.0);
        assert_eq!(m["hint/hint_success_rate"], 2.0 / 3.0);
        assert_eq!(m["hint/category_llm_synthesized_count"], 1.0);
        assert_eq!(m["hint/category_static_fallback_count"], 2.0);
        assert_eq!(m["hint/category_static_fallback_success_rate"], 0.5);
        // Every group with any success, hinted included: a, b, d of 4.
        assert_eq!(m["reward/avg_pass_at_2"], 3.0 / 4.0);
        assert_eq!(m["reward/avg_raw_reward"], 3.5 / 9.0);
        assert_eq!(m["reward/mean_positive_reward"], 3.5 / 9.0);
    }

    #[test]
    fn undefined_metrics_are_absent_not_zero() {
        let r = rows(&[("a", 0.0, None), ("a", -1.0, None)]);
        let m = metrics(&r);
        assert!(
            !m.keys().any(|k| k.starts_with("hint/")),
            "no hinted rows, no hint metrics: {m:?}"
        );
        assert!(!m.contains_key("reward/pass_at_4"), "no group has 4 raw rows");
        assert!(!m.contains_key("reward/pass_at_8"));
        assert_eq!(m["reward/pass_at_1"], 0.0, "defined, and 0");
        assert_eq!(m["reward/mean_positive_reward"], 0.0);
        assert_eq!(m["reward/avg_raw_reward"], -0.5);
        // Rewards whose sum overflows still have a finite mean.
        let m = metrics(&rows(&[("a", 1.7e308, None), ("a", 1.7e308, None)]));
        assert_eq!(m["reward/avg_raw_reward"], 1.7e308);
        assert_eq!(m["reward/mean_positive_reward"], 1.7e308);
        let only_llm = metrics(&rows(&[("a", 0.0, None), ("a", 1.0, Some("llm_synthesized"))]));
        assert!(only_llm.contains_key("hint/category_llm_synthesized_success_rate"));
        assert!(
            !only_llm.contains_key("hint/category_static_fallback_success_rate"),
            "a category without rows is absent"
        );
    }
}
