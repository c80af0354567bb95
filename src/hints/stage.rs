//! The Kafka service of stage 1: build (LLM client, Kafka clients, metrics
//! endpoint) and run (group gathering, synthesis, publishing). A slow LLM
//! call holds back nothing but its own group: every message is its own task.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use rdkafka::producer::FutureProducer;
use thiserror::Error;

use super::group::{best_index, Groups, Joined};
use crate::config::Config;
use crate::kafka::produce::headers;
use crate::kafka::{
    send_until_acked, DeadLetter, DeadLetters, Done, Outgoing, RecordMeta, Rejected, RunSummary, StageIo,
    Work,
};
use crate::llm::prompt::{truncate_chars, PROMPT_VERSION};
use crate::llm::synth::{LlmEnv, SynthObserver};
use crate::llm::{LlmError, Synthesis, Synthesizer};
use crate::messages::{decode, FailedTrajectory, Hint, HintSource, SCHEMA_VERSION};
use crate::metrics::{FloatCounter, Labels};

/// Header names on published hints.
pub const CATEGORY_HEADER: &str = "hintstream.category";
pub const PROMPT_VERSION_HEADER: &str = "hintstream.prompt-version";
pub const TRACE_ID_HEADER: &str = "hintstream.trace-id";

#[derive(Debug, Error)]
pub enum StageError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("metrics endpoint: {0}")]
    Metrics(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("LLM client: {0}")]
    Llm(#[from] LlmError),
}

/// Prometheus metrics of stage 1.
pub struct HintMetrics {
    hints: Family<Labels, Counter>,
    llm_requests: Family<Labels, Counter>,
    llm_retries: Family<Labels, Counter>,
    llm_latency: Histogram,
    hint_latency: Family<Labels, Histogram>,
    tokens: Family<Labels, Counter>,
    cost: FloatCounter,
    llm_in_flight: Gauge,
    groups_open: Gauge,
}

impl HintMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = HintMetrics {
            hints: Family::default(),
            llm_requests: Family::default(),
            llm_retries: Family::default(),
            llm_latency: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            hint_latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.05, 2.0, 12))),
            tokens: Family::default(),
            cost: FloatCounter::default(),
            llm_in_flight: Gauge::default(),
            groups_open: Gauge::default(),
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
        registry.register("llm_tokens", "Tokens used, by direction", m.tokens.clone());
        registry.register("llm_cost_usd", "Dollars spent on LLM calls", m.cost.clone());
        registry.register("llm_in_flight", "LLM calls in flight", m.llm_in_flight.clone());
        registry.register(
            "groups_open",
            "Groups waiting for trajectories or a hint",
            m.groups_open.clone(),
        );
        m
    }

    /// A hint was synthesized (whatever its category).
    pub fn published(&self, s: &Synthesis) {
        let category = s.category.as_str().to_string();
        self.hints
            .get_or_create(&vec![("category", category.clone())])
            .inc();
        self.hint_latency
            .get_or_create(&vec![("category", category)])
            .observe(s.latency_ms as f64 / 1e3);
        self.tokens
            .get_or_create(&vec![("direction", "input".into())])
            .inc_by(s.usage.input_tokens);
        self.tokens
            .get_or_create(&vec![("direction", "output".into())])
            .inc_by(s.usage.output_tokens);
        self.cost.inc_by(s.cost_usd);
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
}

/// The Hint for a group, from its best trajectory and the synthesis.
pub fn build_hint(hint_id: String, best: &FailedTrajectory, source: &RecordMeta, s: Synthesis) -> Hint {
    Hint {
        schema_version: i64::from(SCHEMA_VERSION),
        hint_id,
        run_id: best.run_id.clone(),
        step: best.step,
        instance_id: best.instance_id.clone(),
        trajectory_id: best.trajectory_id.clone(),
        hint: s.hint,
        category: s.category,
        model: s.model,
        prompt_version: PROMPT_VERSION.to_string(),
        latency_ms: s.latency_ms,
        usage: s.usage,
        cost_usd: s.cost_usd,
        failure_reason: s.failure_reason,
        source: HintSource {
            topic: source.topic.clone(),
            partition: source.partition,
            offset: source.offset,
        },
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }
}

/// A trajectory waiting in its group, with its unfinished offset.
struct Member {
    trajectory: FailedTrajectory,
    /// The original bytes, for the DLQ should the hint be rejected.
    payload: Vec<u8>,
    meta: RecordMeta,
    done: Done,
}

struct Shared {
    groups: Mutex<Groups<Member>>,
    synth: Synthesizer,
    producer: FutureProducer,
    dlq: DeadLetters,
    output_topic: String,
    group_wait: Duration,
    metrics: Arc<HintMetrics>,
}

impl Shared {
    fn groups(&self) -> MutexGuard<'_, Groups<Member>> {
        // Groups' methods complete their change before returning, so a
        // poisoned lock holds consistent data.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn handle(&self, work: Work<FailedTrajectory>) {
        let key = work.input.group_key();
        let expected = usize::try_from(work.input.group_size).unwrap_or(usize::MAX);
        let member = Member {
            trajectory: work.input,
            payload: work.payload,
            meta: work.meta,
            done: work.done,
        };
        let joined = {
            let mut groups = self.groups();
            let joined = groups.join(&key, expected, member);
            self.metrics.groups_open.set(groups.len() as i64);
            joined
        };
        let Joined::Leader(complete) = joined else {
            return;
        };
        tokio::select! {
            _ = complete.notified() => {}
            _ = tokio::time::sleep(self.group_wait) => {}
        }
        let Some(group) = self.groups().take(&key) else {
            return;
        };
        let Some(best) = best_index(&group.members, |m| m.trajectory.reward) else {
            return;
        };
        if group.members.len() < group.expected {
            tracing::debug!(group = %key, got = group.members.len(), expected = group.expected, "group wait ran out; hinting from what arrived");
        }
        let best_member = &group.members[best];
        let synthesis = self.synth.synthesize(&best_member.trajectory).await;
        self.metrics.published(&synthesis);
        let hint = build_hint(
            self.synth.hint_id(&key),
            &best_member.trajectory,
            &best_member.meta,
            synthesis,
        );
        tracing::info!(
            category = hint.category.as_str(), instance = %hint.instance_id, hint_id = %hint.hint_id,
            failure_reason = hint.failure_reason.as_deref().unwrap_or(""),
            "Hint [{}] for instance {} (best_reward={}): {}",
            hint.category.as_str(), hint.instance_id, best_member.trajectory.reward, truncate_chars(&hint.hint, 500)
        );
        // A struct of strings and finite numbers always serialises.
        let payload = serde_json::to_vec(&hint).unwrap_or_default();
        let trace_id = format!("{:032x}", rand::random::<u128>());
        let published = send_until_acked(
            &self.producer,
            &Outgoing {
                topic: &self.output_topic,
                key: Some(key.as_bytes()),
                payload: Some(&payload),
                headers: headers([
                    ("content-type", "application/json"),
                    (CATEGORY_HEADER, hint.category.as_str()),
                    (PROMPT_VERSION_HEADER, PROMPT_VERSION),
                    (TRACE_ID_HEADER, trace_id.as_str()),
                ]),
            },
        )
        .await;
        if let Err(e) = published {
            let reason = format!("the hint for {key} was rejected by the broker: {e}");
            for m in group.members {
                self.dlq
                    .send(&DeadLetter {
                        key: m.meta.key.as_deref(),
                        payload: Some(&m.payload),
                        source_topic: &m.meta.topic,
                        partition: m.meta.partition,
                        offset: m.meta.offset,
                        kind: "output_rejected",
                        reason: &reason,
                    })
                    .await;
                m.done.finish();
            }
            return;
        }
        for m in group.members {
            m.done.finish();
        }
        self.metrics.groups_open.set(self.groups().len() as i64);
    }
}

/// A built stage 1.
pub struct HintStage {
    config: Config,
    io: StageIo,
    shared: Arc<Shared>,
    pub metrics_addr: SocketAddr,
}

impl HintStage {
    /// Creates the LLM client (from config and the SDK env variables), the
    /// Kafka clients, and starts the metrics endpoint.
    pub async fn build(config: Config, env: &LlmEnv) -> Result<Self, StageError> {
        let stage = &config.hints;
        let metrics_socket = stage.metrics_socket()?;
        let mut registry = Registry::with_prefix("hintstream_hints");
        let io = StageIo::build(&config, stage, &mut registry)?;
        let metrics = Arc::new(HintMetrics::register(&mut registry));
        let synth = Synthesizer::new(&config.llm, env)?.with_observer(metrics.clone());
        tracing::info!("hints: {}", synth.describe());
        let metrics_addr = crate::metrics::serve(metrics_socket, Arc::new(registry)).await?;
        let shared = Arc::new(Shared {
            groups: Mutex::new(Groups::default()),
            synth,
            producer: io.producer.clone(),
            dlq: io.dlq.clone(),
            output_topic: stage.output_topic.clone(),
            group_wait: Duration::from_millis(config.llm.group_wait_ms),
            metrics,
        });
        Ok(HintStage {
            config,
            io,
            shared,
            metrics_addr,
        })
    }

    /// Runs until `shutdown` resolves, then drains and commits.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> RunSummary {
        let stage = &self.config.hints;
        let limits = self.config.decode_limits();
        let shared = self.shared.clone();
        tracing::info!(input = %stage.input_topic, output = %stage.output_topic, group = %stage.group_id, "hint stage running");
        self.io
            .run(
                move |bytes: &[u8], _: &RecordMeta| -> Result<FailedTrajectory, Rejected> {
                    Ok(decode(bytes, limits)?)
                },
                move |work: Work<FailedTrajectory>| {
                    let shared = shared.clone();
                    async move { shared.handle(work).await }
                },
                shutdown,
            )
            .await
    }
}
