//! Stage 2's side of hints that learn: the outcomes topic's start-up rule,
//! and the per-arm step metrics of a [`LearnState`] fed by a tail of
//! `rl.hints` and by the outcomes stage 2 computes itself.
//!
//! - With `[[hints.arms]]`, the outcomes topic and the hints topic must
//!   exist: a missing one stops the start (exit 2, naming `hintstream topics
//!   create`). Without arms, a missing outcomes topic is a warning, logged
//!   once at start, and no outcome is published; a missing hints topic is a
//!   warning too, and the step metrics carry no per-arm metrics.
//! - Before a step's metrics are built, the hints tail is synced (at most
//!   [`HINTS_SYNC_TIMEOUT`]; on timeout a warning, and the step goes on with
//!   what was read; the barrier runs while the step's chunks are sent),
//!   the step's outcomes are observed, and
//!   [`LearnState::step_metrics`] is merged into the step's metrics. A step
//!   without `hint_id`s on its hinted rows has none of those metrics.
//!
//! Memory: the state is bounded as [`crate::learn::state`] says
//! (at most ~242 MB with 40-byte ids, typically far less).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::step_metrics::StepMetrics;
use crate::config::{Config, ConfigError};
use crate::kafka::connect::topic_exists as topic_exists_in;
use crate::kafka::{ConnectError, TailError, TopicTail};
use crate::learn::{Arms, LearnState};
use crate::messages::{decode, DecodeLimits, Hint, HintOutcome};
use crate::stage::StageError;

/// How long a step waits for the hints tail to reach the end offsets of
/// `rl.hints` before its metrics are built; past it, a warning and the
/// metrics of what was read.
pub const HINTS_SYNC_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the start waits for the hints tail to read `rl.hints` up to its
/// end; past it, a warning (the first steps sync again).
pub const HINTS_STARTUP_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// What stage 2 learns and publishes about hints.
pub struct Learning {
    /// Where outcomes go; `None` when the topic is missing and no arms are
    /// configured.
    outcomes_topic: Option<String>,
    state: Arc<Mutex<LearnState>>,
    /// `None` when the hints topic is missing and no arms are configured.
    hints: Option<TopicTail>,
}

fn lock(state: &Mutex<LearnState>) -> MutexGuard<'_, LearnState> {
    // Every LearnState method completes its change before returning.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The topic exists (`Ok(true)`), is missing (`Ok(false)`), or the check
/// failed otherwise.
async fn topic_exists(config: &Config, topic: &str) -> Result<bool, StageError> {
    let within = Duration::from_secs(config.connect_timeout_secs);
    Ok(topic_exists_in(config, topic, within).await?)
}

impl Learning {
    /// Resolves the arms, applies the start-up rule (module docs) and
    /// starts the hints tail, read up to its end (bounded).
    pub async fn start(config: &Config) -> Result<Learning, StageError> {
        // Stage 2 needs the arms' names only; they are built as stage 1
        // builds them.
        let arms = Arms::for_stage(
            &config.hints.arms,
            config.hints.learn_options(),
            &config.llm.models,
            config.llm.prompt_version.as_str(),
        )
        .map_err(|e| ConfigError::Invalid(format!("[[hints.arms]]: {e}")))?;
        let required = config.hints.has_arms();
        let mut present = Vec::new();
        for topic in [&config.topics.outcomes, &config.topics.hints] {
            let exists = topic_exists(config, topic).await?;
            if !exists && required {
                return Err(StageError::Connect(ConnectError::MissingTopic {
                    topic: topic.clone(),
                    servers: config.bootstrap_servers.clone(),
                }));
            }
            present.push(exists);
        }
        let outcomes_topic = if present[0] {
            Some(config.topics.outcomes.clone())
        } else {
            tracing::warn!(
                topic = %config.topics.outcomes,
                "the outcomes topic does not exist: no hint outcomes are published (no [[hints.arms]] \
                 needs them); create it with `hintstream topics create`"
            );
            None
        };
        let state = Arc::new(Mutex::new(LearnState::new(arms)));
        let hints = if present[1] {
            let tail = start_tail(config, state.clone()).await?;
            let synced =
                tokio::time::timeout(HINTS_STARTUP_SYNC_TIMEOUT, tail.sync(HINTS_STARTUP_SYNC_TIMEOUT)).await;
            if !matches!(synced, Ok(Ok(()))) {
                tracing::warn!(
                    topic = %config.topics.hints, waited = ?HINTS_STARTUP_SYNC_TIMEOUT,
                    "the hints topic was not read to its end at start; going on (each step syncs again)"
                );
            }
            Some(tail)
        } else {
            tracing::warn!(
                topic = %config.topics.hints,
                "the hints topic does not exist: the step metrics carry no per-arm metrics"
            );
            None
        };
        Ok(Learning {
            outcomes_topic,
            state,
            hints,
        })
    }

    /// The topic the step's outcomes go to, if any.
    pub fn outcomes_topic(&self) -> Option<&str> {
        self.outcomes_topic.as_deref()
    }

    /// The read barrier on the hints topic before `run_id`'s `step` builds
    /// its per-arm metrics (module docs); none without outcomes or without
    /// the hints tail. It may run while the step's chunks are sent: the
    /// hints its outcomes name were written before the trainer wrote the
    /// rows that name them, so before the step was complete.
    pub async fn barrier(&self, run_id: &str, step: i64, outcomes: &[HintOutcome]) {
        let Some(tail) = &self.hints else {
            return;
        };
        if outcomes.is_empty() {
            return;
        }
        // The barrier's watermark requests count against the bound too.
        match tokio::time::timeout(HINTS_SYNC_TIMEOUT, tail.sync(HINTS_SYNC_TIMEOUT)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(run_id, step, error = %e, "the hints tail is behind; per-arm metrics from what was read")
            }
            Err(_) => tracing::warn!(
                run_id, step, waited = ?HINTS_SYNC_TIMEOUT,
                "the hints tail did not answer in time; per-arm metrics from what was read"
            ),
        }
    }

    /// The per-arm metrics of `run_id`'s `step` once its `outcomes` are
    /// known, after [`Learning::barrier`] (module docs); empty without
    /// outcomes or without the hints tail.
    pub fn step_metrics(&self, run_id: &str, step: i64, outcomes: &[HintOutcome]) -> StepMetrics {
        if self.hints.is_none() || outcomes.is_empty() {
            return StepMetrics::new();
        }
        let mut state = lock(&self.state);
        for outcome in outcomes {
            state.observe_outcome(outcome);
        }
        let mut metrics = state.step_metrics(run_id, step);
        metrics.extend(state.level_metrics(run_id, step));
        metrics
    }
}

/// A tail of the hints topic that feeds every decodable hint record to
/// `state` (others are skipped).
async fn start_tail(config: &Config, state: Arc<Mutex<LearnState>>) -> Result<TopicTail, StageError> {
    let limits: DecodeLimits = config.decode_limits();
    let topic = config.topics.hints.clone();
    TopicTail::start(config, &topic, move |_, payload| {
        let Some(payload) = payload else { return };
        match decode::<Hint>(payload, limits) {
            Ok(hint) => lock(&state).observe_hint(&hint),
            Err(e) => tracing::debug!(error = %e, "a record of the hints topic is not a hint; skipped"),
        }
    })
    .await
    .map_err(|e| match e {
        TailError::MissingTopic(topic) => StageError::Connect(ConnectError::MissingTopic {
            topic,
            servers: config.bootstrap_servers.clone(),
        }),
        TailError::Kafka(e) => StageError::Kafka(e),
        other => StageError::Learn(other.to_string()),
    })
}
