//! `hintstream eval`: stage 1's synthesis over a recorded failed-trajectory
//! topic, under one or more configs, without a broker. Every LLM exchange
//! goes through a cassette, so a rerun in playback mode is deterministic and
//! makes no HTTP request. Writes `report.json` and a self-contained
//! `index.html`; with recorded scored rollouts, adds what the hints did in
//! training, computed by stage 2's code; with recorded `rl.hints` (and
//! `rl.hints.outcomes`), the arm table (`arms`). With hints and no failed
//! trajectories it makes the arm table alone, without synthesis.
//!
//! `run` takes the steps in order: read the groups (`input`), one pass per
//! config (`synthesize`), the stage-2 outcomes (`outcomes`), the report
//! (`report`, `html` over `markup`), the arm table (`arms`, drawn by
//! `arms_html`).

pub mod arms;
pub mod arms_html;
mod error;
pub mod html;
pub mod input;
pub mod markup;
mod options;
mod outcomes;
pub mod report;
mod synthesize;

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::llm::cassette::Cassette;
use crate::llm::prompt::truncate_chars;
use crate::llm::synth::LlmEnv;
pub use error::EvalError;
use input::{read_failed, FailedInput};
pub use options::{labels, EvalConfig, EvalOptions};
use report::{histogram, ConfigSummary, EvalHint, GroupHints, Report};
use synthesize::{run_config, ConfigPass};

/// Verifier errors shown per group in the report.
const VERIFIER_ERROR_CHARS: usize = 300;

/// Runs the evaluation and writes `report.json` and `index.html` into `out`:
/// reads the groups, runs each config over them through one cassette, and,
/// with scored rollouts, adds what the hints did in training; with recorded
/// hints, the arm table.
pub async fn run(configs: &[EvalConfig], options: &EvalOptions, env: &LlmEnv) -> Result<Report, EvalError> {
    if options.input.is_none() && options.hints.is_none() {
        return Err(EvalError::NothingToDo);
    }
    std::fs::create_dir_all(&options.out).map_err(write_error(&options.out))?;
    let first = configs.first().map(|c| &c.config);
    let mut report = match &options.input {
        Some(input) => synthesis_report(configs, input, options, env).await?,
        None => Report {
            input: String::new(),
            trajectories: 0,
            groups: 0,
            hints: Vec::new(),
            rejected: Default::default(),
            configs: Vec::new(),
            outcomes: None,
            arms: None,
        },
    };
    if let Some(path) = &options.scored {
        report.outcomes = Some(outcomes::outcomes(path, first.cloned().unwrap_or_default())?);
    }
    if let Some(hints) = &options.hints {
        let limits = first.map_or_else(|| Config::default().decode_limits(), Config::decode_limits);
        report.arms = Some(arms::read_arms(
            hints,
            options.outcomes.as_deref(),
            first,
            limits,
        )?);
    }
    write_report(&report, &options.out)?;
    Ok(report)
}

/// Synthesis over the failed trajectories of `input` under each config.
async fn synthesis_report(
    configs: &[EvalConfig],
    input: &Path,
    options: &EvalOptions,
    env: &LlmEnv,
) -> Result<Report, EvalError> {
    let failed = read_groups(configs, input)?;
    let cassette = Arc::new(Cassette::open(&options.cassette_path(), options.mode)?);
    let mut summaries = Vec::new();
    let mut per_config: Vec<Vec<EvalHint>> = Vec::new();
    for c in configs {
        let ConfigPass { mut summary, hints } = run_config(c, &failed, &cassette, options, env).await?;
        if let Some(first) = per_config.first() {
            summary.hints_changed = Some(report::hints_changed(first, &hints));
        }
        summaries.push(summary);
        per_config.push(hints);
    }
    add_latency_histograms(&mut summaries, &per_config);
    Ok(Report {
        input: input.display().to_string(),
        trajectories: failed.trajectories,
        groups: failed.groups.len() as u64,
        hints: group_hints(&failed, &per_config),
        rejected: failed.rejected,
        configs: summaries,
        outcomes: None,
        arms: None,
    })
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> EvalError {
    let path = path.to_path_buf();
    move |source| EvalError::Write { path, source }
}

/// The failed trajectories of `input` in groups, decoded under the first
/// config's limits; an input without any is an error.
fn read_groups(configs: &[EvalConfig], input: &Path) -> Result<FailedInput, EvalError> {
    let limits = configs
        .first()
        .map_or_else(|| Config::default().decode_limits(), |c| c.config.decode_limits());
    let failed = read_failed(input, limits)?;
    if failed.groups.is_empty() {
        return Err(EvalError::Empty(input.display().to_string()));
    }
    Ok(failed)
}

/// Each config's latency histogram, on one scale for every config, so the
/// histograms compare.
fn add_latency_histograms(summaries: &mut [ConfigSummary], per_config: &[Vec<EvalHint>]) {
    let top = summaries.iter().map(|s| s.latency_ms.max).fold(0.0, f64::max);
    for (s, hints) in summaries.iter_mut().zip(per_config) {
        let latencies: Vec<f64> = hints.iter().map(|h| h.latency_ms as f64).collect();
        s.latency_histogram = histogram(&latencies, top);
    }
}

/// Per group, its best trajectory and each config's hint.
fn group_hints(failed: &FailedInput, per_config: &[Vec<EvalHint>]) -> Vec<GroupHints> {
    failed
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (best, _) = g.best();
            GroupHints {
                key: g.key.clone(),
                instance_id: best.instance_id.clone(),
                trajectory_id: best.trajectory_id.clone(),
                members: g.members.len(),
                best_reward: best.reward,
                verifier_error: best
                    .verifier_error
                    .as_deref()
                    .map(|e| truncate_chars(e, VERIFIER_ERROR_CHARS)),
                hints: per_config.iter().map(|h| h[i].clone()).collect(),
            }
        })
        .collect()
}

/// Writes `report.json` and `index.html` into `out`.
pub fn write_report(report: &Report, out: &Path) -> Result<(), EvalError> {
    let json_path = out.join("report.json");
    let json = serde_json::to_vec_pretty(report).map_err(|e| EvalError::Write {
        path: json_path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&json_path, json).map_err(write_error(&json_path))?;
    let html_path = out.join("index.html");
    std::fs::write(&html_path, html::render(report)).map_err(write_error(&html_path))?;
    Ok(())
}
