//! Stage 1's Prometheus metrics (`hintstream_hints_*`), beside the consume
//! loop's: hints by category, LLM attempts, retries and latency, tokens and
//! cost, the spend budget left, hedged requests, open groups, the hint
//! cache, prompts fitted to context windows, and leaks by arm.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::leak::LeakAction;
use crate::llm::budget::Remaining;
use crate::llm::synth::SynthObserver;
use crate::llm::Synthesis;
use crate::messages::{HintCategory, HintLevel};
use crate::metrics::{FloatCounter, FloatGauge, Labels};

pub struct HintMetrics {
    hints: Family<Labels, Counter>,
    llm_requests: Family<Labels, Counter>,
    llm_retries: Family<Labels, Counter>,
    llm_latency: Histogram,
    hint_latency: Family<Labels, Histogram>,
    tokens: Family<Labels, Counter>,
    cost: FloatCounter,
    cache_saved: FloatGauge,
    llm_in_flight: Gauge,
    groups_open: Gauge,
    cache_hits: Counter,
    skipped: Family<Labels, Counter>,
    budget_usd_left: FloatGauge,
    budget_tokens_left: Gauge,
    budgets: (bool, bool),
    hedges_sent: Family<Labels, Counter>,
    hedges_won: Family<Labels, Counter>,
    hedges_skipped: Family<Labels, Counter>,
    hedge_extra_usd: Family<Labels, FloatCounter>,
    prompts_fitted: Family<Labels, Counter>,
    prompt_chars_dropped: Family<Labels, Counter>,
    llm_queue: Histogram,
    saturated: Family<Labels, Counter>,
    leaks: Family<Labels, Counter>,
    graded: Family<Labels, Counter>,
    /// The series every hint counts into, looked up once each (see
    /// [`series`]).
    per_hint: PerHint,
}

/// Handles on the series of `hints`, `hint_latency` and `tokens` that
/// every hint counts into, by category (in [`category_index`] order) and
/// token direction (in [`DIRECTIONS`] order): made on first use, as the
/// family would make them, so a series still appears only once counted.
#[derive(Default)]
struct PerHint {
    hints: [OnceLock<Counter>; 3],
    latency: [OnceLock<Histogram>; 3],
    tokens: [OnceLock<Counter>; 4],
}

/// The `direction` label values of `tokens`.
const DIRECTIONS: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

fn category_index(category: HintCategory) -> usize {
    match category {
        HintCategory::LlmSynthesized => 0,
        HintCategory::StaticFallback => 1,
        HintCategory::LlmFailedStaticFallback => 2,
    }
}

/// `family`'s series of `label` = `value`, through `cell`: the family's
/// lookup (a label vector, a hash, a lock) once, then a shared handle.
/// Stage 1 counts several series a hint; at a static hint's few
/// microseconds the lookups were a visible share of its CPU.
fn series<'a, M: Clone>(
    cell: &'a OnceLock<M>,
    family: &Family<Labels, M, impl Fn() -> M>,
    label: &'static str,
    value: &str,
) -> &'a M {
    cell.get_or_init(|| family.get_or_create(&vec![(label, value.to_string())]).clone())
}

impl HintMetrics {
    /// Registers the metrics. The budget gauges exist only for the budgets
    /// that are set (`usd`, `tokens`): an unset budget has nothing left to
    /// report, not 0.
    pub fn register(registry: &mut Registry, budgets: (bool, bool)) -> Self {
        let m = HintMetrics {
            hints: Family::default(),
            llm_requests: Family::default(),
            llm_retries: Family::default(),
            llm_latency: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            hint_latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.05, 2.0, 12))),
            tokens: Family::default(),
            cost: FloatCounter::default(),
            cache_saved: FloatGauge::default(),
            llm_in_flight: Gauge::default(),
            groups_open: Gauge::default(),
            cache_hits: Counter::default(),
            skipped: Family::default(),
            budget_usd_left: FloatGauge::default(),
            budget_tokens_left: Gauge::default(),
            budgets,
            hedges_sent: Family::default(),
            hedges_won: Family::default(),
            hedges_skipped: Family::default(),
            hedge_extra_usd: Family::default(),
            prompts_fitted: Family::default(),
            prompt_chars_dropped: Family::default(),
            llm_queue: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            saturated: Family::default(),
            leaks: Family::default(),
            graded: Family::default(),
            per_hint: PerHint::default(),
        };
        registry.register("hints_published", "Hints published, by category", m.hints.clone());
        registry.register(
            "llm_requests",
            "LLM HTTP attempts, by model and status",
            m.llm_requests.clone(),
        );
        registry.register(
            "llm_retries",
            "LLM retries, by model and reason",
            m.llm_retries.clone(),
        );
        registry.register(
            "llm_request_seconds",
            "Latency of one LLM HTTP attempt",
            m.llm_latency.clone(),
        );
        registry.register(
            "hint_seconds",
            "Time to synthesize a hint, by category",
            m.hint_latency.clone(),
        );
        registry.register(
            "llm_tokens",
            "Tokens used, by direction: input (uncached), cache_read, cache_write, output",
            m.tokens.clone(),
        );
        registry.register("llm_cost_usd", "Dollars spent on LLM calls", m.cost.clone());
        registry.register(
            "llm_cache_saved_usd",
            "Net dollars the prompt cache saved since start: the hints' cost with every prompt token at the input \
             price, less what they cost (negative while cache writes outweigh reads)",
            m.cache_saved.clone(),
        );
        registry.register("llm_in_flight", "LLM calls in flight", m.llm_in_flight.clone());
        registry.register(
            "groups_open",
            "Groups waiting for trajectories or a hint",
            m.groups_open.clone(),
        );
        registry.register(
            "hint_cache_hits",
            "Hints republished from the cache for a redelivered or late group member, without an LLM call",
            m.cache_hits.clone(),
        );
        registry.register(
            "hints_skipped",
            "Groups that got no hint, by reason (above_reward_threshold: the best reward was above hints.reward_threshold)",
            m.skipped.clone(),
        );
        m.register_hedges(registry);
        m.register_leaks(registry);
        m.register_graded(registry);
        m.register_fitting(registry);
        if budgets.0 {
            registry.register(
                "llm_budget_remaining_usd",
                "Dollars left of llm.budget_usd_per_hour in the rolling hour",
                m.budget_usd_left.clone(),
            );
        }
        if budgets.1 {
            registry.register(
                "llm_budget_remaining_tokens",
                "Tokens left of llm.budget_tokens_per_hour in the rolling hour",
                m.budget_tokens_left.clone(),
            );
        }
        m
    }

    /// The queue, saturation and context-window fitting metrics.
    fn register_fitting(&self, registry: &mut Registry) {
        registry.register(
            "llm_queue_seconds",
            "Time an LLM attempt waited for a call slot (llm.concurrency) and the rate limits before it was sent",
            self.llm_queue.clone(),
        );
        registry.register(
            "llm_saturated",
            "Times a model's server looked saturated (most attempts of a minute timed out while others waited at it), by model; said at most every 10 minutes",
            self.saturated.clone(),
        );
        registry.register(
            "llm_prompts_fitted",
            "Prompts cut to fit a model's context window, by model (a refit after a context-length error counts again)",
            self.prompts_fitted.clone(),
        );
        registry.register(
            "llm_prompt_chars_dropped",
            "Characters taken out of prompts to fit a model's context window, by model",
            self.prompt_chars_dropped.clone(),
        );
    }

    /// Graded hints by arm and level (`[[hints.arms]] levels`).
    fn register_graded(&self, registry: &mut Registry) {
        registry.register(
            "graded_hints",
            "Graded hints written (not republished from the cache), by arm and level ([[hints.arms]] levels)",
            self.graded.clone(),
        );
    }

    /// The leak guard's metric (`hints.on_leak`).
    fn register_leaks(&self, registry: &mut Registry) {
        registry.register(
            "hint_leaks",
            "Hints that repeated a value the verifier output presents as expected (hints.on_leak), by arm and \
             action (kept: published flagged leak; regenerated: a second request wrote one without it; \
             static_fallback: the second repeated one too or failed, the static hint with the values withheld \
             was published; withheld: a static hint, published with the values withheld)",
            self.leaks.clone(),
        );
    }

    /// The hedged requests' metrics (`llm.hedge`).
    fn register_hedges(&self, registry: &mut Registry) {
        registry.register(
            "llm_hedges_sent",
            "Duplicates of slow LLM attempts sent (llm.hedge), by the model they went to",
            self.hedges_sent.clone(),
        );
        registry.register(
            "llm_hedges_won",
            "Duplicates whose answer came first and wrote the hint, by model",
            self.hedges_won.clone(),
        );
        registry.register(
            "llm_hedges_skipped",
            "Duplicates due but not sent, by model and reason (share: llm.hedge_max_share was used up; limits: no call slot, rate-limit permit or budget at once)",
            self.hedges_skipped.clone(),
        );
        registry.register(
            "llm_hedge_extra_cost_usd",
            "Estimated dollars of LLM attempts cancelled for the other's answer (the answer's usage at the cancelled model's price), by model",
            self.hedge_extra_usd.clone(),
        );
    }

    /// A hint was synthesized (not answered from the cache).
    pub fn synthesized(&self, s: &Synthesis) {
        let category = category_index(s.category);
        series(
            &self.per_hint.latency[category],
            &self.hint_latency,
            "category",
            s.category.as_str(),
        )
        .observe(s.latency_ms as f64 / 1e3);
        let usage = &s.usage;
        let counts = [
            Some(usage.input_tokens),
            Some(usage.output_tokens),
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
        ];
        for (i, tokens) in counts.into_iter().enumerate() {
            if let Some(tokens) = tokens {
                series(&self.per_hint.tokens[i], &self.tokens, "direction", DIRECTIONS[i]).inc_by(tokens);
            }
        }
        self.cost.inc_by(s.cost_usd);
        self.cache_saved.inc_by(s.cache_saved_usd);
    }

    /// A hint was published (synthesized or from the cache).
    pub fn published(&self, category: HintCategory) {
        series(
            &self.per_hint.hints[category_index(category)],
            &self.hints,
            "category",
            category.as_str(),
        )
        .inc();
    }

    /// The leak guard found a hint of `arm` repeating an expected value.
    pub fn leak(&self, arm: &str, action: LeakAction) {
        self.leaks
            .get_or_create(&vec![
                ("arm", arm.to_string()),
                ("action", action.as_str().to_string()),
            ])
            .inc();
    }

    /// A graded hint was written by `arm` at `level`.
    pub fn graded(&self, arm: &str, level: HintLevel) {
        let labels: Labels = vec![("arm", arm.to_string()), ("level", level.as_str().to_string())];
        self.graded.get_or_create(&labels).inc();
    }

    pub fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    /// A group got no hint, for `reason`.
    pub fn skipped(&self, reason: &str) {
        self.skipped
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn set_groups_open(&self, n: usize) {
        self.groups_open.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

impl SynthObserver for HintMetrics {
    fn attempt(&self, model: &str, status: &str, latency: Duration) {
        self.llm_requests
            .get_or_create(&vec![("model", model.into()), ("status", status.into())])
            .inc();
        self.llm_latency.observe(latency.as_secs_f64());
    }

    fn retry(&self, model: &str, reason: &str) {
        self.llm_retries
            .get_or_create(&vec![("model", model.into()), ("reason", reason.into())])
            .inc();
    }

    fn calls_in_flight(&self, n: usize) {
        self.llm_in_flight.set(n as i64);
    }

    fn hedge_sent(&self, model: &str) {
        self.hedges_sent
            .get_or_create(&vec![("model", model.into())])
            .inc();
    }

    fn hedge_won(&self, model: &str) {
        self.hedges_won
            .get_or_create(&vec![("model", model.into())])
            .inc();
    }

    fn hedge_skipped(&self, model: &str, reason: &str) {
        self.hedges_skipped
            .get_or_create(&vec![("model", model.into()), ("reason", reason.into())])
            .inc();
    }

    fn hedge_extra_usd(&self, model: &str, usd: f64) {
        self.hedge_extra_usd
            .get_or_create(&vec![("model", model.into())])
            .inc_by(usd);
    }

    fn queued(&self, _model: &str, wait: Duration) {
        self.llm_queue.observe(wait.as_secs_f64());
    }

    fn saturated(&self, model: &str) {
        self.saturated
            .get_or_create(&vec![("model", model.to_string())])
            .inc();
    }

    fn prompt_fitted(&self, model: &str, chars_dropped: usize) {
        let labels = vec![("model", model.to_string())];
        self.prompts_fitted.get_or_create(&labels).inc();
        self.prompt_chars_dropped
            .get_or_create(&labels)
            .inc_by(chars_dropped as u64);
    }

    fn budget(&self, remaining: Remaining) {
        if let (true, Some(usd)) = (self.budgets.0, remaining.usd) {
            self.budget_usd_left.set(usd);
        }
        if let (true, Some(tokens)) = (self.budgets.1, remaining.tokens) {
            self.budget_tokens_left
                .set(i64::try_from(tokens).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Usage;

    fn synthesis(category: HintCategory, usage: Usage) -> Synthesis {
        Synthesis {
            hint: "h".into(),
            category,
            model: None,
            usage,
            cost_usd: 0.0,
            failure_reason: None,
            latency_ms: 250,
            hint_truncated: false,
            cache_saved_usd: 0.0,
            hedged: false,
        }
    }

    /// The lines of `text` that start with `prefix`.
    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn each_hint_counts_into_its_own_series_made_on_first_use() {
        let mut registry = Registry::default();
        let m = HintMetrics::register(&mut registry, (false, false));
        let before = crate::metrics::render(&registry);
        assert!(lines(&before, "hints_published_total{").is_empty(), "{before}");
        assert!(lines(&before, "llm_tokens_total{").is_empty(), "{before}");

        let static_hint = synthesis(HintCategory::StaticFallback, Usage::default());
        m.synthesized(&static_hint);
        m.published(HintCategory::StaticFallback);
        m.synthesized(&static_hint);
        m.published(HintCategory::StaticFallback);
        let model = Usage {
            input_tokens: 100,
            output_tokens: 7,
            cache_read_input_tokens: Some(40),
            cache_creation_input_tokens: None,
        };
        m.synthesized(&synthesis(HintCategory::LlmSynthesized, model));
        m.published(HintCategory::LlmSynthesized);
        let failed = synthesis(HintCategory::LlmFailedStaticFallback, Usage::default());
        for _ in 0..3 {
            m.synthesized(&failed);
            m.published(HintCategory::LlmFailedStaticFallback);
        }

        let text = crate::metrics::render(&registry);
        assert_eq!(lines(&text, "hints_published_total{").len(), 3, "{text}");
        for line in [
            "hints_published_total{category=\"static_fallback\"} 2",
            "hints_published_total{category=\"llm_synthesized\"} 1",
            "hints_published_total{category=\"llm_failed_static_fallback\"} 3",
            "hint_seconds_count{category=\"static_fallback\"} 2",
            "hint_seconds_count{category=\"llm_failed_static_fallback\"} 3",
            "hint_seconds_count{category=\"llm_synthesized\"} 1",
            "llm_tokens_total{direction=\"input\"} 100",
            "llm_tokens_total{direction=\"output\"} 7",
            "llm_tokens_total{direction=\"cache_read\"} 40",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        // Never reported: no series, not a 0.
        assert!(!text.contains("direction=\"cache_write\""), "{text}");
    }
}
