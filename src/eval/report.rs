//! `report.json`: what an evaluation found, per config and per group, and
//! the figures summarising it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::advantages::step_metrics::StepMetrics;
use crate::messages::{Hint, HintCategory};

/// Every category, in the order reports show them.
pub const CATEGORIES: [HintCategory; 3] = [
    HintCategory::LlmSynthesized,
    HintCategory::LlmFailedStaticFallback,
    HintCategory::StaticFallback,
];

/// Latency histogram bins.
const HISTOGRAM_BINS: usize = 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub input: String,
    /// Lines read from the input.
    pub trajectories: u64,
    /// Lines stage 1 would have dead-lettered, by reason.
    pub rejected: BTreeMap<String, u64>,
    pub groups: u64,
    pub configs: Vec<ConfigSummary>,
    /// Per group, each config's hint (in `configs` order).
    pub hints: Vec<GroupHints>,
    /// From recorded scored rollouts, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<Outcomes>,
    /// The arm table, from recorded hints and outcomes, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<super::arms::ArmsReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSummary {
    pub label: String,
    pub config_file: Option<String>,
    /// Where hints came from (provider and model chain; no secrets).
    pub source: String,
    pub models: Vec<String>,
    pub prompt_version: String,
    pub concurrency: usize,
    /// The system context its prompts carried (`llm.system_context_file`
    /// and `_dir`): the bytes of each part and a digest of their text, or
    /// `none`.
    #[serde(default)]
    pub system_context: String,
    /// Groups whose hint text differs from the first config's (`None` for
    /// the first config): whether a context, prompt or model changed the
    /// hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints_changed: Option<u64>,
    /// Groups per category (`llm_synthesized`, ...).
    pub categories: BTreeMap<String, u64>,
    /// Share of groups whose hint is a static fallback.
    pub fallback_rate: f64,
    /// Why the LLM failed, for `llm_failed_static_fallback` hints.
    pub failure_reasons: BTreeMap<String, u64>,
    pub latency_ms: Spread,
    pub latency_histogram: Vec<Bin>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens read from and written to the provider's prompt cache;
    /// absent when no hint's provider reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    pub cost_usd: f64,
    pub hint_chars: Spread,
    /// Wall time of this config's run.
    pub wall_secs: f64,
    /// Calls answered from the cassette, and calls made to the API.
    pub cassette_played: u64,
    pub api_calls: u64,
}

/// Percentiles of a sample (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    pub from: f64,
    pub to: f64,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupHints {
    pub key: String,
    pub instance_id: String,
    pub trajectory_id: String,
    pub members: usize,
    pub best_reward: f64,
    pub verifier_error: Option<String>,
    pub hints: Vec<EvalHint>,
}

/// A hint as stage 1 would publish it, less the wall-clock fields that
/// differ between runs (`created_at`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalHint {
    pub config: String,
    pub hint_id: String,
    pub category: HintCategory,
    pub model: Option<String>,
    pub failure_reason: Option<String>,
    pub latency_ms: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    pub cost_usd: f64,
    pub hint: String,
}

impl EvalHint {
    pub fn from_hint(config: &str, h: &Hint) -> Self {
        EvalHint {
            config: config.to_string(),
            hint_id: h.hint_id.clone(),
            category: h.category,
            model: h.model.clone(),
            failure_reason: h.failure_reason.clone(),
            latency_ms: h.latency_ms,
            input_tokens: h.usage.input_tokens,
            output_tokens: h.usage.output_tokens,
            cache_read_input_tokens: h.usage.cache_read_input_tokens,
            cache_creation_input_tokens: h.usage.cache_creation_input_tokens,
            cost_usd: h.cost_usd,
            hint: h.hint.clone(),
        }
    }
}

/// What the hints did in training, from recorded scored rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcomes {
    pub rows: u64,
    pub rejected: BTreeMap<String, u64>,
    /// Per step, the metrics stage 2 publishes on `rl.metrics`.
    pub steps: Vec<StepOutcome>,
    /// Over all steps: hinted rollouts and successes per category.
    pub by_category: BTreeMap<String, CategoryOutcome>,
    pub signal_rescued: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    pub run_id: String,
    pub step: i64,
    pub rows: usize,
    pub metrics: StepMetrics,
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CategoryOutcome {
    pub hinted_rollouts: u64,
    pub successes: u64,
    pub success_rate: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        Spread {
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: sorted[sorted.len() - 1],
        }
    }
}

/// Equal-width bins from 0 to `top` (at least 1), the last one closed.
pub fn histogram(values: &[f64], top: f64) -> Vec<Bin> {
    let top = top.max(1.0);
    let width = top / HISTOGRAM_BINS as f64;
    let mut bins: Vec<Bin> = (0..HISTOGRAM_BINS)
        .map(|i| Bin {
            from: i as f64 * width,
            to: (i + 1) as f64 * width,
            count: 0,
        })
        .collect();
    for v in values {
        let i = ((v / width) as usize).min(HISTOGRAM_BINS - 1);
        bins[i].count += 1;
    }
    bins
}

/// The figures of one config's hints.
#[derive(Debug, Clone, PartialEq)]
pub struct HintStats {
    pub categories: BTreeMap<String, u64>,
    pub fallback_rate: f64,
    pub failure_reasons: BTreeMap<String, u64>,
    pub latency_ms: Spread,
    pub hint_chars: Spread,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `None` when no hint reported the field.
    pub cache_read_input_tokens: Option<u64>,
    pub cache_creation_input_tokens: Option<u64>,
    pub cost_usd: f64,
}

/// How many of `hints` differ in text from `first`, the same groups under
/// the first config.
pub fn hints_changed(first: &[EvalHint], hints: &[EvalHint]) -> u64 {
    first.iter().zip(hints).filter(|(a, b)| a.hint != b.hint).count() as u64
}

/// The sum of the values reported; `None` when none was (undefined, not 0).
fn sum_reported(values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.flatten().fold(None, |sum, v| Some(sum.unwrap_or(0) + v))
}

/// Category mix, fallback rate, failure reasons, latencies, tokens, cost and
/// lengths of one config's hints.
pub fn summarize(hints: &[&EvalHint]) -> HintStats {
    let mut categories: BTreeMap<String, u64> =
        CATEGORIES.iter().map(|c| (c.as_str().to_string(), 0)).collect();
    let mut reasons = BTreeMap::new();
    for h in hints {
        *categories.entry(h.category.as_str().to_string()).or_default() += 1;
        if let Some(r) = &h.failure_reason {
            *reasons.entry(r.clone()).or_default() += 1;
        }
    }
    let fallbacks = hints
        .iter()
        .filter(|h| h.category != HintCategory::LlmSynthesized)
        .count();
    let fallback_rate = if hints.is_empty() {
        0.0
    } else {
        fallbacks as f64 / hints.len() as f64
    };
    let latencies: Vec<f64> = hints.iter().map(|h| h.latency_ms as f64).collect();
    let lengths: Vec<f64> = hints.iter().map(|h| h.hint.chars().count() as f64).collect();
    HintStats {
        categories,
        fallback_rate,
        failure_reasons: reasons,
        latency_ms: Spread::of(&latencies),
        hint_chars: Spread::of(&lengths),
        input_tokens: hints.iter().map(|h| h.input_tokens).sum(),
        output_tokens: hints.iter().map(|h| h.output_tokens).sum(),
        cache_read_input_tokens: sum_reported(hints.iter().map(|h| h.cache_read_input_tokens)),
        cache_creation_input_tokens: sum_reported(hints.iter().map(|h| h.cache_creation_input_tokens)),
        cost_usd: hints.iter().map(|h| h.cost_usd).sum(),
    }
}

/// Sums the per-step category metrics (`hint/category_<c>_count` and
/// `_success_rate`) into totals.
pub fn outcomes_by_category(steps: &[StepOutcome]) -> BTreeMap<String, CategoryOutcome> {
    let mut out: BTreeMap<String, CategoryOutcome> = BTreeMap::new();
    for step in steps {
        for (name, count) in &step.metrics {
            let Some(category) = name
                .strip_prefix("hint/category_")
                .and_then(|n| n.strip_suffix("_count"))
            else {
                continue;
            };
            let rate = step
                .metrics
                .get(&format!("hint/category_{category}_success_rate"))
                .copied()
                .unwrap_or(0.0);
            let entry = out.entry(category.to_string()).or_default();
            entry.hinted_rollouts += *count as u64;
            entry.successes += (rate * count).round() as u64;
        }
    }
    for c in out.values_mut() {
        if c.hinted_rollouts > 0 {
            c.success_rate = c.successes as f64 / c.hinted_rollouts as f64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Spread::of(&values);
        assert_eq!((s.p50, s.p95, s.p99, s.max), (50.0, 95.0, 99.0, 100.0));
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert_eq!(Spread::of(&[7.0]).p99, 7.0);
        assert_eq!(Spread::of(&[]), Spread::default());
    }

    #[test]
    fn histogram_counts_everything_once() {
        let bins = histogram(&[0.0, 5.0, 99.9, 100.0, 250.0], 100.0);
        assert_eq!(bins.len(), HISTOGRAM_BINS);
        assert_eq!(bins.iter().map(|b| b.count).sum::<u64>(), 5);
        assert_eq!(bins[0].count, 1);
        assert_eq!(bins[1].count, 1);
        assert_eq!(
            bins[HISTOGRAM_BINS - 1].count,
            3,
            "values at or past the top land in the last bin"
        );
    }

    #[test]
    fn category_totals_weight_rates_by_counts() {
        let step = |count: f64, rate: f64| StepOutcome {
            run_id: "r".into(),
            step: 1,
            rows: 0,
            metrics: [
                ("hint/category_llm_synthesized_count".to_string(), count),
                ("hint/category_llm_synthesized_success_rate".to_string(), rate),
                ("hint/hint_success_rate".to_string(), 0.9),
            ]
            .into_iter()
            .collect(),
        };
        let totals = outcomes_by_category(&[step(4.0, 0.5), step(6.0, 1.0)]);
        let llm = totals["llm_synthesized"];
        assert_eq!((llm.hinted_rollouts, llm.successes), (10, 8));
        assert!((llm.success_rate - 0.8).abs() < 1e-12);
        assert_eq!(totals.len(), 1);
    }
}
