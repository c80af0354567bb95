//! The per-step metrics published on `rl.metrics`, with the reference
//! trainer's names (`hint/...`), plus pass@k and the extreme-advantage count.

use std::collections::{BTreeMap, HashMap};

use crate::batch::ScoredRows;
use crate::messages::HintCategory;
use crate::normalize::{Advantages, EXTREME_ADVANTAGE};

/// Flat metric name → value.
pub type StepMetrics = BTreeMap<String, f64>;

#[derive(Default)]
struct Tally {
    count: u64,
    successes: u64,
}

impl Tally {
    fn add(&mut self, success: bool) {
        self.count += 1;
        self.successes += u64::from(success);
    }

    fn rate(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.successes as f64 / self.count as f64
        }
    }
}

/// Computes the step's metrics. A rollout succeeded when its reward is above
/// `success_threshold`.
///
/// - `hint/total_hinted_rollouts`: hinted rows;
/// - `hint/hint_success_rate`: successes among hinted rows;
/// - `hint/prompts_hinted`: groups with a hinted row;
/// - `hint/signal_rescued`: hinted groups whose raw rows all failed but a
///   hinted row succeeded (a GRPO signal that would otherwise be zero);
/// - `hint/category_<c>_count` and `_success_rate` for `llm_synthesized` and
///   `static_fallback` (which counts both fallback categories);
/// - `reward/pass_at_<k>`: the unbiased pass@k estimator, 1 − C(n−c,k)/C(n,k),
///   averaged over groups with at least k raw rows (absent when none has);
/// - `advantage/extreme_count`: rows with |advantage| above 1e3.
pub fn step_metrics(
    rows: &ScoredRows,
    advantages: &Advantages,
    success_threshold: f64,
    pass_at_k: &[u32],
) -> StepMetrics {
    let success = |i: usize| rows.reward[i] > success_threshold;
    let mut hinted = Tally::default();
    let mut llm = Tally::default();
    let mut fallback = Tally::default();
    // Per group: (raw tally, hinted tally).
    let mut groups: HashMap<&str, (Tally, Tally)> = HashMap::new();
    for i in 0..rows.len() {
        let entry = groups.entry(rows.instance_id[i].as_str()).or_default();
        if rows.is_hinted[i] {
            hinted.add(success(i));
            entry.1.add(success(i));
            match rows.hint_category[i].as_deref() {
                Some(c) if c == HintCategory::LlmSynthesized.as_str() => llm.add(success(i)),
                Some(c)
                    if c == HintCategory::StaticFallback.as_str()
                        || c == HintCategory::LlmFailedStaticFallback.as_str() =>
                {
                    fallback.add(success(i))
                }
                _ => {}
            }
        } else {
            entry.0.add(success(i));
        }
    }
    let prompts_hinted = groups.values().filter(|(_, h)| h.count > 0).count();
    let rescued = groups
        .values()
        .filter(|(raw, h)| h.successes > 0 && raw.successes == 0)
        .count();

    let mut m = StepMetrics::new();
    m.insert("hint/total_hinted_rollouts".into(), hinted.count as f64);
    m.insert("hint/hint_success_rate".into(), hinted.rate());
    m.insert("hint/prompts_hinted".into(), prompts_hinted as f64);
    m.insert("hint/signal_rescued".into(), rescued as f64);
    m.insert("hint/category_llm_synthesized_count".into(), llm.count as f64);
    m.insert("hint/category_llm_synthesized_success_rate".into(), llm.rate());
    m.insert(
        "hint/category_static_fallback_count".into(),
        fallback.count as f64,
    );
    m.insert(
        "hint/category_static_fallback_success_rate".into(),
        fallback.rate(),
    );
    for &k in pass_at_k {
        let estimates: Vec<f64> = groups
            .values()
            .filter(|(raw, _)| raw.count >= u64::from(k))
            .map(|(raw, _)| pass_at_k_estimate(raw.count, raw.successes, u64::from(k)))
            .collect();
        let mean = if estimates.is_empty() {
            0.0
        } else {
            estimates.iter().sum::<f64>() / estimates.len() as f64
        };
        m.insert(format!("reward/pass_at_{k}"), mean);
    }
    let extreme = advantages
        .advantage
        .iter()
        .filter(|a| a.abs() > EXTREME_ADVANTAGE)
        .count();
    m.insert("advantage/extreme_count".into(), extreme as f64);
    m.insert("advantage/rows".into(), rows.len() as f64);
    m
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

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        // n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6.
        assert!((pass_at_k_estimate(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k_estimate(4, 0, 2), 0.0);
        assert_eq!(pass_at_k_estimate(4, 3, 2), 1.0);
        // k=1 is the success rate.
        assert!((pass_at_k_estimate(8, 3, 1) - 3.0 / 8.0).abs() < 1e-12);
    }
}
