//! The arm table: per arm of each run, pulls, rescue rate with a 95% Wilson
//! interval, posterior mean, spend and cost per rescue, from recorded
//! `rl.hints` and `rl.hints.outcomes`, counted by stage 1's own rules.
//!
//! The counting is [`LearnState`]'s, fed every hint and outcome of the files
//! in file order: each `hint_id` counts once and its latest outcome wins; a
//! static fallback written on an LLM arm's turn counts for the control. The
//! arms come from the first `--config`'s `[[hints.arms]]`; without any, from
//! the records themselves (in order of first appearance; an arm whose every
//! hint is a model-less `static_fallback` is the control, the first such
//! one). Limits are [`LearnState`]'s defaults: at most
//! [`crate::learn::limits::MAX_RUNS_TALLIED`] runs (the most recently
//! written are kept) and [`crate::learn::arms::MAX_ARMS`] arms.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::input::{each_record, InputError};
use crate::config::Config;
use crate::config::PROMPT_VERSION;
use crate::learn::{ArmConfigError, ArmReward, ArmSpec, Arms, LearnOptions, LearnState, MeanTally};
use crate::messages::{decode, DecodeLimits, Hint, HintCategory, HintOutcome};

/// The normal quantile of a two-sided 95% interval.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// A confidence interval of a rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

impl Interval {
    /// Whether the two intervals share a point.
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.low <= other.high && other.low <= self.high
    }
}

/// The Wilson score interval of `successes` in `trials` at quantile `z`
/// (use [`Z_95`]); `None` without trials. Unlike the normal approximation
/// it stays inside [0, 1] and is honest at 0 or all successes and for few
/// trials.
pub fn wilson(successes: i64, trials: i64, z: f64) -> Option<Interval> {
    if trials <= 0 {
        return None;
    }
    wilson_of_mean(successes.clamp(0, trials) as f64 / trials as f64, trials, z)
}

/// The Wilson interval of the mean `p` of `n` values in [0, 1] (fractional
/// successes, such as `transfer`s): a value in [0, 1] has at most the
/// variance of a 0/1 value of the same mean, so this interval is
/// conservative for it. `None` without values.
pub fn wilson_of_mean(p: f64, n: i64, z: f64) -> Option<Interval> {
    if n <= 0 || !p.is_finite() {
        return None;
    }
    let p = p.clamp(0.0, 1.0);
    let n = n as f64;
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = z / denominator * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Some(Interval {
        low: (centre - half).max(0.0),
        high: (centre + half).min(1.0),
    })
}

/// The normal interval of a mean, `mean ± z · std / √n`; `None` under two
/// values (no spread to measure).
pub fn normal_interval(tally: &MeanTally, z: f64) -> Option<Interval> {
    let (mean, std) = (tally.mean()?, tally.std()?);
    let half = z * std / (tally.n as f64).sqrt();
    Some(Interval {
        low: mean - half,
        high: mean + half,
    })
}

/// One arm's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmRow {
    pub arm: String,
    /// The static control.
    pub control: bool,
    /// Hints the arm wrote.
    pub pulls: i64,
    /// Outcomes counted for the arm (the rate's denominator).
    pub trials: i64,
    pub rescues: i64,
    /// `rescues / trials`; absent without trials.
    pub rescue_rate: Option<f64>,
    /// Its 95% Wilson interval; absent without trials.
    pub interval: Option<Interval>,
    /// Outcomes counted for the arm that carried `transfer`.
    #[serde(default)]
    pub transfer_outcomes: i64,
    /// Their mean `transfer`; absent when none carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<f64>,
    /// Its 95% Wilson interval (of a mean of values in [0, 1]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_interval: Option<Interval>,
    /// The mean `reliance` (nats per token) of the outcomes counted for the
    /// arm that carried one; absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliance: Option<f64>,
    /// Its 95% normal interval; absent under two such outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliance_interval: Option<Interval>,
    /// Mean of the arm's Beta posterior over every outcome (prior included;
    /// of its rescue rate, or of its transfer under `arm_reward = "transfer"`).
    pub posterior_mean: f64,
    pub spend_usd: f64,
    /// `spend_usd / rescues`; absent without rescues.
    pub cost_per_rescue_usd: Option<f64>,
}

/// The table of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunArms {
    pub run_id: String,
    pub arms: Vec<ArmRow>,
    /// The arm with the highest rescue rate (transfer, under
    /// `arm_reward = "transfer"`), when any arm has outcomes.
    pub leader: Option<String>,
    /// Arms whose interval overlaps the leader's: their difference from it
    /// is not significant yet.
    pub not_separated: Vec<String>,
    pub refined_rescue_rate: Option<f64>,
    pub fresh_rescue_rate: Option<f64>,
    pub cost_per_rescue_usd: Option<f64>,
}

/// The arm tables of recorded hints and outcomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmsReport {
    pub hints_file: String,
    pub outcomes_file: Option<String>,
    /// Records read, and those that did not decode (by reason).
    pub hints_read: u64,
    pub outcomes_read: u64,
    pub rejected: BTreeMap<String, u64>,
    /// Where the arms came from: `config` or `records`.
    pub arms_from: String,
    /// One table per run, in order of first appearance.
    pub runs: Vec<RunArms>,
}

/// Why the arm table could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArmsError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("the arms of the records or config are not a valid set: {0}")]
    Arms(#[from] ArmConfigError),
}

/// The arm tables of `hints` and `outcomes`, with the arms of `config`
/// (none configured: the arms of the records).
pub fn arm_tables(
    hints: &[Hint],
    outcomes: &[HintOutcome],
    config: Option<&Config>,
) -> Result<(Vec<RunArms>, &'static str), ArmConfigError> {
    let configured: Vec<ArmSpec> = config
        .map(|c| {
            c.hints
                .arms
                .iter()
                .map(|e| ArmSpec::from_entry(e, PROMPT_VERSION))
                .collect()
        })
        .unwrap_or_default();
    let (specs, options, from) = if configured.is_empty() {
        (arms_of_records(hints), LearnOptions::default(), "records")
    } else {
        let options = config.map(|c| c.hints.learn_options()).unwrap_or_default();
        (configured, options, "config")
    };
    if specs.is_empty() {
        return Ok((Vec::new(), from));
    }
    let reward = options.arm_reward;
    let arms = Arms::new(specs, options)?;
    let mut state = LearnState::new(arms);
    let mut runs: Vec<String> = Vec::new();
    for h in hints {
        if !runs.contains(&h.run_id) {
            runs.push(h.run_id.clone());
        }
        state.observe_hint(h);
    }
    for o in outcomes {
        state.observe_outcome(o);
    }
    let control = state.arms().control().map(|c| c.name.clone());
    let tables = runs
        .iter()
        .map(|run_id| {
            let report = state.run_report(run_id);
            let arms: Vec<ArmRow> = report
                .arms
                .iter()
                .map(|a| ArmRow {
                    arm: a.name.clone(),
                    control: control.as_deref() == Some(a.name.as_str()),
                    pulls: a.pulls,
                    trials: a.trials,
                    rescues: a.rescues,
                    rescue_rate: a.rescue_rate,
                    interval: wilson(a.rescues, a.trials, Z_95),
                    transfer_outcomes: a.transfer.n,
                    transfer: a.transfer.mean(),
                    transfer_interval: a
                        .transfer
                        .mean()
                        .and_then(|m| wilson_of_mean(m, a.transfer.n, Z_95)),
                    reliance: a.reliance.mean(),
                    reliance_interval: normal_interval(&a.reliance, Z_95),
                    posterior_mean: a.posterior_mean,
                    spend_usd: a.spend_usd,
                    cost_per_rescue_usd: a.cost_per_rescue_usd,
                })
                .collect();
            let (leader, not_separated) = separation(&arms, reward);
            RunArms {
                run_id: run_id.clone(),
                arms,
                leader,
                not_separated,
                refined_rescue_rate: report.refined_rescue_rate,
                fresh_rescue_rate: report.fresh_rescue_rate,
                cost_per_rescue_usd: report.cost_per_rescue_usd,
            }
        })
        .collect();
    Ok((tables, from))
}

/// The arm with the best rate of what the arms are rewarded by (rescue
/// rate, or transfer) and the arms whose interval overlaps its interval.
fn separation(arms: &[ArmRow], reward: ArmReward) -> (Option<String>, Vec<String>) {
    let rate = |a: &ArmRow| match reward {
        ArmReward::Rescue => (a.rescue_rate, a.interval),
        ArmReward::Transfer => (a.transfer, a.transfer_interval),
    };
    let best = arms
        .iter()
        .filter(|a| rate(a).0.is_some())
        .max_by(|a, b| rate(a).0.unwrap_or(0.0).total_cmp(&rate(b).0.unwrap_or(0.0)));
    let Some(best) = best else {
        return (None, Vec::new());
    };
    let overlapping = arms
        .iter()
        .filter(|a| a.arm != best.arm)
        .filter(|a| match (rate(a).1, rate(best).1) {
            (Some(x), Some(y)) => x.overlaps(&y),
            _ => false,
        })
        .map(|a| a.arm.clone())
        .collect();
    (Some(best.arm.clone()), overlapping)
}

/// The arms the hint records name, in order of first appearance.
fn arms_of_records(hints: &[Hint]) -> Vec<ArmSpec> {
    let mut order: Vec<String> = Vec::new();
    let mut models: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut all_static: BTreeMap<String, bool> = BTreeMap::new();
    for h in hints {
        if !order.contains(&h.arm) {
            order.push(h.arm.clone());
        }
        let is_static = h.category == HintCategory::StaticFallback && h.model.is_none();
        let entry = all_static.entry(h.arm.clone()).or_insert(true);
        *entry &= is_static;
        if let Some(m) = &h.model {
            let list = models.entry(h.arm.clone()).or_default();
            if !list.contains(m) {
                list.push(m.clone());
            }
        }
    }
    let mut control_taken = false;
    order
        .iter()
        .map(|name| {
            if all_static.get(name).copied().unwrap_or(false) && !control_taken {
                control_taken = true;
                ArmSpec::control(name)
            } else {
                let mut models = models.get(name).cloned().unwrap_or_default();
                if models.is_empty() {
                    models.push("recorded".to_string());
                }
                ArmSpec {
                    models,
                    ..ArmSpec::llm(name, &[])
                }
            }
        })
        .collect()
}

/// Reads recorded hints (and outcomes) and makes their arm tables.
pub fn read_arms(
    hints_path: &Path,
    outcomes_path: Option<&Path>,
    config: Option<&Config>,
    limits: DecodeLimits,
) -> Result<ArmsReport, ArmsError> {
    let mut rejected = BTreeMap::new();
    let hints: Vec<Hint> = read_all(hints_path, limits, &mut rejected)?;
    let outcomes: Vec<HintOutcome> = match outcomes_path {
        Some(p) => read_all(p, limits, &mut rejected)?,
        None => Vec::new(),
    };
    let (runs, from) = arm_tables(&hints, &outcomes, config)?;
    Ok(ArmsReport {
        hints_file: hints_path.display().to_string(),
        outcomes_file: outcomes_path.map(|p| p.display().to_string()),
        hints_read: hints.len() as u64,
        outcomes_read: outcomes.len() as u64,
        rejected,
        arms_from: from.to_string(),
        runs,
    })
}

fn read_all<T>(
    path: &Path,
    limits: DecodeLimits,
    rejected: &mut BTreeMap<String, u64>,
) -> Result<Vec<T>, InputError>
where
    T: serde::de::DeserializeOwned + crate::messages::Validate,
{
    let mut out = Vec::new();
    each_record(path, |value, _| {
        let decoded = match value {
            None => Err("empty".to_string()),
            Some(bytes) => decode::<T>(&bytes, limits).map_err(|e| e.kind().to_string()),
        };
        match decoded {
            Ok(v) => out.push(v),
            Err(kind) => *rejected.entry(kind).or_default() += 1,
        }
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{HintSource, Usage};

    fn hint(id: &str, step: i64, task: &str, arm: &str, category: HintCategory, cost: f64) -> Hint {
        Hint {
            schema_version: 1,
            hint_id: id.into(),
            run_id: "r".into(),
            step,
            instance_id: task.into(),
            trajectory_id: format!("{task}-t"),
            hint: "h".into(),
            category,
            model: (category != HintCategory::StaticFallback).then(|| format!("{arm}-model")),
            prompt_version: "v2".into(),
            latency_ms: 1,
            usage: Usage::default(),
            cost_usd: cost,
            failure_reason: None,
            source: HintSource {
                topic: "t".into(),
                partition: 0,
                offset: 0,
            },
            created_at: "2026-12-01T10:00:00Z".into(),
            arm: arm.into(),
            refines: vec![],
            hint_truncated: false,
            hedged: false,
            leak: false,
            level: None,
        }
    }

    fn outcome(h: &Hint, successes: i64) -> HintOutcome {
        HintOutcome {
            schema_version: 1,
            hint_id: h.hint_id.clone(),
            run_id: h.run_id.clone(),
            step: h.step,
            instance_id: h.instance_id.clone(),
            hinted_rollouts: 2,
            successes,
            rescued: successes > 0,
            mean_reward: successes as f64 / 2.0,
            transfer: None,
            reliance: None,
            created_at: "2026-12-01T10:00:01Z".into(),
        }
    }

    #[test]
    fn wilson_matches_known_values_and_stays_in_the_unit_interval() {
        // 7 of 10: the textbook interval 0.3968 .. 0.8922.
        let i = wilson(7, 10, Z_95).unwrap();
        assert!(
            (i.low - 0.3968).abs() < 1e-4 && (i.high - 0.8922).abs() < 1e-4,
            "{i:?}"
        );
        let zero = wilson(0, 20, Z_95).unwrap();
        assert_eq!(zero.low, 0.0);
        assert!((zero.high - 0.1611).abs() < 1e-4, "{zero:?}");
        let all = wilson(20, 20, Z_95).unwrap();
        assert!(all.high <= 1.0 && (all.low - 0.8389).abs() < 1e-4, "{all:?}");
        assert_eq!(wilson(0, 0, Z_95), None);
        assert!(!wilson(70, 100, Z_95)
            .unwrap()
            .overlaps(&wilson(10, 100, Z_95).unwrap()));
        assert!(wilson(3, 5, Z_95).unwrap().overlaps(&wilson(1, 5, Z_95).unwrap()));
    }

    #[test]
    fn the_table_counts_by_stage_one_rules_with_arms_from_the_records() {
        let mut hints = Vec::new();
        let mut outcomes = Vec::new();
        for i in 0..10 {
            let h = hint(
                &format!("s{i}"),
                1,
                &format!("t{i}"),
                "strong",
                HintCategory::LlmSynthesized,
                0.01,
            );
            outcomes.push(outcome(&h, i64::from(i < 7)));
            hints.push(h);
        }
        // A fallback on the weak arm's turn counts for the control.
        let fb = hint(
            "w0",
            1,
            "u0",
            "weak",
            HintCategory::LlmFailedStaticFallback,
            0.002,
        );
        outcomes.push(outcome(&fb, 1));
        hints.push(fb);
        let w1 = hint("w1", 1, "u1", "weak", HintCategory::LlmSynthesized, 0.002);
        // Two outcomes of one hint: the latest wins.
        outcomes.push(outcome(&w1, 1));
        outcomes.push(outcome(&w1, 0));
        hints.push(w1);
        let c = hint("c0", 1, "v0", "control", HintCategory::StaticFallback, 0.0);
        outcomes.push(outcome(&c, 0));
        hints.push(c.clone());
        // A duplicate hint record counts once.
        hints.push(c);

        let (runs, from) = arm_tables(&hints, &outcomes, None).unwrap();
        assert_eq!(from, "records");
        let run = &runs[0];
        let row = |name: &str| run.arms.iter().find(|a| a.arm == name).unwrap().clone();
        let strong = row("strong");
        assert_eq!((strong.pulls, strong.trials, strong.rescues), (10, 10, 7));
        assert!((strong.cost_per_rescue_usd.unwrap() - 0.1 / 7.0).abs() < 1e-9);
        assert!((strong.interval.unwrap().low - 0.3968).abs() < 1e-4);
        let weak = row("weak");
        assert_eq!((weak.pulls, weak.trials, weak.rescues), (2, 1, 0));
        assert_eq!(weak.cost_per_rescue_usd, None, "no rescue, no cost per rescue");
        let control = row("control");
        assert!(control.control);
        assert_eq!((control.pulls, control.trials, control.rescues), (1, 2, 1));
        assert_eq!(run.leader.as_deref(), Some("strong"));
        assert_eq!(
            run.not_separated,
            ["weak", "control"],
            "few outcomes: wide intervals"
        );
    }

    #[test]
    fn configured_arms_decide_the_rows_and_the_control() {
        let mut config = Config::default();
        config.hints.arms = toml::from_str::<toml::Table>(
            "[[arms]]\nname = \"a\"\nmodels = [\"m\"]\n[[arms]]\nname = \"base\"\nstatic = true",
        )
        .unwrap()["arms"]
            .clone()
            .try_into()
            .unwrap();
        let h = hint("x", 3, "t", "a", HintCategory::LlmSynthesized, 0.5);
        let (runs, from) = arm_tables(std::slice::from_ref(&h), &[outcome(&h, 2)], Some(&config)).unwrap();
        assert_eq!(from, "config");
        let names: Vec<_> = runs[0].arms.iter().map(|a| (a.arm.as_str(), a.control)).collect();
        assert_eq!(names, [("a", false), ("base", true)]);
        assert_eq!(runs[0].arms[0].cost_per_rescue_usd, Some(0.5));
        assert_eq!(
            runs[0].not_separated,
            Vec::<String>::new(),
            "base has no outcomes"
        );
    }

    #[test]
    fn transfer_and_reliance_have_intervals_and_lead_under_arm_reward_transfer() {
        // A fractional mean gets the Wilson interval of its mean: 0.5 of 10
        // as 5 of 10.
        assert_eq!(wilson_of_mean(0.5, 10, Z_95), wilson(5, 10, Z_95));
        assert_eq!(wilson_of_mean(0.5, 0, Z_95), None);
        // Reliance 1, 2, 3: mean 2, std 1, 2 ± 1.96 / √3.
        let tally = MeanTally {
            n: 3,
            sum: 6.0,
            sum_sq: 14.0,
        };
        let i = normal_interval(&tally, Z_95).unwrap();
        let half = Z_95 / 3f64.sqrt();
        assert!((i.low - (2.0 - half)).abs() < 1e-12 && (i.high - (2.0 + half)).abs() < 1e-12);
        assert_eq!(
            normal_interval(
                &MeanTally {
                    n: 1,
                    sum: 2.0,
                    sum_sq: 4.0
                },
                Z_95
            ),
            None
        );
        // Leaky rescues 9 of 10 with transfer 0.1; the teacher 5 of 10 with
        // transfer 0.45 (0 for the failures).
        let mut config = Config::default();
        config.hints.arms = toml::from_str::<toml::Table>(
            "[[arms]]\nname = \"leaky\"\nmodels = [\"m\"]\n[[arms]]\nname = \"teacher\"\nmodels = [\"n\"]",
        )
        .unwrap()["arms"]
            .clone()
            .try_into()
            .unwrap();
        let (mut hints, mut outcomes) = (Vec::new(), Vec::new());
        for i in 0..10 {
            let leaky = hint(
                &format!("l{i}"),
                1,
                &format!("a{i}"),
                "leaky",
                HintCategory::LlmSynthesized,
                0.0,
            );
            let teacher = hint(
                &format!("t{i}"),
                1,
                &format!("b{i}"),
                "teacher",
                HintCategory::LlmSynthesized,
                0.0,
            );
            let leaky_ok = i < 9;
            let teacher_ok = i < 5;
            outcomes.push(HintOutcome {
                transfer: Some(if leaky_ok { 0.1 } else { 0.0 }),
                reliance: leaky_ok.then_some(2.0 + f64::from(i) / 10.0),
                ..outcome(&leaky, i64::from(leaky_ok))
            });
            outcomes.push(HintOutcome {
                transfer: Some(if teacher_ok { 0.45 } else { 0.0 }),
                reliance: teacher_ok.then_some(0.1),
                ..outcome(&teacher, i64::from(teacher_ok))
            });
            hints.extend([leaky, teacher]);
        }
        let row = |runs: &[RunArms], name: &str| runs[0].arms.iter().find(|a| a.arm == name).unwrap().clone();
        let (runs, _) = arm_tables(&hints, &outcomes, Some(&config)).unwrap();
        assert_eq!(runs[0].leader.as_deref(), Some("leaky"), "rescue by default");
        let teacher = row(&runs, "teacher");
        assert_eq!(teacher.transfer_outcomes, 10);
        assert!((teacher.transfer.unwrap() - 0.225).abs() < 1e-12);
        assert_eq!(teacher.transfer_interval, wilson_of_mean(0.225, 10, Z_95));
        assert!((teacher.reliance.unwrap() - 0.1).abs() < 1e-12);
        let leaky = row(&runs, "leaky");
        assert!((leaky.reliance.unwrap() - 2.4).abs() < 1e-9, "{leaky:?}");
        assert!(leaky.reliance_interval.unwrap().low > teacher.reliance_interval.unwrap().high);
        config.hints.arm_reward = ArmReward::Transfer;
        let (runs, _) = arm_tables(&hints, &outcomes, Some(&config)).unwrap();
        assert_eq!(runs[0].leader.as_deref(), Some("teacher"));
        let json = serde_json::to_value(row(&runs, "teacher")).unwrap();
        assert!(
            json["transfer"].is_f64() && json["reliance_interval"]["low"].is_f64(),
            "{json}"
        );
    }
}
