//! Stage 2's service: build (the shared stage skeleton) and run (the consume
//! loop, step assembly under a byte bound, computing and publishing, the
//! timeout sweeper).
//!
//! A step's advantages go out as one or more Arrow IPC messages of at most
//! `advantages.max_message_bytes` (`batch::chunk`), all with the key
//! `run_id/step`, sent one after another, each acknowledged before the
//! next; the step's metrics follow the last. Its input messages are
//! acknowledged only then: a worker that dies or stops mid-step leaves them
//! uncommitted, and the step is published whole again.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::assemble::{Outcome, PendingStep, StepAssembler};
use super::compute::{advantages_batch, compute_step};
use super::decode::{decode_scored, ScoredInput};
use super::metrics::AdvantageMetrics;
use super::step_metrics::step_metrics;
use crate::batch::chunk::{chunk_header_values, encode_chunks, CHUNKS_HEADER, CHUNK_HEADER, ROWS_HEADER};
use crate::batch::ARROW_STREAM_CONTENT_TYPE;
use crate::config::Config;
use crate::health::Lifecycle;
use crate::kafka::produce::headers;
use crate::kafka::StageProducer;
use crate::kafka::{send, Outgoing, RecordMeta, RunSummary, SendError, Taken, Work};
use crate::messages::step_key;
use crate::normalize::{AdvantageOptions, Device, Ran};
use crate::stage::{StageError, StageShell};

/// Header that says which kernel computed a published step.
pub const DEVICE_HEADER: &str = "hintstream.device";

/// At most the first 64 characters of an id, for a reason text (dead-letter
/// reasons are cut at 1 KiB: a huge id must not push the advice out).
fn shortened(id: &str) -> String {
    const SHOWN: usize = 64;
    match id.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}… ({} bytes)", &id[..at], id.len()),
        None => id.to_string(),
    }
}

/// Bytes of an advantages message besides its Arrow payload: the key, the
/// headers (chunk numbers at their longest) and the record's framing, which
/// librdkafka counts against `message.max.bytes` too (about 40 bytes; a
/// margin on top).
fn envelope_bytes(key: &str, device: &str) -> usize {
    const RECORD_FRAMING: usize = 512;
    const HEADER_FRAMING: usize = 10;
    const DECIMAL_DIGITS: usize = 20;
    let fixed = [
        ("content-type".len(), ARROW_STREAM_CONTENT_TYPE.len()),
        (DEVICE_HEADER.len(), device.len()),
        (CHUNK_HEADER.len(), DECIMAL_DIGITS),
        (CHUNKS_HEADER.len(), DECIMAL_DIGITS),
        (ROWS_HEADER.len(), DECIMAL_DIGITS),
    ];
    key.len() + RECORD_FRAMING + fixed.iter().map(|(k, v)| k + v + HEADER_FRAMING).sum::<usize>()
}

/// What a parked message holds beyond its bytes, its decoded rows and their
/// ids, counted against `max_in_flight_bytes` so that the bound is near the
/// memory it costs: its handle (ticket, delivery, intake holds), its entries
/// in the step's lists, the vectors of its rows, and the allocator's
/// rounding of each. Measured with `scripts/bench-step-path.sh --rows 300000
/// --formats json`: one JSON row a message took ~1.4 KB resident against
/// ~460 bytes counted without it.
const PARKED_MESSAGE_OVERHEAD: usize = 1024;

/// What the handler tasks, the sweeper and the revoke hook share.
struct Shared {
    assembler: Mutex<StepAssembler<Taken>>,
    producer: StageProducer,
    lifecycle: Lifecycle,
    output_topic: String,
    metrics_topic: String,
    options: AdvantageOptions,
    device: Device,
    stage: crate::config::AdvantagesConfig,
    step_timeout: Duration,
    max_bytes: usize,
    metrics: AdvantageMetrics,
}

/// What adding one message to its step led to.
struct Assembled {
    outcome: Outcome<Taken>,
    /// Older incomplete steps evicted to stay under the byte bound.
    evicted: Vec<PendingStep<Taken>>,
}

impl Shared {
    fn assembler(&self) -> MutexGuard<'_, StepAssembler<Taken>> {
        // The assembler's maps stay consistent across a panic in a caller
        // (each method completes its change before returning).
        self.assembler.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_pending(&self, assembler: &StepAssembler<Taken>) {
        self.metrics.set_pending(assembler.len(), assembler.bytes());
    }

    /// Adds a message to its step. Called synchronously by the consume loop,
    /// so messages reach the assembler in partition order: a row that comes
    /// after its step's `step_end` is seen as such, never as part of it.
    fn assemble(&self, work: Work<ScoredInput>) -> Assembled {
        let Work { input, message } = work;
        let position = (message.meta().partition, message.meta().offset);
        let bytes = message.footprint() + PARKED_MESSAGE_OVERHEAD;
        let mut assembler = self.assembler();
        let now = Instant::now();
        let outcome = match input {
            ScoredInput::Rows(rows) => assembler.add_rows(rows, position, message, bytes, now),
            ScoredInput::End { run_id, step, count } => {
                assembler.end(&run_id, step, count, (position.0, message, bytes), now)
            }
        };
        let evicted = assembler.evict_over(self.max_bytes);
        self.update_pending(&assembler);
        Assembled { outcome, evicted }
    }

    /// Publishes or dead-letters what [`Shared::assemble`] completed. Steps
    /// dead-lettered because of this message (evicted, overfull, mixed) are
    /// sent by a task of their own: their messages may sit on partitions
    /// other than this message's, whose revoke must not cancel them.
    async fn settle(self: Arc<Self>, assembled: Assembled) {
        for step in assembled.evicted {
            let reason = format!(
                "step {}/{} was evicted incomplete ({} rows, {} bytes) to keep pending steps under \
                 advantages.max_in_flight_bytes = {}; raise it if steps this large are expected",
                step.run_id,
                step.step,
                step.row_count(),
                step.bytes,
                self.max_bytes
            );
            self.clone().dead_letter_detached(step, "step_evicted", reason);
        }
        match assembled.outcome {
            Outcome::Pending => {}
            Outcome::Complete(step) => {
                let (span, input) = super::trace::step_span(&step);
                let publish = self.publish(step).instrument(span);
                match input {
                    Some(_) => crate::telemetry::scope(input, publish).await,
                    None => publish.await,
                }
            }
            Outcome::Overfull(step) => {
                let reason = format!(
                    "step {}/{} has {} distinct rows, more than its step_end count {}",
                    step.run_id,
                    step.step,
                    step.row_count(),
                    step.expected.unwrap_or_default()
                );
                self.clone().dead_letter_detached(step, "step_overfull", reason);
            }
            Outcome::MixedPartitions(step) => {
                let reason = format!(
                    "the messages of step {}/{} came from more than one partition: produce every row and the \
                     step_end of a step with the key run_id/step (`{}`), so that one worker gathers it",
                    step.run_id,
                    step.step,
                    step_key(&step.run_id, step.step)
                );
                self.clone()
                    .dead_letter_detached(step, "mixed_partitions", reason);
            }
        }
    }

    /// Dead-letters a step from a task of its own.
    fn dead_letter_detached(self: Arc<Self>, step: PendingStep<Taken>, kind: &'static str, reason: String) {
        tokio::spawn(async move { self.dead_letter_step(step, kind, &reason).await }.in_current_span());
    }

    async fn publish(&self, step: PendingStep<Taken>) {
        let (run_id, step_no, duplicates) = (step.run_id.clone(), step.step, step.duplicates);
        let (rows, parked) = step.into_rows();
        let (options, device) = (self.options, self.device);
        let started = Instant::now();
        // Number crunching leaves the async workers.
        let span = tracing::info_span!("compute");
        let computed =
            tokio::task::spawn_blocking(move || span.in_scope(|| compute_step(rows, &options, device))).await;
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
        let device_name = result.ran.as_str();
        if result.ran == Ran::CpuFallback {
            self.metrics.cuda_fell_back();
        }
        self.metrics
            .computed(device_name, started.elapsed().as_secs_f64());
        tracing::debug!(run_id = %run_id, step = step_no, rows = result.rows.len(), device = device_name, "step computed; publishing");
        let key = step_key(&run_id, step_no);
        let payload_bytes = self
            .stage
            .max_message_bytes
            .saturating_sub(envelope_bytes(&key, device_name));
        let stage = self.stage.clone();
        // Encoding a large step takes as long as computing it: off the async
        // workers too.
        let prepared = tokio::task::spawn_blocking(move || {
            let chunks = advantages_batch(&result.rows, &result.advantages)
                .map_err(|e| e.to_string())
                .and_then(|batch| encode_chunks(&batch, payload_bytes).map_err(|e| e.to_string()));
            let mut metrics = step_metrics(&result.rows, &result.advantages, &stage.metric_options());
            metrics.insert("step".into(), step_no as f64);
            metrics.insert("advantage/duplicate_rows".into(), duplicates as f64);
            (result, chunks, metrics)
        })
        .await;
        let (result, chunks, metrics) = match prepared {
            Ok((result, Ok(chunks), metrics)) => (result, chunks, metrics),
            Ok((_, Err(e), _)) => return self.dead_letter_parked(parked, "encode", &e).await,
            Err(e) => {
                let reason = format!("encoding step {run_id}/{step_no} panicked: {e}");
                return self.dead_letter_parked(parked, "compute_panic", &reason).await;
            }
        };
        if let Some(big) = chunks.oversized() {
            let row = big.rows.start;
            let reason = format!(
                "row {row} (trajectory_id {:?}) of step {run_id}/{step_no} alone takes {} bytes of Arrow, more than \
                 the {payload_bytes} bytes a message of advantages.max_message_bytes = {} leaves for it: raise \
                 advantages.max_message_bytes (and message.max.bytes in [kafka] and max.message.bytes on {})",
                shortened(result.rows.trajectory_id.get(row).map_or("", String::as_str)),
                big.payload.len(),
                self.stage.max_message_bytes,
                self.output_topic
            );
            return self.dead_letter_parked(parked, "output_rejected", &reason).await;
        }
        let extreme = metrics.get("advantage/extreme_count").copied().unwrap_or(0.0) as u64;
        // A map of names to finite numbers always serialises.
        let metrics_json = serde_json::to_vec(&metrics).unwrap_or_default();
        // The chunks one after another, each acknowledged before the next, so
        // that they sit in order on the key's partition; the metrics only
        // after the last.
        let count = chunks.len();
        let rows = result.rows.len();
        for (index, chunk) in chunks.chunks.iter().enumerate() {
            let chunk_headers = chunk_header_values(index, count, rows);
            let published = send(
                &self.producer,
                &Outgoing {
                    topic: &self.output_topic,
                    key: Some(key.as_bytes()),
                    payload: Some(&chunk.payload),
                    headers: headers(
                        [
                            ("content-type", ARROW_STREAM_CONTENT_TYPE),
                            (DEVICE_HEADER, device_name),
                        ]
                        .into_iter()
                        .chain(chunk_headers.iter().map(|(name, value)| (*name, value.as_str()))),
                    ),
                },
                &self.lifecycle,
            )
            .await;
            match published {
                Ok(_) => self.metrics.chunk_published(),
                Err(SendError::Permanent(e)) => {
                    let reason = format!(
                        "the advantages of step {run_id}/{step_no} (chunk {index} of {count}, {} bytes) were \
                         rejected: {e}; raise message.max.bytes in [kafka] and max.message.bytes on {}, or lower \
                         advantages.max_message_bytes",
                        chunk.payload.len(),
                        self.output_topic
                    );
                    return self.dead_letter_parked(parked, "output_rejected", &reason).await;
                }
                // Shutdown's deadline passed: the step stays uncommitted and
                // is published whole again after a restart.
                Err(SendError::Stopped) => {
                    tracing::info!(
                        run_id = %run_id, step = step_no, published = index, chunks = count,
                        "drain deadline passed mid-step; the step stays uncommitted"
                    );
                    return;
                }
            }
        }
        // The metrics are a small JSON object: a rejection here is a broker
        // or ACL problem, reported and not worth withholding the step for.
        match send(
            &self.producer,
            &Outgoing {
                topic: &self.metrics_topic,
                key: Some(key.as_bytes()),
                payload: Some(&metrics_json),
                headers: headers([("content-type", "application/json")]),
            },
            &self.lifecycle,
        )
        .await
        {
            Ok(_) => {}
            Err(SendError::Permanent(e)) => {
                tracing::error!(run_id = %run_id, step = step_no, error = %e, topic = %self.metrics_topic, "step metrics rejected")
            }
            Err(SendError::Stopped) => return,
        }
        self.metrics.step_published(rows, extreme);
        tracing::info!(
            run_id = %run_id, step = step_no, rows, chunks = count, device = device_name,
            extreme, "advantages published"
        );
        for p in parked {
            p.ack();
        }
    }

    async fn dead_letter_step(&self, step: PendingStep<Taken>, kind: &'static str, reason: &str) {
        let (_, parked) = step.into_rows();
        self.dead_letter_parked(parked, kind, reason).await;
    }

    /// Dead-letters a step's messages, all sends at once, and counts the
    /// step once they are done.
    async fn dead_letter_parked(&self, parked: Vec<Taken>, kind: &'static str, reason: &str) {
        tracing::error!(
            kind,
            reason,
            messages = parked.len(),
            "step sent to the dead-letter topic"
        );
        futures::future::join_all(parked.into_iter().map(|p| p.reject(kind, reason))).await;
        self.metrics.step_dead_lettered(kind);
    }

    /// Dead-letters steps still incomplete after the timeout.
    async fn sweep(&self) {
        let expired = {
            let mut assembler = self.assembler();
            let expired = assembler.expired(Instant::now(), self.step_timeout);
            self.update_pending(&assembler);
            expired
        };
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

/// A built stage 2: topics checked, clients created, metrics endpoint
/// listening.
pub struct AdvantageStage {
    config: Config,
    shell: StageShell,
    shared: Arc<Shared>,
    pub metrics_addr: SocketAddr,
}

impl AdvantageStage {
    /// Checks the cluster and topics, creates the clients and starts the
    /// metrics endpoint.
    pub async fn build(config: Config) -> Result<Self, StageError> {
        let stage = &config.advantages;
        let mut shell = StageShell::build(
            &config,
            stage,
            "hintstream_advantages",
            &[config.topics.metrics.as_str()],
            false,
        )
        .await?;
        let metrics = AdvantageMetrics::register(&mut shell.registry);
        let metrics_addr = shell.serve_metrics().await?;
        let shared = Arc::new(Shared {
            assembler: Mutex::new(StepAssembler::new()),
            producer: shell.producer.clone(),
            lifecycle: shell.lifecycle(),
            output_topic: stage.output_topic.clone(),
            metrics_topic: config.topics.metrics.clone(),
            options: config.normalize.options(),
            device: config.normalize.device,
            stage: stage.clone(),
            step_timeout: Duration::from_secs(stage.step_timeout_secs),
            max_bytes: stage.max_in_flight_bytes(),
            metrics,
        });
        // A revoked partition's pending steps can never complete here: let
        // them go (uncommitted; the new owner gathers them again).
        let hook_shared = Arc::downgrade(&shared);
        shell.on_revoke(Box::new(move |partitions| {
            let Some(shared) = hook_shared.upgrade() else {
                return;
            };
            let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
            let released = {
                let mut assembler = shared.assembler();
                let released = assembler.release(&numbers);
                shared.update_pending(&assembler);
                released
            };
            if !released.is_empty() {
                tracing::info!(
                    steps = released.len(),
                    "pending steps of revoked partitions released"
                );
            }
        }));
        Ok(AdvantageStage {
            config,
            shell,
            shared,
            metrics_addr,
        })
    }

    /// Runs until `shutdown` resolves (or the stage fails: see
    /// `RunSummary::failure`), then drains and commits.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> RunSummary {
        let stage = &self.config.advantages;
        let sweeper_shared = self.shared.clone();
        let sweep_every =
            (self.shared.step_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let sweeper = tokio::spawn(
            async move {
                let mut tick = tokio::time::interval(sweep_every);
                loop {
                    tick.tick().await;
                    sweeper_shared.sweep().await;
                }
            }
            .in_current_span(),
        );
        let limits = self.config.decode_limits();
        let shared = self.shared.clone();
        tracing::info!(
            input = %stage.input_topic, output = %stage.output_topic, group = %stage.group_id,
            device = ?self.shared.device, cuda = crate::normalize::cuda_available(),
            "advantage stage running"
        );
        let summary = self
            .shell
            .run(
                move |bytes: &[u8], meta: &RecordMeta| decode_scored(bytes, meta, limits),
                move |work: Work<ScoredInput>| {
                    // Assembly here, in message order; the slow part in a task.
                    let assembled = shared.assemble(work);
                    shared.clone().settle(assembled)
                },
                shutdown,
            )
            .await;
        sweeper.abort();
        summary
    }
}
