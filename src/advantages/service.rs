//! Stage 2's service: build (the shared stage skeleton) and run (the consume
//! loop, step assembly under a byte bound, handing complete steps to
//! [`publish`](super::publish), the timeout sweeper).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::Instrument;

use super::assemble::{Incoming, Now, PendingStep, StepAssembler, StepStatus};
use super::decode::{decode_scored_shared, ScoredInput};
use super::learning::Learning;
use super::metrics::AdvantageMetrics;
use super::publish::StepOutput;
use crate::config::Config;
use crate::kafka::admin::TopicSpec;
use crate::kafka::{Linger, Partition, RecordMeta, Rejected, RunSummary, Stage, Taken, Work};
use crate::messages::{step_key, DecodeLimits};
use crate::stage::{BoxFuture, Registered, Service, StageError, StageShell};

/// What a parked message holds beyond its bytes, its decoded rows and their
/// ids, counted against `max_in_flight_bytes` so that the bound is near the
/// memory it costs: its handle (ticket, delivery, intake holds), its entries
/// in the step's lists, the vectors of its rows, and the allocator's
/// rounding of each. Measured with `scripts/bench-step-path.sh --rows 300000
/// --formats json`: one JSON row a message took ~1.4 KB resident against
/// ~460 bytes counted without it.
const PARKED_MESSAGE_OVERHEAD: usize = 1024;

/// Stage 2's state, which the handler tasks, the sweeper and the revoke
/// share: the step assembler with the messages of pending steps, and where
/// complete steps go.
struct StepPublisher {
    assembler: Mutex<StepAssembler<Taken>>,
    output: StepOutput,
    limits: DecodeLimits,
    /// `limits.max_decoded_bytes`.
    max_decoded_bytes: usize,
    step_timeout: Duration,
    max_bytes: usize,
    /// Under exactly_once: a release (a revoke, or a rewind after an aborted
    /// transaction) also forgets which steps of those partitions completed,
    /// since their uncommitted publications are redone.
    forget_completed_on_release: bool,
}

/// What adding one message to its step led to.
struct Assembled {
    status: StepStatus<Taken>,
    /// Older incomplete steps evicted to stay under the byte bound.
    evicted: Vec<PendingStep<Taken>>,
}

impl Assembled {
    /// Whether [`StepPublisher::settle`] has anything to do: a step to
    /// publish or dead-letter, or steps evicted.
    fn settles(&self) -> bool {
        !matches!(self.status, StepStatus::Pending) || !self.evicted.is_empty()
    }
}

impl StepPublisher {
    fn assembler(&self) -> MutexGuard<'_, StepAssembler<Taken>> {
        // The assembler's maps stay consistent across a panic in a caller
        // (each method completes its change before returning).
        self.assembler.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_pending(&self, assembler: &StepAssembler<Taken>) {
        self.output
            .metrics
            .set_pending(assembler.len(), assembler.bytes());
    }

    /// Adds a message to its step. Called in message order (on the consume
    /// loop, or its ordered task: `Stage::PIPELINED`), so messages reach the
    /// assembler in partition order: a row that comes after its step's
    /// `step_end` is seen as such, never as part of it.
    ///
    /// A message whose partition was revoked or reset after it was taken
    /// (its partition's pending steps released already, or being released)
    /// is dropped, abandoned: parked, it would start a step that can never
    /// complete here. Checked under the assembler's lock, which the release
    /// takes after it marks the partition, so no message slips between.
    fn assemble(&self, work: Work<ScoredInput>) -> Assembled {
        let Work { input, message } = work;
        let position = (message.meta().partition, message.meta().offset);
        let bytes = message.footprint() + PARKED_MESSAGE_OVERHEAD;
        let mut assembler = self.assembler();
        if message.partition_revoked() {
            drop(assembler);
            drop((input, message));
            return Assembled {
                status: StepStatus::Pending,
                evicted: Vec::new(),
            };
        }
        let now = Now;
        let status = match input {
            ScoredInput::Rows(rows, keys) => {
                assembler.add_rows(Incoming::Rows(rows, keys), position, message, bytes, now)
            }
            ScoredInput::Row(row) => assembler.add_rows(Incoming::Row(row), position, message, bytes, now),
            ScoredInput::End { run_id, step, count } => {
                assembler.end(&run_id, step, count, (position.0, message, bytes), now)
            }
        };
        let evicted = assembler.evict_over(self.max_bytes);
        self.update_pending(&assembler);
        Assembled { status, evicted }
    }

    /// Publishes or dead-letters what [`StepPublisher::assemble`] completed. Steps
    /// dead-lettered because of this message (evicted, overfull, mixed) are
    /// sent by a task of their own: their messages may sit on partitions
    /// other than this message's, whose revoke must not cancel them.
    async fn settle(self: Arc<Self>, assembled: Assembled) {
        // What follows (a whole step's concatenation, compute and publish;
        // dead letters) runs as the message's task, not in the consume loop
        // that polls this future first (`FIRST_POLL_IN_LOOP`).
        tokio::task::yield_now().await;
        for mut step in assembled.evicted {
            let rows = step.distinct_rows();
            let reason = format!(
                "step {}/{} was evicted incomplete ({} rows, {} bytes) to keep pending steps under \
                 advantages.max_in_flight_bytes = {}; raise it if steps this large are expected",
                step.run_id, step.step, rows, step.bytes, self.max_bytes
            );
            self.clone().dead_letter_detached(step, "step_evicted", reason);
        }
        match assembled.status {
            StepStatus::Pending => {}
            StepStatus::Complete(step) => {
                let (span, input) = super::trace::step_span(&step);
                let publish = self.output.publish(*step).instrument(span);
                match input {
                    Some(_) => crate::telemetry::scope(input, publish).await,
                    None => publish.await,
                }
            }
            StepStatus::Overfull(step) => {
                let reason = format!(
                    "step {}/{} has {} distinct rows, more than its step_end count {}",
                    step.run_id,
                    step.step,
                    step.row_count(),
                    step.expected.unwrap_or_default()
                );
                self.clone().dead_letter_detached(*step, "step_overfull", reason);
            }
            StepStatus::MixedPartitions(step) => {
                let reason = format!(
                    "the messages of step {}/{} came from more than one partition: produce every row and the \
                     step_end of a step with the key run_id/step (`{}`), so that one worker gathers it",
                    step.run_id,
                    step.step,
                    step_key(&step.run_id, step.step)
                );
                self.clone()
                    .dead_letter_detached(*step, "mixed_partitions", reason);
            }
            StepStatus::AlreadyPublished(late) => {
                // Acknowledged at once: it must not hold the partition's
                // commits. Only the first of a step goes to the DLQ.
                self.output.metrics.already_published(late.rows);
                if late.first {
                    let reason = format!(
                        "step {}/{} was complete already (and published, or dead-lettered whole); this \
                         message ({} rows) came after it. Later messages of the step are dropped without a \
                         dead letter and counted in hintstream_advantages_rows_already_published_total",
                        late.run_id, late.step, late.rows
                    );
                    late.parked.reject("step_already_published", &reason).await;
                } else {
                    late.parked.ack();
                }
            }
        }
    }

    /// Dead-letters a step from a task of its own.
    fn dead_letter_detached(self: Arc<Self>, step: PendingStep<Taken>, kind: &'static str, reason: String) {
        tokio::spawn(
            async move { self.output.dead_letter_step(step, kind, &reason).await }.in_current_span(),
        );
    }

    /// Dead-letters steps still incomplete after the timeout.
    async fn sweep(&self) {
        let expired = {
            let mut assembler = self.assembler();
            let expired = assembler.expired(Instant::now(), self.step_timeout);
            self.update_pending(&assembler);
            expired
        };
        for mut step in expired {
            let rows = step.distinct_rows();
            let reason = format!(
                "step {}/{} incomplete after {:?}: {} of {} rows",
                step.run_id,
                step.step,
                self.step_timeout,
                rows,
                step.expected
                    .map_or("an unknown number of (no step_end)".to_string(), |c| c
                        .to_string())
            );
            self.output
                .dead_letter_step(step, "step_incomplete", &reason)
                .await;
        }
    }
}

impl Stage for StepPublisher {
    type Input = ScoredInput;
    const PARKS: &'static str = "pending steps";
    // Most messages only join their step: the handler's future is then done at once.
    const FIRST_POLL_IN_LOOP: bool = true;
    // A step's Arrow messages decoded side by side, and their rows assembled
    // beside the consume loop, not on its one thread.
    const PIPELINED: bool = true;

    fn decode(&self, payload: &Bytes, meta: &RecordMeta) -> Result<ScoredInput, Rejected> {
        decode_scored_shared(payload, meta, self.limits, self.max_decoded_bytes)
    }

    fn handle(self: &Arc<Self>, work: Work<ScoredInput>) -> impl Future<Output = ()> + Send + 'static {
        // Assembly here, in message order; the slow part in a task.
        let assembled = self.assemble(work);
        // Most messages only join their step: then no room is made for a
        // step's publishing. Inline, that future made every row's future
        // kilobytes, allocated and copied into its box a row.
        let settle = assembled
            .settles()
            .then(|| Box::pin(self.clone().settle(assembled)));
        async move {
            if let Some(settle) = settle {
                settle.await;
            }
        }
    }

    /// A revoked partition's pending steps can never complete here: let
    /// them go (uncommitted; the new owner gathers them again).
    fn on_revoke(&self, partitions: &[Partition]) -> usize {
        let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let released = {
            let mut assembler = self.assembler();
            let released = assembler.release(&numbers);
            if self.forget_completed_on_release {
                assembler.forget_completed(&numbers);
            }
            self.update_pending(&assembler);
            released
        };
        // Its messages are dropped (abandoned) on return, outside the lock.
        released.len()
    }
}

/// A built stage 2: topics checked, clients created, metrics endpoint
/// listening.
pub struct AdvantageStage {
    config: Config,
    shell: StageShell,
    publisher: Arc<StepPublisher>,
    pub metrics_addr: SocketAddr,
}

impl AdvantageStage {
    /// Checks the cluster and topics (the outcomes and hints topics as
    /// [`super::learning`] says), creates the clients, starts the hints tail
    /// and the metrics endpoint.
    pub async fn build(config: Config) -> Result<Self, StageError> {
        let stage = &config.advantages;
        let mut shell = StageShell::build(
            &config,
            stage,
            "hintstream_advantages",
            &[config.topics.metrics.as_str()],
            false,
            // A step's chunks each fill a request, and its outcomes and
            // metrics wait for them: lingering would mostly delay them.
            Linger::Off,
        )
        .await?;
        let learning = Learning::start(&config).await?;
        let metrics = AdvantageMetrics::register(&mut shell.registry);
        let metrics_addr = shell.serve_metrics().await?;
        let publisher = Arc::new(StepPublisher {
            assembler: Mutex::new(StepAssembler::new()),
            output: StepOutput {
                producer: shell.producer.clone(),
                lifecycle: shell.lifecycle(),
                output_topic: stage.output_topic.clone(),
                metrics_topic: config.topics.metrics.clone(),
                options: config.normalize.options(),
                hinted_weight: config.normalize.hinted_weight,
                device: config.normalize.device,
                stage: stage.clone(),
                metrics,
                learning,
            },
            limits: config.decode_limits(),
            max_decoded_bytes: config.limits.max_decoded_bytes,
            step_timeout: Duration::from_secs(stage.step_timeout_secs),
            max_bytes: stage.max_in_flight_bytes(),
            forget_completed_on_release: config.kafka.exactly_once(),
        });
        Ok(AdvantageStage {
            config,
            shell,
            publisher,
            metrics_addr,
        })
    }

    /// Runs until `shutdown` resolves (or the stage fails: see
    /// `RunSummary::failure`), then drains and commits.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> RunSummary {
        let stage = &self.config.advantages;
        let sweeping = self.publisher.clone();
        let sweep_every =
            (self.publisher.step_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let sweeper = tokio::spawn(
            async move {
                let mut tick = tokio::time::interval(sweep_every);
                loop {
                    tick.tick().await;
                    sweeping.sweep().await;
                }
            }
            .in_current_span(),
        );
        tracing::info!(
            input = %stage.input_topic, output = %stage.output_topic, group = %stage.group_id,
            device = ?self.publisher.output.device, cuda = crate::normalize::cuda_available(),
            "advantage stage running"
        );
        let summary = self.shell.run(self.publisher, shutdown).await;
        sweeper.abort();
        summary
    }
}

impl Service for AdvantageStage {
    fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    fn run(self: Box<Self>, shutdown: BoxFuture<()>) -> BoxFuture<RunSummary> {
        Box::pin(AdvantageStage::run(*self, shutdown))
    }
}

/// The topics stage 2 reads and writes, as `topics create` makes them: the
/// scored rollouts, the advantages, the step metrics, its dead-letter
/// topic, and (hints that learn) the outcomes it publishes and the hints
/// it reads for the per-arm metrics.
pub fn topics(config: &Config) -> Vec<TopicSpec> {
    let t = &config.topics;
    vec![
        TopicSpec::plain(&t.scored),
        TopicSpec::plain(&t.advantages),
        TopicSpec::plain(&t.metrics),
        TopicSpec::dead_letters(config, &config.advantages.dlq_topic),
        TopicSpec::outcomes(&t.outcomes),
        TopicSpec::plain(&t.hints),
    ]
}

/// Stage 2 as the registry of stages lists it.
pub const REGISTERED: Registered = Registered {
    name: "advantages",
    topics,
    build: |config| {
        Box::pin(async move {
            let stage = AdvantageStage::build(config).await?;
            Ok(Box::new(stage) as Box<dyn Service>)
        })
    },
    quickstart_workers: 1,
};
