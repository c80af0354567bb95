//! The Kafka service of stage 2: build (clients, metrics endpoint) and run
//! (the consume loop, step assembly, publishing, the timeout sweeper).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use rdkafka::producer::FutureProducer;
use thiserror::Error;

use super::assemble::{Outcome, PendingStep, StepAssembler};
use super::compute::{advantages_batch, compute_step};
use super::step_metrics::step_metrics;
use crate::batch::{ipc, ScoredRows, ARROW_STREAM_CONTENT_TYPE};
use crate::config::Config;
use crate::kafka::produce::headers;
use crate::kafka::{
    send_until_acked, DeadLetter, DeadLetters, Done, Outgoing, RecordMeta, Rejected, RunSummary, StageIo,
    Work,
};
use crate::messages::{decode, step_key, DecodeLimits, ScoredMessage};
use crate::metrics::Labels;
use crate::normalize::{AdvantageOptions, Device, Ran};

/// Header that says which kernel computed a published step.
pub const DEVICE_HEADER: &str = "hintstream.device";

#[derive(Debug, Error)]
pub enum StageError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("metrics endpoint: {0}")]
    Metrics(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// One decoded message of `rl.rollouts.scored`.
pub enum ScoredInput {
    /// Rows of one (run_id, step): one JSON row or one Arrow batch.
    Rows(ScoredRows),
    End {
        run_id: String,
        step: i64,
        count: i64,
    },
}

/// Decodes a message: Arrow IPC when its `content-type` header says so or
/// its bytes start with the IPC continuation marker, JSON otherwise.
pub fn decode_scored(bytes: &[u8], meta: &RecordMeta, limits: DecodeLimits) -> Result<ScoredInput, Rejected> {
    let arrow = meta.header("content-type") == Some(ARROW_STREAM_CONTENT_TYPE.as_bytes())
        || bytes.starts_with(&[0xff, 0xff, 0xff, 0xff]);
    if !arrow {
        return match decode::<ScoredMessage>(bytes, limits)? {
            ScoredMessage::ScoredRollout(row) => {
                let mut rows = ScoredRows::default();
                rows.push(&row);
                Ok(ScoredInput::Rows(rows))
            }
            ScoredMessage::StepEnd(end) => Ok(ScoredInput::End {
                run_id: end.run_id,
                step: end.step,
                count: end.count,
            }),
        };
    }
    if bytes.len() > limits.max_bytes {
        return Err(crate::messages::DecodeError::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        }
        .into());
    }
    let reject = |kind: &'static str, reason: String| Rejected { kind, reason };
    let batches = ipc::decode_stream(bytes)
        .map_err(|e| reject("bad_arrow", format!("not an Arrow IPC stream: {e}")))?;
    let mut rows = ScoredRows::default();
    for batch in &batches {
        rows.extend(ScoredRows::from_batch(batch).map_err(|e| reject(e.kind(), e.to_string()))?);
    }
    if rows.is_empty() {
        return Err(reject("empty", "the Arrow stream has no rows".into()));
    }
    let one_step = rows
        .run_id
        .iter()
        .zip(&rows.step)
        .all(|(r, s)| *r == rows.run_id[0] && *s == rows.step[0]);
    if !one_step {
        return Err(reject(
            "mixed_steps",
            "an Arrow message must hold rows of one run_id/step".into(),
        ));
    }
    Ok(ScoredInput::Rows(rows))
}

/// Prometheus metrics of stage 2.
pub struct AdvantageMetrics {
    steps_published: Counter,
    rows_published: Counter,
    steps_dead_lettered: Family<Labels, Counter>,
    compute_seconds: Family<Labels, Histogram>,
    extreme_advantages: Counter,
    pending_steps: Gauge,
}

impl AdvantageMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = AdvantageMetrics {
            steps_published: Counter::default(),
            rows_published: Counter::default(),
            steps_dead_lettered: Family::default(),
            compute_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 4.0, 12))
            }),
            extreme_advantages: Counter::default(),
            pending_steps: Gauge::default(),
        };
        registry.register(
            "steps_published",
            "Steps whose advantages were published",
            m.steps_published.clone(),
        );
        registry.register(
            "rows_published",
            "Rows whose advantages were published",
            m.rows_published.clone(),
        );
        registry.register(
            "steps_dead_lettered",
            "Steps sent to the DLQ (incomplete, overfull, compute error), by reason",
            m.steps_dead_lettered.clone(),
        );
        registry.register(
            "compute_seconds",
            "Advantage computation time per step, by device",
            m.compute_seconds.clone(),
        );
        registry.register(
            "extreme_advantages",
            "Rows with |advantage| > 1e3 (std-0 baselines)",
            m.extreme_advantages.clone(),
        );
        registry.register(
            "pending_steps",
            "Steps waiting for rows or their step_end",
            m.pending_steps.clone(),
        );
        m
    }

    /// A step's advantages were computed on `device` in `seconds`.
    pub fn computed(&self, device: &str, seconds: f64) {
        self.compute_seconds
            .get_or_create(&vec![("device", device.to_string())])
            .observe(seconds);
    }

    /// A step went to the DLQ for `reason`.
    pub fn step_dead_lettered(&self, reason: &str) {
        self.steps_dead_lettered
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }
}

/// A message parked in the assembler until its step is done.
pub struct Parked {
    payload: Vec<u8>,
    meta: RecordMeta,
    done: Done,
}

/// What the handler tasks and the sweeper share.
struct Shared {
    assembler: Mutex<StepAssembler<Parked>>,
    producer: FutureProducer,
    dlq: DeadLetters,
    output_topic: String,
    metrics_topic: String,
    options: AdvantageOptions,
    device: Device,
    success_threshold: f64,
    pass_at_k: Vec<u32>,
    step_timeout: Duration,
    metrics: AdvantageMetrics,
}

impl Shared {
    fn assembler(&self) -> MutexGuard<'_, StepAssembler<Parked>> {
        // The assembler's maps stay consistent across a panic in a caller
        // (each method completes its change before returning).
        self.assembler.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a message to its step. Called synchronously by the consume loop,
    /// so messages reach the assembler in partition order: a row that comes
    /// after its step's `step_end` is seen as such, never as part of it.
    fn assemble(&self, work: Work<ScoredInput>) -> Outcome<Parked> {
        let parked = Parked {
            payload: work.payload,
            meta: work.meta,
            done: work.done,
        };
        let position = (parked.meta.partition, parked.meta.offset);
        let outcome = {
            let mut assembler = self.assembler();
            let outcome = match work.input {
                ScoredInput::Rows(rows) => assembler.add_rows(rows, position, parked, Instant::now()),
                ScoredInput::End { run_id, step, count } => {
                    assembler.end(&run_id, step, count, parked, Instant::now())
                }
            };
            self.metrics.pending_steps.set(assembler.len() as i64);
            outcome
        };
        outcome
    }

    /// Publishes or dead-letters what [`Shared::assemble`] completed.
    async fn settle(&self, outcome: Outcome<Parked>) {
        match outcome {
            Outcome::Pending => {}
            Outcome::Complete(step) => self.publish(step).await,
            Outcome::Overfull(step) => {
                let reason = format!(
                    "step {}/{} has {} distinct rows, more than its step_end count {}",
                    step.run_id,
                    step.step,
                    step.row_count(),
                    step.expected.unwrap_or_default()
                );
                self.dead_letter_step(step, "step_overfull", &reason).await;
            }
        }
    }

    async fn publish(&self, step: PendingStep<Parked>) {
        let (run_id, step_no, duplicates) = (step.run_id.clone(), step.step, step.duplicates);
        let (rows, parked) = step.into_rows();
        let (options, device) = (self.options, self.device);
        let started = Instant::now();
        // Number crunching leaves the async workers.
        let computed = tokio::task::spawn_blocking(move || compute_step(rows, &options, device)).await;
        let result = match computed {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                let reason = format!("computing step {run_id}/{step_no}: {e}");
                return self.dead_letter_parked(parked, e.kind(), &reason).await;
            }
            Err(e) => {
                let reason = format!("computing step {run_id}/{step_no} panicked: {e}");
                return self.dead_letter_parked(parked, "compute_panic", &reason).await;
            }
        };
        let device_name = match result.ran {
            Ran::Cpu => "cpu",
            Ran::Cuda => "cuda",
            Ran::CpuFallback => "cpu_fallback",
        };
        self.metrics
            .computed(device_name, started.elapsed().as_secs_f64());
        tracing::debug!(run_id = %run_id, step = step_no, rows = result.rows.len(), device = device_name, "step computed; publishing");
        let encoded = advantages_batch(&result.rows, &result.advantages)
            .map_err(|e| e.to_string())
            .and_then(|batch| ipc::encode_stream(&[batch]).map_err(|e| e.to_string()));
        let payload = match encoded {
            Ok(p) => p,
            Err(e) => return self.dead_letter_parked(parked, "encode", &e).await,
        };
        let mut metrics = step_metrics(
            &result.rows,
            &result.advantages,
            self.success_threshold,
            &self.pass_at_k,
        );
        metrics.insert("step".into(), step_no as f64);
        metrics.insert("advantage/duplicate_rows".into(), duplicates as f64);
        let extreme = metrics.get("advantage/extreme_count").copied().unwrap_or(0.0) as u64;
        // A map of names to finite numbers always serialises.
        let metrics_json = serde_json::to_vec(&metrics).unwrap_or_default();
        let key = step_key(&run_id, step_no);
        let published = send_until_acked(
            &self.producer,
            &Outgoing {
                topic: &self.output_topic,
                key: Some(key.as_bytes()),
                payload: Some(&payload),
                headers: headers([
                    ("content-type", ARROW_STREAM_CONTENT_TYPE),
                    (DEVICE_HEADER, device_name),
                ]),
            },
        )
        .await;
        if let Err(e) = published {
            let reason = format!(
                "the advantages of step {run_id}/{step_no} ({} bytes) were rejected: {e}; raise message.max.bytes \
                 in [kafka] and max.message.bytes on {}",
                payload.len(),
                self.output_topic
            );
            self.metrics.step_dead_lettered("output_rejected");
            return self.dead_letter_parked(parked, "output_rejected", &reason).await;
        }
        // The metrics are a small JSON object: a rejection here is a broker
        // or ACL problem, reported and not worth withholding the step for.
        if let Err(e) = send_until_acked(
            &self.producer,
            &Outgoing {
                topic: &self.metrics_topic,
                key: Some(key.as_bytes()),
                payload: Some(&metrics_json),
                headers: headers([("content-type", "application/json")]),
            },
        )
        .await
        {
            tracing::error!(run_id = %run_id, step = step_no, error = %e, topic = %self.metrics_topic, "step metrics rejected");
        }
        self.metrics.steps_published.inc();
        self.metrics.rows_published.inc_by(result.rows.len() as u64);
        self.metrics.extreme_advantages.inc_by(extreme);
        tracing::info!(
            run_id = %run_id, step = step_no, rows = result.rows.len(), device = device_name,
            extreme, "advantages published"
        );
        for p in parked {
            p.done.finish();
        }
    }

    async fn dead_letter_step(&self, step: PendingStep<Parked>, kind: &'static str, reason: &str) {
        self.metrics
            .steps_dead_lettered
            .get_or_create(&vec![("reason", kind.to_string())])
            .inc();
        let (_, parked) = step.into_rows();
        self.dead_letter_parked(parked, kind, reason).await;
    }

    async fn dead_letter_parked(&self, parked: Vec<Parked>, kind: &'static str, reason: &str) {
        tracing::error!(
            kind,
            reason,
            messages = parked.len(),
            "step sent to the dead-letter topic"
        );
        for p in parked {
            self.dlq
                .send(&DeadLetter {
                    key: p.meta.key.as_deref(),
                    payload: Some(&p.payload),
                    source_topic: &p.meta.topic,
                    partition: p.meta.partition,
                    offset: p.meta.offset,
                    kind,
                    reason,
                })
                .await;
            p.done.finish();
        }
    }

    /// Dead-letters steps still incomplete after the timeout.
    async fn sweep(&self) {
        let expired = self.assembler().expired(Instant::now(), self.step_timeout);
        for step in expired {
            let reason = format!(
                "step {}/{} incomplete after {:?}: {} of {} rows",
                step.run_id,
                step.step,
                self.step_timeout,
                step.row_count(),
                step.expected
                    .map_or("an unknown number of (no step_end)".to_string(), |c| c
                        .to_string())
            );
            self.dead_letter_step(step, "step_incomplete", &reason).await;
        }
    }
}

/// A built stage 2: clients created, metrics endpoint listening.
pub struct AdvantageStage {
    config: Config,
    io: StageIo,
    shared: Arc<Shared>,
    pub metrics_addr: SocketAddr,
}

impl AdvantageStage {
    /// Creates the clients and starts the metrics endpoint.
    pub async fn build(config: Config) -> Result<Self, StageError> {
        let stage = &config.advantages;
        let metrics_socket = stage.metrics_socket()?;
        let mut registry = Registry::with_prefix("hintstream_advantages");
        let io = StageIo::build(&config, stage, &mut registry)?;
        let metrics = AdvantageMetrics::register(&mut registry);
        let metrics_addr = crate::metrics::serve(metrics_socket, Arc::new(registry)).await?;
        let n = &config.normalize;
        let shared = Arc::new(Shared {
            assembler: Mutex::new(StepAssembler::new()),
            dlq: io.dlq.clone(),
            producer: io.producer.clone(),
            output_topic: stage.output_topic.clone(),
            metrics_topic: config.topics.metrics.clone(),
            options: n.options(),
            device: n.device,
            success_threshold: n.success_threshold,
            pass_at_k: n.pass_at_k.clone(),
            step_timeout: Duration::from_secs(n.step_timeout_secs),
            metrics,
        });
        Ok(AdvantageStage {
            config,
            io,
            shared,
            metrics_addr,
        })
    }

    /// Runs until `shutdown` resolves, then drains and commits.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> RunSummary {
        let stage = &self.config.advantages;
        let sweeper_shared = self.shared.clone();
        let sweep_every =
            (self.shared.step_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweep_every);
            loop {
                tick.tick().await;
                sweeper_shared.sweep().await;
            }
        });
        let limits = self.config.decode_limits();
        let shared = self.shared.clone();
        tracing::info!(
            input = %stage.input_topic, output = %stage.output_topic, group = %stage.group_id,
            device = ?self.shared.device, cuda = crate::normalize::cuda_available(),
            "advantage stage running"
        );
        let summary = self
            .io
            .run(
                move |bytes: &[u8], meta: &RecordMeta| decode_scored(bytes, meta, limits),
                move |work: Work<ScoredInput>| {
                    // Assembly here, in message order; the slow part in a task.
                    let outcome = shared.assemble(work);
                    let shared = shared.clone();
                    async move { shared.settle(outcome).await }
                },
                shutdown,
            )
            .await;
        sweeper.abort();
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arrow_message_that_panics_the_decoder_is_rejected() {
        let bytes = include_bytes!("../../fuzz/regressions/decode_scored-arrow-slice-panic.bin");
        let meta = RecordMeta {
            topic: "rl.rollouts.scored".into(),
            partition: 0,
            offset: 0,
            key: None,
            headers: vec![(
                "content-type".into(),
                ARROW_STREAM_CONTENT_TYPE.as_bytes().to_vec(),
            )],
        };
        let Err(rejected) = decode_scored(bytes, &meta, DecodeLimits::default()) else {
            panic!("decoded");
        };
        assert_eq!(rejected.kind, "bad_arrow");
        assert!(rejected.reason.contains("malformed IPC"), "{}", rejected.reason);
    }
}
