//! One config's pass over the input: its synthesizer, through the shared
//! cassette, on the best trajectory of every group, as many at once as its
//! `llm.concurrency`; a strict playback that missed the cassette fails the
//! run; the hints summarised for the report.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

use super::error::EvalError;
use super::input::{FailedInput, Group};
use super::options::{EvalConfig, EvalOptions};
use super::report::{summarize, ConfigSummary, EvalHint};
use crate::config::{Config, LlmProvider};
use crate::hints::{build_hint, HintLabels};
use crate::llm::cassette::{Cassette, CassetteMode};
use crate::llm::prompt::PROMPT_VERSION;
use crate::llm::synth::LlmEnv;
use crate::llm::Synthesizer;

/// One config's hints, in group order, and their summary (its latency
/// histogram still empty: it shares a scale with the other configs).
pub(super) struct ConfigPass {
    pub(super) summary: ConfigSummary,
    pub(super) hints: Vec<EvalHint>,
}

/// Runs `c` over every group of `failed`.
pub(super) async fn run_config(
    c: &EvalConfig,
    failed: &FailedInput,
    cassette: &Arc<Cassette>,
    options: &EvalOptions,
    env: &LlmEnv,
) -> Result<ConfigPass, EvalError> {
    let env = &playback_env(&c.config, env, options.mode);
    let synth = Synthesizer::new(&c.config.llm, env)
        .map_err(|source| EvalError::Llm {
            label: c.label.clone(),
            source,
        })?
        .with_cassette(cassette.clone());
    let (played, appended) = (cassette.played(), cassette.appended());
    let started = Instant::now();
    let hints = hint_groups(c, &synth, &failed.groups, options.progress).await;
    let wall_secs = started.elapsed().as_secs_f64();
    if options.mode == CassetteMode::Strict {
        check_misses(c, &hints, &failed.groups)?;
    }
    let calls = CallCounts {
        played: cassette.played() - played,
        sent: cassette.appended() - appended,
    };
    Ok(ConfigPass {
        summary: summary(c, &synth, &hints, wall_secs, calls),
        hints,
    })
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

/// Every group's hint from `synth`, in group order, with a progress bar
/// (hidden unless `progress`).
async fn hint_groups(c: &EvalConfig, synth: &Synthesizer, groups: &[Group], progress: bool) -> Vec<EvalHint> {
    let bar = crate::tools::progress_bar(Some(groups.len() as u64), &format!("eval {}", c.label));
    if !progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let hints = futures::stream::iter(groups)
        .map(|g| async move {
            let (best, meta) = g.best();
            let synthesis = synth.synthesize(best).await;
            build_hint(
                synth.hint_id(&g.key),
                best,
                meta,
                synthesis,
                HintLabels::default_arm(synth.prompt_version().as_str()),
            )
        })
        .buffered(c.config.llm.concurrency.max(1))
        .map(|h| {
            bar.inc(1);
            EvalHint::from_hint(&c.label, &h)
        })
        .collect()
        .await;
    bar.finish_and_clear();
    hints
}

/// Fails with the count and first group of the hints that missed the
/// cassette.
fn check_misses(c: &EvalConfig, hints: &[EvalHint], groups: &[Group]) -> Result<(), EvalError> {
    let missed: Vec<usize> = (0..hints.len())
        .filter(|&i| hints[i].failure_reason.as_deref() == Some("cassette_miss"))
        .collect();
    match missed.first() {
        Some(&first) => Err(EvalError::CassetteMiss {
            label: c.label.clone(),
            count: missed.len(),
            group: groups[first].key.clone(),
        }),
        None => Ok(()),
    }
}

/// The calls of one config's pass: answered from the cassette, and sent to
/// the API (and appended).
struct CallCounts {
    played: u64,
    sent: u64,
}

/// The summary of `c`'s hints, its latency histogram left empty.
fn summary(
    c: &EvalConfig,
    synth: &Synthesizer,
    hints: &[EvalHint],
    wall_secs: f64,
    calls: CallCounts,
) -> ConfigSummary {
    let refs: Vec<&EvalHint> = hints.iter().collect();
    let stats = summarize(&refs);
    ConfigSummary {
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
        system_context: synth.system_context().fingerprint(),
        hints_changed: None,
        categories: stats.categories,
        fallback_rate: stats.fallback_rate,
        failure_reasons: stats.failure_reasons,
        latency_ms: stats.latency_ms,
        latency_histogram: vec![],
        input_tokens: stats.input_tokens,
        output_tokens: stats.output_tokens,
        cache_read_input_tokens: stats.cache_read_input_tokens,
        cache_creation_input_tokens: stats.cache_creation_input_tokens,
        cost_usd: stats.cost_usd,
        hint_chars: stats.hint_chars,
        wall_secs,
        cassette_played: calls.played,
        api_calls: calls.sent,
    }
}
