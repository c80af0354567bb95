//! `hintstream eval`: stage 1's synthesis over a recorded failed-trajectory
//! topic, under one or more configs, without a broker. Every LLM exchange
//! goes through a cassette, so a rerun in playback mode is deterministic and
//! makes no HTTP request. Writes `report.json` and a self-contained
//! `index.html`; with recorded scored rollouts, adds what the hints did in
//! training, computed by stage 2's code.

pub mod html;
pub mod input;
pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use thiserror::Error;

use crate::advantages::compute_step;
use crate::advantages::step_metrics::step_metrics;
use crate::config::{Config, LlmProvider};
use crate::hints::build_hint;
use crate::llm::cassette::{Cassette, CassetteError, CassetteMode};
use crate::llm::prompt::{truncate_chars, PROMPT_VERSION};
use crate::llm::synth::LlmEnv;
use crate::llm::{LlmError, Synthesizer};
use input::{read_failed, read_scored, InputError};
use report::{
    histogram, outcomes_by_category, summarize, ConfigSummary, EvalHint, GroupHints, Outcomes, Report,
    StepOutcome,
};

/// Verifier errors shown per group in the report.
const VERIFIER_ERROR_CHARS: usize = 300;

#[derive(Debug, Error)]
pub enum EvalError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Cassette(#[from] CassetteError),
    #[error("config {label}: {source}")]
    Llm {
        label: String,
        #[source]
        source: LlmError,
    },
    #[error("{count} LLM request(s) of config {label} are not in the cassette (first: group {group}); the prompt, model or settings changed since it was recorded. Rerun without --strict to record them")]
    CassetteMiss {
        label: String,
        count: usize,
        group: String,
    },
    #[error("the stage-2 computation failed for {step}: {reason}")]
    Outcomes { step: String, reason: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} has no failed trajectories to evaluate")]
    Empty(String),
}

/// One config under evaluation.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    /// Its name in the report (the file's stem).
    pub label: String,
    pub file: Option<PathBuf>,
    pub config: Config,
}

#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// A `hintstream record` file of failed trajectories (or plain JSONL).
    pub input: PathBuf,
    /// A `hintstream record` file of scored rollouts (or plain JSONL).
    pub scored: Option<PathBuf>,
    pub out: PathBuf,
    /// Default: `OUT/cassette.jsonl`.
    pub cassette: Option<PathBuf>,
    pub mode: CassetteMode,
    pub progress: bool,
}

impl EvalOptions {
    pub fn cassette_path(&self) -> PathBuf {
        self.cassette
            .clone()
            .unwrap_or_else(|| self.out.join("cassette.jsonl"))
    }
}

/// Labels from file stems, made unique.
pub fn labels(files: &[Option<PathBuf>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let stem = f
            .as_deref()
            .and_then(Path::file_stem)
            .map_or_else(|| "default".to_string(), |s| s.to_string_lossy().into_owned());
        let label = if out.contains(&stem) {
            format!("{stem}-{}", i + 1)
        } else {
            stem
        };
        out.push(label);
    }
    out
}

/// Strict playback sends nothing, so a config that names its provider needs
/// no real key: a placeholder stands in for a missing one. (`auto` is left
/// alone: which keys are set decides its provider.)
fn playback_env(config: &Config, env: &LlmEnv, mode: CassetteMode) -> LlmEnv {
    let mut env = env.clone();
    if mode == CassetteMode::Strict {
        let placeholder = || Some("strict-playback-sends-no-request".to_string());
        match config.llm.provider {
            LlmProvider::Anthropic if env.anthropic_api_key.is_none() => {
                env.anthropic_api_key = placeholder()
            }
            LlmProvider::Openai if env.openai_api_key.is_none() => env.openai_api_key = placeholder(),
            LlmProvider::Openrouter if env.openrouter_api_key.is_none() => {
                env.openrouter_api_key = placeholder()
            }
            _ => {}
        }
    }
    env
}

/// Runs the evaluation and writes `report.json` and `index.html` into `out`.
pub async fn run(configs: &[EvalConfig], options: &EvalOptions, env: &LlmEnv) -> Result<Report, EvalError> {
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EvalError::Write { path, source }
    };
    std::fs::create_dir_all(&options.out).map_err(write_error(&options.out))?;
    let limits = configs
        .first()
        .map_or_else(|| Config::default().decode_limits(), |c| c.config.decode_limits());
    let failed = read_failed(&options.input, limits)?;
    if failed.groups.is_empty() {
        return Err(EvalError::Empty(options.input.display().to_string()));
    }
    let cassette = Arc::new(Cassette::open(&options.cassette_path(), options.mode)?);
    let mut summaries = Vec::new();
    let mut per_config: Vec<Vec<EvalHint>> = Vec::new();
    for c in configs {
        let env = &playback_env(&c.config, env, options.mode);
        let synth = Synthesizer::new(&c.config.llm, env)
            .map_err(|source| EvalError::Llm {
                label: c.label.clone(),
                source,
            })?
            .with_cassette(cassette.clone());
        let (played, appended) = (cassette.played(), cassette.appended());
        let bar = crate::tools::progress_bar(Some(failed.groups.len() as u64), &format!("eval {}", c.label));
        if !options.progress {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let started = Instant::now();
        let synth = &synth;
        let hints: Vec<EvalHint> = futures::stream::iter(&failed.groups)
            .map(|g| async move {
                let (best, meta) = g.best();
                let synthesis = synth.synthesize(best).await;
                build_hint(synth.hint_id(&g.key), best, meta, synthesis)
            })
            .buffered(c.config.llm.concurrency.max(1))
            .map(|h| {
                bar.inc(1);
                EvalHint::from_hint(&c.label, &h)
            })
            .collect()
            .await;
        bar.finish_and_clear();
        let wall_secs = started.elapsed().as_secs_f64();
        if options.mode == CassetteMode::Strict {
            let missed: Vec<usize> = (0..hints.len())
                .filter(|&i| hints[i].failure_reason.as_deref() == Some("cassette_miss"))
                .collect();
            if let Some(&first) = missed.first() {
                return Err(EvalError::CassetteMiss {
                    label: c.label.clone(),
                    count: missed.len(),
                    group: failed.groups[first].key.clone(),
                });
            }
        }
        let refs: Vec<&EvalHint> = hints.iter().collect();
        let stats = summarize(&refs);
        summaries.push(ConfigSummary {
            label: c.label.clone(),
            config_file: c.file.as_ref().map(|f| f.display().to_string()),
            source: synth.describe(),
            models: if synth.has_model() {
                synth.models().to_vec()
            } else {
                vec![]
            },
            prompt_version: PROMPT_VERSION.to_string(),
            concurrency: c.config.llm.concurrency,
            categories: stats.categories,
            fallback_rate: stats.fallback_rate,
            failure_reasons: stats.failure_reasons,
            latency_ms: stats.latency_ms,
            latency_histogram: vec![],
            input_tokens: stats.input_tokens,
            output_tokens: stats.output_tokens,
            cost_usd: stats.cost_usd,
            hint_chars: stats.hint_chars,
            wall_secs,
            cassette_played: cassette.played() - played,
            api_calls: cassette.appended() - appended,
        });
        per_config.push(hints);
    }
    // One latency scale for every config, so the histograms compare.
    let top = summaries.iter().map(|s| s.latency_ms.max).fold(0.0, f64::max);
    for (s, hints) in summaries.iter_mut().zip(&per_config) {
        let latencies: Vec<f64> = hints.iter().map(|h| h.latency_ms as f64).collect();
        s.latency_histogram = histogram(&latencies, top);
    }
    let hints = failed
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
        .collect();
    let outcomes = match &options.scored {
        Some(path) => Some(outcomes(
            path,
            configs.first().map_or_else(Config::default, |c| c.config.clone()),
        )?),
        None => None,
    };
    let report = Report {
        input: options.input.display().to_string(),
        trajectories: failed.trajectories,
        rejected: failed.rejected,
        groups: failed.groups.len() as u64,
        configs: summaries,
        hints,
        outcomes,
    };
    let json_path = options.out.join("report.json");
    let json = serde_json::to_vec_pretty(&report).map_err(|e| EvalError::Write {
        path: json_path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&json_path, json).map_err(write_error(&json_path))?;
    let html_path = options.out.join("index.html");
    std::fs::write(&html_path, html::render(&report)).map_err(write_error(&html_path))?;
    Ok(report)
}

/// Stage 2's computation and step metrics over recorded scored rollouts.
fn outcomes(path: &Path, config: Config) -> Result<Outcomes, EvalError> {
    let scored = read_scored(path, config.decode_limits())?;
    let options = config.normalize.options();
    let mut steps = Vec::new();
    let mut rows = 0u64;
    for step_rows in scored.steps {
        let (run_id, step) = (step_rows.run_id[0].clone(), step_rows.step[0]);
        rows += step_rows.len() as u64;
        let result =
            compute_step(step_rows, &options, config.normalize.device).map_err(|e| EvalError::Outcomes {
                step: crate::messages::step_key(&run_id, step),
                reason: e.to_string(),
            })?;
        let metrics = step_metrics(
            &result.rows,
            &result.advantages,
            &config.advantages.metric_options(),
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

    #[test]
    fn labels_come_from_file_stems_and_stay_unique() {
        let files = vec![
            Some(PathBuf::from("a/sonnet.toml")),
            Some(PathBuf::from("b/sonnet.toml")),
            None,
        ];
        assert_eq!(labels(&files), ["sonnet", "sonnet-2", "default"]);
    }
}
