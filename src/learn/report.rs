//! What the learning state tells about a run: per-arm pulls, rescues,
//! posterior means and spend (Prometheus), refined against fresh rescue
//! rates, cost per rescue, and one step's metrics by their `rl.metrics`
//! names. Every value that is undefined (a rate over no outcome, a cost per
//! no rescue) is `None` or absent, never 0.
//!
//! Attribution: a hint's pull and spend belong to the arm that wrote it; its
//! outcome counts for the arm it counts for (the control, for a static
//! fallback on an LLM arm's turn, see [`super::state`]). So an LLM arm's
//! cost per rescue includes what its failed calls cost.

use std::collections::BTreeMap;

use super::state::{Cell, LearnState};

/// One arm's totals over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmReport {
    pub name: String,
    /// Hints the arm wrote.
    pub pulls: i64,
    /// Of those, the ones flagged `leak` (they repeat a value the verifier
    /// output presents as expected; `hints.on_leak = "keep"`).
    pub leaks: i64,
    /// Outcomes counted for the arm.
    pub trials: i64,
    /// Of those, the ones that rescued their group.
    pub rescues: i64,
    /// `rescues / trials`.
    pub rescue_rate: Option<f64>,
    /// The mean `transfer` of the outcomes counted for the arm that carried
    /// one; `None` when none did.
    pub transfer_rate: Option<f64>,
    /// The `transfer`s of those outcomes (count, sum, sum of squares).
    pub transfer: MeanTally,
    /// The `reliance`s of the outcomes counted for the arm that carried one.
    pub reliance: MeanTally,
    /// Posterior mean of the arm's reward (its rescue rate, or its transfer
    /// under `arm_reward = "transfer"`) from every outcome known now.
    pub posterior_mean: f64,
    /// What the arm's hints cost, in USD.
    pub spend_usd: f64,
    /// `spend_usd / rescues`.
    pub cost_per_rescue_usd: Option<f64>,
}

/// A run's (or one step's) totals over every arm.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The configured arms, in configuration order.
    pub arms: Vec<ArmReport>,
    /// Rescue rate of hints that showed the LLM earlier hints.
    pub refined_rescue_rate: Option<f64>,
    /// Rescue rate of the other hints.
    pub fresh_rescue_rate: Option<f64>,
    /// All spend over all rescues.
    pub cost_per_rescue_usd: Option<f64>,
}

/// A count, sum and sum of squares of values: their mean and spread.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MeanTally {
    pub n: i64,
    pub sum: f64,
    pub sum_sq: f64,
}

impl MeanTally {
    fn from_nano(n: i64, sum_nano: i64, sum_sq_nano: i64) -> Self {
        MeanTally {
            n,
            sum: sum_nano as f64 / 1e9,
            sum_sq: sum_sq_nano as f64 / 1e9,
        }
    }

    /// The mean; `None` without values.
    pub fn mean(&self) -> Option<f64> {
        ratio(self.sum, self.n as f64)
    }

    /// The sample standard deviation; `None` under two values.
    pub fn std(&self) -> Option<f64> {
        if self.n < 2 {
            return None;
        }
        let n = self.n as f64;
        let mean = self.sum / n;
        Some(((self.sum_sq - n * mean * mean).max(0.0) / (n - 1.0)).sqrt())
    }
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}

impl LearnState {
    /// Totals of `run_id` over all its steps.
    pub fn run_report(&self, run_id: &str) -> RunReport {
        self.report(run_id, None)
    }

    /// Totals of `run_id`'s hints of `step`.
    pub fn step_report(&self, run_id: &str, step: i64) -> RunReport {
        self.report(run_id, Some(step))
    }

    /// One step's metrics by their `rl.metrics` names:
    /// `hint/arm/<name>/rescue_rate` and `hint/arm/<name>/count` (outcomes
    /// counted for the arm, the rate's denominator; the rate absent at 0),
    /// `hint/arm/<name>/transfer_rate` (the mean `transfer` of those that
    /// carried one; absent when none did),
    /// `hint/arm/<name>/leak_rate` (of the hints the arm wrote at the step,
    /// the share flagged `leak`; absent when it wrote none),
    /// `hint/refined_rescue_rate`, `hint/fresh_rescue_rate` and
    /// `hint/cost_per_rescue_usd`, each absent when undefined.
    pub fn step_metrics(&self, run_id: &str, step: i64) -> BTreeMap<String, f64> {
        let report = self.step_report(run_id, step);
        let mut out = BTreeMap::new();
        for arm in &report.arms {
            out.insert(format!("hint/arm/{}/count", arm.name), arm.trials as f64);
            if let Some(rate) = arm.rescue_rate {
                out.insert(format!("hint/arm/{}/rescue_rate", arm.name), rate);
            }
            if let Some(rate) = arm.transfer_rate {
                out.insert(format!("hint/arm/{}/transfer_rate", arm.name), rate);
            }
            if let Some(rate) = ratio(arm.leaks as f64, arm.pulls as f64) {
                out.insert(format!("hint/arm/{}/leak_rate", arm.name), rate);
            }
        }
        for (name, value) in [
            ("hint/refined_rescue_rate", report.refined_rescue_rate),
            ("hint/fresh_rescue_rate", report.fresh_rescue_rate),
            ("hint/cost_per_rescue_usd", report.cost_per_rescue_usd),
        ] {
            if let Some(v) = value {
                out.insert(name.to_string(), v);
            }
        }
        out
    }

    fn report(&self, run_id: &str, step: Option<i64>) -> RunReport {
        let tally = self.runs.get(run_id);
        let in_scope = |s: i64| step.is_none_or(|want| want == s);
        let sum_arm = |name: &str| -> Cell {
            let mut total = Cell::default();
            if let Some(tally) = tally {
                let range = (name.to_string(), i64::MIN)..=(name.to_string(), i64::MAX);
                for (&(_, s), cell) in tally.cells.range(range) {
                    if in_scope(s) {
                        add(&mut total, cell);
                    }
                }
            }
            total
        };
        let mut all = Cell::default();
        if let Some(tally) = tally {
            for (&(_, s), cell) in &tally.cells {
                if in_scope(s) {
                    add(&mut all, cell);
                }
            }
        }
        let posteriors = self.current_posteriors(run_id);
        let arms = self
            .arms
            .specs()
            .iter()
            .zip(&posteriors)
            .map(|(spec, posterior)| {
                let c = sum_arm(&spec.name);
                let spend_usd = c.spend_nano_usd as f64 / 1e9;
                ArmReport {
                    name: spec.name.clone(),
                    pulls: c.hints,
                    leaks: c.leaks,
                    trials: c.trials,
                    rescues: c.rescues,
                    rescue_rate: ratio(c.rescues as f64, c.trials as f64),
                    transfer_rate: ratio(c.transfer_nano as f64 / 1e9, c.transfer_trials as f64),
                    transfer: MeanTally::from_nano(c.transfer_trials, c.transfer_nano, c.transfer_sq_nano),
                    reliance: MeanTally::from_nano(c.reliance_trials, c.reliance_nano, c.reliance_sq_nano),
                    posterior_mean: posterior.mean(),
                    spend_usd,
                    cost_per_rescue_usd: ratio(spend_usd, c.rescues as f64),
                }
            })
            .collect();
        RunReport {
            arms,
            refined_rescue_rate: ratio(all.refined_rescues as f64, all.refined_trials as f64),
            fresh_rescue_rate: ratio(
                (all.rescues - all.refined_rescues) as f64,
                (all.trials - all.refined_trials) as f64,
            ),
            cost_per_rescue_usd: ratio(all.spend_nano_usd as f64 / 1e9, all.rescues as f64),
        }
    }
}

fn add(total: &mut Cell, cell: &Cell) {
    total.hints += cell.hints;
    total.leaks += cell.leaks;
    total.spend_nano_usd += cell.spend_nano_usd;
    total.trials += cell.trials;
    total.rescues += cell.rescues;
    total.refined_trials += cell.refined_trials;
    total.refined_rescues += cell.refined_rescues;
    total.transfer_trials += cell.transfer_trials;
    total.transfer_nano += cell.transfer_nano;
    total.transfer_sq_nano += cell.transfer_sq_nano;
    total.transfer_rescues += cell.transfer_rescues;
    total.reliance_trials += cell.reliance_trials;
    total.reliance_nano += cell.reliance_nano;
    total.reliance_sq_nano += cell.reliance_sq_nano;
}
