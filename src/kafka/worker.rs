//! The consume loop both stages run (generic over [`Stage`]): take a
//! message, decode it, hand good input to the stage's handler as a
//! concurrent task (or, for a stage that asks, the messages fetched together
//! as one task, each still on its own and decoded there; or, for a
//! pipelined stage, decoded in tasks and handed on in order by one task
//! beside the loop: [`pipeline`]) and bad input to the
//! dead-letter topic (also as a task, so a slow broker never blocks intake
//! or shutdown), with bounds on messages and bytes in flight. On shutdown it stops fetching, drains
//! in-flight work up to a deadline and commits. Under exactly_once it also
//! runs the worker's transactions on their timer and rewinds after an abort
//! (see [`transaction`](super::transaction)).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use rdkafka::consumer::{Consumer, MessageStream};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::commit::Committer;
use super::consumer::{create_consumer, StageConsumer};
use super::context::{AssignmentHook, RevokeHook, StageContext};
use super::contract::{log_released, Closures, Stage, Work};
use super::dlq::DeadLetters;
use super::guarantee::{Guarantee, TransactionalProducer};
use super::handler::{first_poll, until_cancelled, work_for, Begun, MessageFuture, Panics, Within};
use super::hold::{Hold, Holds};
use super::membership::out_of_group_limit;
use super::message::{Delivery, RecordMeta, Rejected, Taken, TopicNames};
use super::partition::Partition;
use super::pipeline::{self, Gathering};
use super::settler::side_by_side;
use super::tracker::OffsetTracker;
use super::transaction::Transactions;
use crate::config::Config;
use crate::health::Lifecycle;
use crate::health::Signal;
use crate::metrics::StageMetrics;
use crate::telemetry::{self, TraceParent, TRACEPARENT_HEADER};

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Messages taken but not finished; intake waits at this bound.
    pub max_in_flight: usize,
    /// Bytes of taken, unfinished messages; intake waits at this bound.
    /// `None` for a stage that bounds its bytes itself (stage 2 evicts).
    pub max_in_flight_bytes: Option<usize>,
    /// How long shutdown (and a revoke) waits for in-flight work.
    pub drain_timeout: Duration,
}

/// How long the final commit may wait for the broker at shutdown, after the
/// drain: a stage stops within its drain timeout plus this (and a moment to
/// close), even with the broker gone.
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(2);

/// The most messages one task runs for a stage that asks
/// ([`Stage::TASK_PER_BATCH`]).
pub const MAX_BATCH: usize = 64;

/// The consumer's messages as the loop takes them: one stream for the
/// loop's life, so that a message taken does not register and drop a
/// waker slot of its own (two locks a message, as `recv` does).
type Messages<'c> = MessageStream<'c, StageContext>;

/// How long the loop, out of message slots, waits for a batch's worth of
/// them to free up together ([`Intake::refill`]) before it goes on with
/// the one it has.
const REFILL_WAIT: Duration = Duration::from_millis(2);

/// A message taken in its slot and copied out of the consumer's buffer,
/// before its bytes are held.
struct Received {
    payload: Bytes,
    meta: RecordMeta,
    slot: OwnedSemaphorePermit,
}

impl Received {
    fn with(self, bytes: Hold) -> Next {
        Next {
            payload: self.payload,
            meta: self.meta,
            holds: Holds::new(self.slot, Some(bytes)),
        }
    }

    fn without_bytes(self) -> Next {
        Next {
            payload: self.payload,
            meta: self.meta,
            holds: Holds::new(self.slot, None),
        }
    }
}

/// What became of a message being taken.
enum Admitted {
    Next(Next),
    /// `stop` resolved first.
    Stopped,
    /// A rewind was requested first: the message is dropped (the seek
    /// redelivers it).
    Rewinding,
}

/// What a run did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub received: u64,
    /// Inputs rejected by the decoder (sent to the dead-letter topic).
    pub rejected: u64,
    /// Messages unfinished when the drain ended (cut off at its deadline, or
    /// parked by the stage outside its tasks): they stay uncommitted and are
    /// redelivered.
    pub abandoned: usize,
    /// Handler tasks that panicked.
    pub panicked: u64,
    /// Why the stage stopped on its own, when it did (exit 1).
    pub failure: Option<String>,
}

/// A stage's consumer and what finishing its messages needs.
pub struct StageLoop {
    pub consumer: Arc<StageConsumer>,
    pub delivery: Delivery,
    pub options: RunOptions,
}

/// What a loop is made under: its offset tracker, its lifecycle and the
/// delivery guarantee (which, under exactly_once, holds both).
pub struct Under {
    tracker: Arc<std::sync::Mutex<OffsetTracker>>,
    lifecycle: Lifecycle,
    guarantee: Guarantee,
}

impl Under {
    /// At least once.
    pub fn at_least_once() -> Self {
        Under {
            tracker: Arc::default(),
            lifecycle: Lifecycle::new(),
            guarantee: Guarantee::AtLeastOnce,
        }
    }

    /// Exactly once over `producer`, its transactions initialised within
    /// `within` (see [`Guarantee::exactly_once`]).
    pub async fn exactly_once(producer: TransactionalProducer, within: Duration) -> Result<Self, KafkaError> {
        let Under {
            tracker, lifecycle, ..
        } = Under::at_least_once();
        let guarantee = Guarantee::exactly_once(producer, tracker.clone(), lifecycle.clone(), within).await?;
        Ok(Under {
            tracker,
            lifecycle,
            guarantee,
        })
    }
}

impl StageLoop {
    /// Creates a group consumer subscribed to `input` and a dead-letter
    /// producer for `dlq_topic`, counting into `metrics`, at least once.
    pub fn create(
        config: &Config,
        group_id: &str,
        input: &str,
        dlq_topic: &str,
        metrics: Arc<StageMetrics>,
        options: RunOptions,
    ) -> KafkaResult<Self> {
        Self::create_under(
            config,
            group_id,
            input,
            dlq_topic,
            metrics,
            options,
            Under::at_least_once(),
        )
    }

    /// [`StageLoop::create`] under `under`'s guarantee.
    pub fn create_under(
        config: &Config,
        group_id: &str,
        input: &str,
        dlq_topic: &str,
        metrics: Arc<StageMetrics>,
        options: RunOptions,
        under: Under,
    ) -> KafkaResult<Self> {
        let Under {
            tracker,
            lifecycle,
            guarantee,
        } = under;
        let context = StageContext::new(
            tracker,
            guarantee.clone(),
            metrics.clone(),
            lifecycle.clone(),
            options.drain_timeout,
            out_of_group_limit(config),
        );
        let consumer = Arc::new(create_consumer(
            config,
            group_id,
            context,
            options.max_in_flight_bytes,
        )?);
        consumer.subscribe(&[input])?;
        let dlq = DeadLetters::for_stage(config, dlq_topic, metrics.clone())?;
        let delivery = Delivery::new(Committer::new(&consumer), dlq, lifecycle, metrics, guarantee);
        Ok(StageLoop {
            consumer,
            delivery,
            options,
        })
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.delivery.lifecycle
    }

    /// Whether the consumer is in its group, for the stage's readiness.
    pub fn group_signal(&self) -> Arc<Signal> {
        self.consumer.context().group_signal()
    }

    /// Registers a hook called when partitions are revoked, before they
    /// drain (see [`RevokeHook`]).
    pub fn on_revoke(&self, hook: RevokeHook) {
        self.consumer.context().on_revoke(hook);
    }

    /// Registers a hook called after every rebalance with the whole
    /// assignment (see [`AssignmentHook`]).
    pub fn on_assignment(&self, hook: AssignmentHook) {
        self.consumer.context().on_assignment(hook);
    }

    /// Runs `stage` (see [`Stage`]) until `shutdown` resolves or the stage
    /// fails. Its [`Stage::on_revoke`] is called from a revoke hook that
    /// holds it weakly: the consumer (and its hooks) must not keep a stage's
    /// state alive, nor the parked messages in it.
    pub async fn run_stage<S>(
        self,
        stage: Arc<S>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> RunSummary
    where
        S: Stage + Send + Sync + 'static,
    {
        let weak = Arc::downgrade(&stage);
        self.on_revoke(Box::new(move |partitions| {
            let Some(stage) = weak.upgrade() else {
                return;
            };
            log_released(S::PARKS, stage.on_revoke(partitions));
        }));
        self.serve(stage, shutdown).await
    }

    /// Runs the loop with closures as a stage that parks nothing: `decode`
    /// and `handle` as [`Stage::decode`] and [`Stage::handle`].
    pub async fn run<T, D, H, F>(
        self,
        decode: D,
        handle: H,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> RunSummary
    where
        T: Send + 'static,
        D: Fn(&[u8], &RecordMeta) -> Result<T, Rejected> + Send + Sync + 'static,
        H: Fn(Work<T>) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        self.serve(Arc::new(Closures { decode, handle }), shutdown).await
    }

    /// The consume loop, then the drain and close.
    async fn serve<S: Stage>(
        self,
        stage: Arc<S>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> RunSummary {
        let StageLoop {
            consumer,
            delivery,
            options,
        } = self;
        let mut intake = Intake::new(delivery, &options);
        let panics = intake.panics.clone();
        intake.settling = intake
            .delivery
            .settler
            .start(move |panic| panics.count(panic))
            .map(AbortOnDrop);
        // Shutdown is noticed even while the loop is held in a rebalance
        // callback (a revoke drain ends at once when it begins).
        let lifecycle = intake.lifecycle.clone();
        let drain = options.drain_timeout;
        let _stop_watcher = AbortOnDrop(tokio::spawn(
            async move {
                shutdown.await;
                lifecycle.begin_shutdown(drain);
            }
            .in_current_span(),
        ));
        let _transactions = intake.delivery.guarantee.transactions().cloned().map(|t| {
            AbortOnDrop(tokio::spawn(
                run_transactions(t, Arc::downgrade(&consumer), intake.lifecycle.clone()).in_current_span(),
            ))
        });
        intake.consume(&consumer, &stage).await;
        intake.drain_and_close(consumer).await
    }
}

/// A pipelined stage's ordered task ([`pipeline::hand_on`]) and what cuts
/// it off.
struct Ordered {
    task: AbortOnDrop,
    cut_off: CancellationToken,
}

/// The intake's byte bound: permits for the bytes of taken, unfinished
/// messages (each [`Hold`] adds its bytes to the stage's in-flight bytes
/// gauge).
struct ByteBound {
    permits: Arc<Semaphore>,
    total: usize,
}

/// A message taken within the bounds, not yet dispatched.
struct Next {
    payload: Bytes,
    meta: RecordMeta,
    holds: Holds,
}

/// The running loop: its bounds, its tasks and what it counted.
struct Intake {
    /// The first field, so dropped before `tasks` (fields drop in order): a
    /// loop dropped mid-run (its caller cancelled it, or it panicked) marks
    /// the stage stopping first, and its tasks' messages are then abandoned,
    /// as a crash would leave them (uncommitted, redelivered), never
    /// rejected.
    _abandon_on_drop: AbandonOnDrop,
    tasks: JoinSet<()>,
    /// The settler's task ([`Settler`](super::settler::Settler)): outputs
    /// acknowledged off their handlers, joined after `tasks` at shutdown.
    settling: Option<AbortOnDrop>,
    /// A pipelined stage's ordered task, apart from `tasks`: at the drain's
    /// deadline it is cut off (not aborted), and then aborts and joins the
    /// handler tasks it started.
    ordered: Option<Ordered>,
    /// Every taken message holds it (see [`Taken`]).
    delivery: Arc<Delivery>,
    metrics: Arc<StageMetrics>,
    lifecycle: Lifecycle,
    drain_timeout: Duration,
    messages: Arc<Semaphore>,
    bytes: Option<ByteBound>,
    summary: RunSummary,
    /// Inputs the decoder rejected (decoded in the loop or, for a batch
    /// stage, in its tasks): [`RunSummary::rejected`] at the end.
    rejected: Arc<AtomicU64>,
    panics: Panics,
    /// A message received without waiting ([`Intake::take_ready`]) whose
    /// bytes were not free: the next [`Intake::take`] waits for them first.
    /// Never begun, so dropped (at a rewind or shutdown) it is redelivered.
    waiting: Option<Received>,
    /// Messages [`Intake::take`] took in a row without waiting.
    ready_streak: usize,
    /// How many message slots the loop, once out of them, waits for
    /// together (up to [`REFILL_WAIT`]): for a batch stage, a batch's worth
    /// (a quarter of the bound, at most [`MAX_BATCH`]), so that the messages
    /// taken next share a task; else 1. Waiting for one at a time, a loop
    /// quicker than its handlers took one message a batch, a task each
    /// (stage 1: 200,000 messages in 21,000-25,000 batches, against 6,000
    /// with room).
    refill: usize,
    /// Slots freed together and not yet taken.
    spare_slots: Option<OwnedSemaphorePermit>,
    /// The input topic's name, shared by the messages' metadata.
    topics: TopicNames,
}

impl Intake {
    fn new(delivery: Delivery, options: &RunOptions) -> Self {
        let bytes = options.max_in_flight_bytes.map(|b| {
            let total = b.min(Semaphore::MAX_PERMITS);
            ByteBound {
                permits: Arc::new(Semaphore::new(total)),
                total,
            }
        });
        let metrics = delivery.metrics.clone();
        Intake {
            _abandon_on_drop: AbandonOnDrop(delivery.lifecycle.clone()),
            tasks: JoinSet::new(),
            settling: None,
            ordered: None,
            metrics: metrics.clone(),
            lifecycle: delivery.lifecycle.clone(),
            delivery: Arc::new(delivery),
            drain_timeout: options.drain_timeout,
            messages: Arc::new(Semaphore::new(options.max_in_flight.min(Semaphore::MAX_PERMITS))),
            bytes,
            summary: RunSummary::default(),
            rejected: Arc::default(),
            panics: Panics::new(metrics.clone()),
            waiting: None,
            ready_streak: 0,
            refill: 1,
            spare_slots: None,
            topics: TopicNames::default(),
        }
    }

    /// The consume loop: takes messages within the bounds and dispatches
    /// them until the stage stops or fails.
    async fn consume<S: Stage>(&mut self, consumer: &StageConsumer, stage: &Arc<S>) {
        let (stopping, failed) = (self.lifecycle.stopping(), self.lifecycle.failed());
        let stop = async {
            tokio::select! {
                _ = stopping => {}
                _ = failed => {}
            }
        };
        tokio::pin!(stop);
        if S::TASK_PER_BATCH {
            let bound = self.messages.available_permits();
            self.refill = (bound / 4).clamp(1, MAX_BATCH);
        }
        let mut stream = consumer.stream();
        if S::PIPELINED {
            return self.pipeline(consumer, stage, &mut stream, stop.as_mut()).await;
        }
        while let Some(next) = self
            .take(consumer, &mut stream, stop.as_mut(), S::HOLDS_DECODED)
            .await
        {
            if !S::TASK_PER_BATCH {
                let begun = self.begin(next);
                self.dispatch(stage, begun);
                continue;
            }
            // The messages fetched already join this one's task. It runs
            // from the first: a message begun is in a running task before
            // the consumer is polled again, since a revoke's drain, run
            // inside that poll, waits for it.
            let batch = self.start_batch();
            let begun = self.begin(next);
            let _ = batch.send(self.prepare(stage, begun).0);
            for _ in 1..MAX_BATCH {
                let Some(next) = self.take_ready(&mut stream, S::HOLDS_DECODED) else {
                    break;
                };
                // The task ends only once this sender is dropped (it is
                // aborted only at the drain's deadline, after intake ends).
                let begun = self.begin(next);
                let _ = batch.send(self.prepare(stage, begun).0);
            }
        }
    }

    /// The consume loop of a pipelined stage ([`Stage::PIPELINED`]; see
    /// [`pipeline`]): takes the messages ready together
    /// (up to [`MAX_BATCH`] of them, and [`pipeline::BATCH_BYTES`] of
    /// payload), begins them, and sends them to the ordered task as one
    /// batch, decoded in a task of its own, or here when small. Small
    /// batches while none is on its way (one-row JSON messages) are
    /// dispatched here as any stage's are: for them, the handoff cost more
    /// than it saved. When the ordered task is [`pipeline::depth`] batches
    /// behind, the loop waits for it (for decodes that are running: bounded
    /// by them).
    async fn pipeline<S: Stage>(
        &mut self,
        consumer: &StageConsumer,
        stage: &Arc<S>,
        stream: &mut Messages<'_>,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) {
        let (batches, received) = mpsc::channel(pipeline::depth());
        let on_the_way = Arc::new(AtomicUsize::new(0));
        let cut_off = CancellationToken::new();
        let task = AbortOnDrop(tokio::spawn(
            pipeline::hand_on(
                stage.clone(),
                received,
                on_the_way.clone(),
                cut_off.clone(),
                self.panics.clone(),
                self.rejected.clone(),
            )
            .in_current_span(),
        ));
        self.ordered = Some(Ordered { task, cut_off });
        let gathering = Arc::new(Gathering::default());
        let weak = Arc::downgrade(&gathering);
        consumer
            .context()
            .on_revoke(Box::new(move |partitions| Gathering::release(&weak, partitions)));
        while let Some(next) = self.take(consumer, stream, stop.as_mut(), S::HOLDS_DECODED).await {
            // Each begun as it is taken: the stream's next poll may run a
            // revoke's drain, which must count it (see `Intake::begin`),
            // and which drops it when its partition goes (`Gathering`).
            let (mut bytes, mut taken) = (next.payload.len(), 1);
            gathering.push(self.begin(next));
            while bytes < pipeline::BATCH_BYTES && taken < MAX_BATCH {
                let Some(next) = self.take_ready(stream, S::HOLDS_DECODED) else {
                    break;
                };
                bytes += next.payload.len();
                taken += 1;
                gathering.push(self.begin(next));
            }
            let batch = gathering.take();
            if batch.is_empty() {
                continue;
            }
            let small = bytes < pipeline::TASK_BYTES;
            // Every batch sent before was handed on: this one may be here.
            if small && on_the_way.load(Ordering::Acquire) == 0 {
                for begun in batch {
                    self.dispatch(stage, begun);
                }
                continue;
            }
            let (decoded, batch_done) = oneshot::channel();
            if small {
                let _ = decoded.send(pipeline::decode(stage.as_ref(), batch, &self.panics));
            } else {
                let (stage, panics) = (stage.clone(), self.panics.clone());
                self.tasks.spawn(
                    async move {
                        // A batch the ordered task no longer waits for (it
                        // was cut off) drops its messages: abandoned.
                        let _ = decoded.send(pipeline::decode(stage.as_ref(), batch, &panics));
                    }
                    .in_current_span(),
                );
            }
            on_the_way.fetch_add(1, Ordering::AcqRel);
            if batches.send(batch_done).await.is_err() {
                self.lifecycle
                    .fail("the stage's ordered task ended while the consume loop still ran");
                return;
            }
        }
    }

    /// Reaps finished tasks, then takes the next message: waits for a
    /// message slot, the message, then its bytes (see [`Intake::hold_bytes`]).
    /// `None` once `stop` resolved. A read error is counted and logged, and
    /// the wait starts again.
    ///
    /// A message fetched already, in a free slot and with its bytes free,
    /// is taken without the wait ([`Intake::take_ready`]), up to
    /// [`MAX_BATCH`] in a row: setting up the wait's futures cost a message
    /// of one JSON row about a tenth of the loop's time. Then the wait,
    /// whose futures count against tokio's budget for the task, so the loop
    /// still yields now and then.
    async fn take(
        &mut self,
        consumer: &StageConsumer,
        stream: &mut Messages<'_>,
        mut stop: Pin<&mut impl Future<Output = ()>>,
        decoded_too: bool,
    ) -> Option<Next> {
        let transactions = self.delivery.guarantee.transactions().cloned();
        loop {
            while let Some(joined) = self.tasks.try_join_next() {
                self.panics.reap(joined);
            }
            if let Some(t) = transactions.as_ref().filter(|t| t.is_rewinding()) {
                // What was taken and not begun is dropped: the seek
                // redelivers it.
                self.waiting = None;
                self.rewind(consumer, t).await;
                continue;
            }
            if self.waiting.is_none() && self.ready_streak < MAX_BATCH {
                if let Some(next) = self.take_ready(stream, decoded_too) {
                    self.ready_streak += 1;
                    return Some(next);
                }
            }
            self.ready_streak = 0;
            // The message left waiting for its bytes first.
            let received = match self.waiting.take() {
                Some(received) => received,
                None => {
                    let slot = match self.spare_slot() {
                        Some(slot) => slot,
                        None => tokio::select! {
                            biased;
                            _ = stop.as_mut() => return None,
                            _ = rewind_requested(transactions.as_ref()) => continue,
                            // The semaphore is never closed.
                            slots = free_slots(self.messages.clone(), self.refill) => {
                                let (slot, spare) = slots?;
                                self.spare_slots = spare;
                                slot
                            }
                        },
                    };
                    let message = tokio::select! {
                        biased;
                        _ = stop.as_mut() => return None,
                        _ = rewind_requested(transactions.as_ref()) => continue,
                        message = stream.next() => match message {
                            Some(message) => message,
                            // rdkafka's stream never ends; were it to, the
                            // stage could take nothing more.
                            None => {
                                self.lifecycle.fail("the consumer's message stream ended");
                                return None;
                            }
                        },
                    };
                    match message {
                        Ok(m) => self.receive(m, slot),
                        Err(e) => {
                            self.read_failed(&e);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            };
            match self
                .hold_bytes(received, stop.as_mut(), transactions.as_ref(), decoded_too)
                .await
            {
                Admitted::Next(next) => return Some(next),
                Admitted::Stopped => return None,
                Admitted::Rewinding => continue,
            }
        }
    }

    /// The next message when it is fetched already and a message slot and
    /// its bytes are free: never waits. `None` at once otherwise, as when a
    /// rewind is due or the stage stops. A message received whose bytes are
    /// not free is kept for the next [`Intake::take`], which waits for them.
    fn take_ready(&mut self, stream: &mut Messages<'_>, decoded_too: bool) -> Option<Next> {
        let rewinding = self
            .delivery
            .guarantee
            .transactions()
            .is_some_and(|t| t.is_rewinding());
        if self.lifecycle.is_over() || rewinding {
            return None;
        }
        let slot = match self.spare_slot() {
            Some(slot) => slot,
            None => self.messages.clone().try_acquire_owned().ok()?,
        };
        // Polled once: a message fetched already, else nothing.
        let message = match stream.next().now_or_never()?? {
            Ok(m) => m,
            Err(e) => {
                self.read_failed(&e);
                return None;
            }
        };
        let received = self.receive(message, slot);
        self.try_hold_bytes(received, decoded_too)
    }

    /// A slot of those freed together ([`Intake::refill`]), if one is left.
    fn spare_slot(&mut self) -> Option<OwnedSemaphorePermit> {
        let spare = self.spare_slots.as_mut()?;
        if spare.num_permits() > 1 {
            spare.split(1)
        } else {
            self.spare_slots.take()
        }
    }

    /// Counts and logs a read error.
    fn read_failed(&self, e: &KafkaError) {
        self.metrics.read_error();
        tracing::warn!(error = %e, "kafka read error");
    }

    /// Counts a message taken in `slot` and copies it out of the consumer's
    /// buffer.
    fn receive(&mut self, message: BorrowedMessage<'_>, slot: OwnedSemaphorePermit) -> Received {
        self.summary.received += 1;
        self.metrics.received();
        let meta = RecordMeta::of(&message, &mut self.topics);
        // One copy, shared from here on: a stage may decode Arrow buffers
        // straight from it (stage 2's), and a dead letter sends it back.
        let payload = Bytes::from(message.payload().unwrap_or_default().to_vec());
        Received { payload, meta, slot }
    }

    /// The bytes a received message holds while in flight (twice its
    /// payload when `decoded_too`: see [`Stage::HOLDS_DECODED`]); a message
    /// bigger than the whole bound takes all of it. `None` without a bound.
    fn bytes_needed(&self, received: &Received, decoded_too: bool) -> Option<u32> {
        let bound = self.bytes.as_ref()?;
        let copies = if decoded_too { 2 } else { 1 };
        let need = (received.payload.len() * copies + received.meta.footprint()).min(bound.total);
        Some(u32::try_from(need).unwrap_or(u32::MAX))
    }

    /// A received message with its bytes held, waiting for them unless
    /// `stop` resolves or a rewind is requested first.
    async fn hold_bytes(
        &mut self,
        received: Received,
        mut stop: Pin<&mut impl Future<Output = ()>>,
        transactions: Option<&Transactions>,
        decoded_too: bool,
    ) -> Admitted {
        let (Some(need), Some(bound)) = (self.bytes_needed(&received, decoded_too), &self.bytes) else {
            return Admitted::Next(received.without_bytes());
        };
        let permit = tokio::select! {
            biased;
            _ = stop.as_mut() => return Admitted::Stopped,
            _ = rewind_requested(transactions) => return Admitted::Rewinding,
            // The semaphore is never closed.
            permit = bound.permits.clone().acquire_many_owned(need) => match permit {
                Ok(p) => p,
                Err(_) => return Admitted::Stopped,
            },
        };
        let hold = Hold::bytes(permit, need as usize, self.metrics.clone());
        Admitted::Next(received.with(hold))
    }

    /// [`Intake::hold_bytes`] without waiting: when its bytes are not free
    /// now, the message is kept as [`Intake::waiting`].
    fn try_hold_bytes(&mut self, received: Received, decoded_too: bool) -> Option<Next> {
        let need = self.bytes_needed(&received, decoded_too);
        let (Some(need), Some(bound)) = (need, &self.bytes) else {
            return Some(received.without_bytes());
        };
        match bound.permits.clone().try_acquire_many_owned(need) {
            Ok(permit) => {
                let hold = Hold::bytes(permit, need as usize, self.metrics.clone());
                Some(received.with(hold))
            }
            Err(_) => {
                self.waiting = Some(received);
                None
            }
        }
    }

    /// Hands one message to the stage (see [`Intake::prepare`]): its
    /// future runs as a task of its own, or, for a stage that asks
    /// ([`Stage::FIRST_POLL_IN_LOOP`]), is polled here once first and
    /// becomes a task only when it is not done.
    fn dispatch<S: Stage>(&mut self, stage: &Arc<S>, begun: Begun) {
        let (task, handled) = self.prepare(stage, begun);
        if let Some(task) = first_poll::<S>(task, handled, &self.panics) {
            self.tasks.spawn(task);
        }
    }

    /// Starts the task that runs the futures of messages taken together
    /// (see [`Stage::TASK_PER_BATCH`]), each on its own, as they are sent;
    /// it ends once the sender is dropped and every one finished. One that
    /// panics is counted and dropped (its message dead-lettered, as a
    /// task's panic does), and the others go on.
    fn start_batch(&mut self) -> mpsc::UnboundedSender<MessageFuture> {
        let (sender, received) = mpsc::unbounded_channel::<MessageFuture>();
        let panics = self.panics.clone();
        // In the stage's span, as the loop is: a panic's line names its stage.
        self.tasks
            .spawn(side_by_side(received, None, move |panic| panics.count(panic)).in_current_span());
        sender
    }

    /// Begins a message taken: takes its ticket (in message order), makes
    /// its span, within its producer's trace when it says (W3C
    /// `traceparent`) and else a new one, and its handle. A message is
    /// begun before the consumer is polled again: a revoke's drain, run
    /// inside that poll, counts and waits for the begun messages of its
    /// partitions, and resets them after (a message begun later would take
    /// a ticket of the partition's next life, and be handled as if it were
    /// still this member's).
    fn begin(&mut self, next: Next) -> Begun {
        let Next { payload, meta, holds } = next;
        let (ticket, token) = self
            .delivery
            .committer
            .begin(&meta.topic, meta.partition, meta.offset);
        let trace = meta.header(TRACEPARENT_HEADER).and_then(TraceParent::parse);
        // Its span: exported when traces are, and the context of the log
        // lines written while it is handled at debug level. Not at info: a
        // span made, entered, left and closed for every message took a third
        // of the intake's one thread on one-row messages (a step of 10,000
        // JSON rows: 25 ms of intake left after its last row, 13 without);
        // the warnings a message causes name it themselves. Without it, the
        // stage's span (the current one here) labels its lines.
        let span = if telemetry::exporting() || tracing::enabled!(tracing::Level::DEBUG) {
            tracing::info_span!(
                "consume",
                otel.kind = "consumer",
                topic = %meta.topic, partition = meta.partition, offset = meta.offset, key = %meta.key_text()
            )
        } else {
            tracing::Span::current()
        };
        telemetry::start_trace(&span, trace);
        Begun {
            taken: Taken::new(
                payload,
                meta,
                (ticket, token.clone()),
                self.delivery.clone(),
                holds,
            ),
            within: Within { token, span, trace },
        }
    }

    /// What one message becomes, within its trace: a decoded input's
    /// handler future ([`Stage::handle`]), which ends with it or when its
    /// partition drained; or, for a rejected one, its dead-lettering (also
    /// a future, so a slow broker never blocks intake or shutdown). The
    /// flag says which; for a batch stage ([`Stage::TASK_PER_BATCH`]) the
    /// future decodes first, and the flag is always set.
    fn prepare<S: Stage>(&mut self, stage: &Arc<S>, begun: Begun) -> (MessageFuture, bool) {
        if S::TASK_PER_BATCH {
            // Decoded in its batch's task, on tokio's workers: the loop's
            // one thread only takes messages (a trajectory's decoding was
            // about half of stage 1's loop, the part that runs serially).
            // The message is taken first: a decoder that panics drops it
            // unfinished, which dead-letters it (`handler_panic`), and a
            // future dropped before its first poll abandons it, as a
            // handler's would.
            let (stage, rejected) = (stage.clone(), self.rejected.clone());
            let Begun { taken, within } = begun;
            let token = within.token.clone();
            let work = async move {
                match stage.decode(taken.shared_payload(), taken.meta()) {
                    Ok(input) => {
                        let work = Box::pin(stage.handle(Work {
                            input,
                            message: taken,
                        }));
                        until_cancelled(work, token).await;
                    }
                    Err(why) => {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        // Boxed: a dead letter's future is about 2.5 KB,
                        // and inline it would size every message's.
                        Box::pin(taken.reject(why.kind, &why.reason)).await;
                    }
                }
            };
            return (within.other(work), true);
        }
        let decoded = stage.decode(begun.taken.shared_payload(), begun.taken.meta());
        work_for(stage, begun, decoded, &self.rejected)
    }

    /// Stops intake, drains in-flight work up to the drain deadline
    /// (abandoning what is left: redelivered), commits and closes the
    /// consumer.
    async fn drain_and_close(mut self, consumer: Arc<StageConsumer>) -> RunSummary {
        self.lifecycle.begin_shutdown(self.drain_timeout);
        tracing::info!(
            in_flight = self.delivery.committer.live(),
            "stopping intake; draining in-flight work"
        );
        let deadline = self.lifecycle.deadline_passed();
        let drained = tokio::select! {
            biased;
            _ = deadline => false,
            _ = self.join_all() => true,
        };
        // Unfinished now: in tasks cut off at the deadline, or parked by
        // the stage outside them (stage 2's incomplete steps).
        self.summary.abandoned = self.delivery.committer.live();
        if !drained {
            tracing::warn!(
                abandoned = self.summary.abandoned,
                "drain deadline reached; unfinished messages will be redelivered"
            );
            // The ordered task cut off before the decodes it waits for are
            // aborted: it hands nothing on past one of them.
            let ordered = self.ordered.take();
            if let Some(ordered) = &ordered {
                ordered.cut_off.cancel();
            }
            self.tasks.abort_all();
            if let Some(mut ordered) = ordered {
                self.panics.reap((&mut ordered.task.0).await);
            }
            while self.tasks.join_next().await.is_some() {}
            // What the settler holds is abandoned with it.
            if let Some(mut settling) = self.settling.take() {
                settling.0.abort();
                self.panics.reap((&mut settling.0).await);
            }
        }
        if let Some(transactions) = self.delivery.guarantee.transactions().cloned() {
            let group = consumer.group_metadata();
            let within = Instant::now() + FINAL_COMMIT_TIMEOUT;
            let commit =
                tokio::task::spawn_blocking(move || transactions.cycle(group.as_ref(), Some(within)));
            // The cycle ends by `within`; a moment more for its last call.
            match tokio::time::timeout(FINAL_COMMIT_TIMEOUT + Duration::from_secs(1), commit).await {
                Ok(Ok(cycle)) => tracing::info!(?cycle, "final transaction"),
                _ => tracing::warn!("the final transaction did not commit in time; its work is redone"),
            }
        } else if let Err(e) = self.delivery.committer.commit_sync(FINAL_COMMIT_TIMEOUT).await {
            tracing::warn!(error = %e, "final commit failed; the last stored offsets may be redelivered");
        }
        close(consumer).await;
        self.summary.failure = self.lifecycle.failure();
        self.summary.panicked = self.panics.total();
        self.summary.rejected = self.rejected.load(Ordering::Relaxed);
        std::mem::take(&mut self.summary)
    }

    /// Waits for every task, reaping each; the ordered task after them (it
    /// ends once the loop stopped sending and its handler tasks ended); the
    /// settler last, closed once no handler is left to hand it more.
    async fn join_all(&mut self) {
        while let Some(joined) = self.tasks.join_next().await {
            self.panics.reap(joined);
        }
        if let Some(ordered) = self.ordered.as_mut() {
            let joined = (&mut ordered.task.0).await;
            self.ordered = None;
            self.panics.reap(joined);
        }
        self.delivery.settler.close();
        if let Some(settling) = self.settling.as_mut() {
            let joined = (&mut settling.0).await;
            self.settling = None;
            self.panics.reap(joined);
        }
    }

    /// After an aborted transaction: resets every assigned partition (its
    /// unfinished work is cancelled, its held outputs dropped), releases the
    /// stage's parked work, and seeks back to the committed offsets. A seek
    /// that fails stops the stage (exit 1): its restart resumes from them.
    async fn rewind(&mut self, consumer: &StageConsumer, transactions: &Transactions) {
        let partitions: Vec<Partition> = consumer.assignment().map_or_else(
            |_| Vec::new(),
            |tpl| {
                tpl.elements()
                    .iter()
                    .map(|e| (Arc::from(e.topic()), e.partition()))
                    .collect()
            },
        );
        // The tracker first: what the released work drops is abandoned.
        consumer.context().reset(&partitions);
        consumer.context().release_parked(&partitions);
        let timeout = Duration::from_secs(10);
        let mut unknown = TopicPartitionList::new();
        let mut targets = Vec::new();
        for partition in &partitions {
            match transactions.committed(partition) {
                Some(next) => targets.push((partition.clone(), Offset::Offset(next))),
                None => {
                    let _ = unknown.add_partition(&partition.0, partition.1);
                }
            }
        }
        if unknown.count() > 0 {
            match blocking(|| consumer.committed_offsets(unknown.clone(), timeout)) {
                Ok(tpl) => targets.extend(tpl.elements().iter().map(|e| {
                    let offset = match e.offset() {
                        Offset::Offset(o) => Offset::Offset(o),
                        // Nothing committed yet: auto.offset.reset (earliest).
                        _ => Offset::Beginning,
                    };
                    ((Arc::from(e.topic()), e.partition()), offset)
                })),
                Err(e) => {
                    self.lifecycle.fail(format!(
                        "after an aborted transaction, the committed offsets could not be read ({e}); \
                         a restart resumes from them"
                    ));
                    return;
                }
            }
        }
        for ((topic, partition), offset) in &targets {
            if let Err(e) = blocking(|| consumer.seek(topic, *partition, *offset, timeout)) {
                self.lifecycle.fail(format!(
                    "after an aborted transaction, {topic}[{partition}] could not seek back to {offset:?} ({e}); \
                     a restart resumes from the committed offsets"
                ));
                return;
            }
        }
        tracing::info!(partitions = targets.len(), "rewound to the committed offsets");
        transactions.rewound();
    }
}

/// A free message slot, waited for; and, when the loop was out of them
/// and `refill` is over 1, up to `refill - 1` more if that many free up
/// within [`REFILL_WAIT`] (else none: those that did stay free for the
/// next take). A loop that has slots but no message fetched yet never
/// waits for more. `None` once the semaphore is closed (it never is).
async fn free_slots(
    slots: Arc<Semaphore>,
    refill: usize,
) -> Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)> {
    let out = slots.available_permits() == 0;
    let slot = slots.clone().acquire_owned().await.ok()?;
    let more = u32::try_from(refill.saturating_sub(1)).unwrap_or(u32::MAX);
    if more == 0 || !out {
        return Some((slot, None));
    }
    let spare = tokio::time::timeout(REFILL_WAIT, slots.acquire_many_owned(more)).await;
    Some((slot, spare.ok().and_then(Result::ok)))
}

/// Resolves when a rewind is requested (never at least once, without
/// transactions).
async fn rewind_requested(transactions: Option<&Transactions>) {
    match transactions {
        Some(t) => t.rewind_requested().await,
        None => std::future::pending().await,
    }
}

/// How long closing the consumer (leaving the group) may take at shutdown.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Closes the consumer (it leaves its group, so the others rebalance at
/// once) on a thread of its own, waiting at most [`CLOSE_TIMEOUT`]: a close
/// can hang when the broker is gone (rust-rdkafka #509, #611), and then the
/// group notices the member's absence at its session timeout instead.
async fn close(consumer: Arc<StageConsumer>) {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    // Its revoke callbacks log under the stage's span.
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || {
            let _entered = span.enter();
            drop(consumer);
            let _ = done_tx.send(());
        });
    if spawned.is_err() {
        tracing::warn!("cannot start a thread to close the consumer; leaving it to the process exit");
        return;
    }
    if tokio::time::timeout(CLOSE_TIMEOUT, done_rx).await.is_err() {
        tracing::warn!(
            timeout_s = CLOSE_TIMEOUT.as_secs(),
            "the consumer did not close in time; the group will notice this member left at its session timeout"
        );
    }
}

/// Runs a blocking consumer call (bounded by its own timeout) from the loop:
/// on a multi-thread runtime its worker's other tasks move off meanwhile.
fn blocking<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(call),
        _ => call(),
    }
}

/// Commits the worker's transactions every `transaction_interval_ms` until
/// the stage stops (the drain's final commit is the last).
async fn run_transactions(
    transactions: Transactions,
    consumer: std::sync::Weak<StageConsumer>,
    lifecycle: Lifecycle,
) {
    let mut tick = tokio::time::interval(transactions.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if lifecycle.is_stopping() {
            return;
        }
        let Some(group) = consumer.upgrade().and_then(|c| c.group_metadata()) else {
            continue;
        };
        let t = transactions.clone();
        if tokio::task::spawn_blocking(move || t.cycle(Some(&group), None))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sets the lifecycle stopping when dropped, so handles dropped with the
/// loop's tasks are abandoned rather than rejected.
struct AbandonOnDrop(Lifecycle);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.begin_shutdown(Duration::ZERO);
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called, not when it is first polled: a stage creates it before it starts
/// (connects, checks its topics), so a signal that comes meanwhile is kept
/// and stops the stage as soon as it runs, rather than killing the process
/// unhandled.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (term, interrupt) = (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        );
        async move {
            let received = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = received(interrupt) => tracing::info!("SIGINT received"),
                _ = received(term) => tracing::info!("SIGTERM received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("SIGINT received");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::Semaphore;

    use super::{free_slots, REFILL_WAIT};

    /// A revoke that comes while the pipelined loop gathers a batch (its
    /// drain runs inside the loop's poll) drops the gathered messages of
    /// the revoked partitions, which abandons them (none dead-lettered),
    /// and keeps the others in the order taken. On clients made for a
    /// broker that is never asked anything.
    #[tokio::test]
    async fn a_revoke_releases_the_gathered_messages_of_its_partitions_and_keeps_the_others() {
        use super::{Gathering, Intake, Next, RunOptions, StageLoop};
        use crate::kafka::hold::Holds;
        use crate::kafka::message::RecordMeta;
        use crate::metrics::StageMetrics;
        use rdkafka::consumer::Consumer;
        use std::time::Duration;

        let config = crate::config::Config {
            bootstrap_servers: "127.0.0.1:9".into(),
            ..Default::default()
        };
        let metrics = Arc::new(StageMetrics::unregistered());
        let options = RunOptions {
            max_in_flight: 16,
            max_in_flight_bytes: None,
            drain_timeout: Duration::from_secs(1),
        };
        let stage_loop = StageLoop::create(&config, "g", "in", "in.dlq", metrics.clone(), options).unwrap();
        let consumer = stage_loop.consumer.clone();
        let mut intake = Intake::new(stage_loop.delivery.clone(), &stage_loop.options);
        let slots = Arc::new(Semaphore::new(16));
        let gathering = Arc::new(Gathering::default());
        let taken = [(0, 10), (1, 20), (0, 11), (1, 21), (1, 22)];
        for (partition, offset) in taken {
            gathering.push(intake.begin(Next {
                payload: bytes::Bytes::from_static(b"x"),
                meta: RecordMeta {
                    topic: Arc::from("in"),
                    partition,
                    offset,
                    key: None,
                    headers: Vec::new(),
                },
                holds: Holds::new(slots.clone().try_acquire_owned().unwrap(), None),
            }));
        }
        // As the drain does: the partition marked revoking, then the hooks.
        consumer.context().tracker.lock().unwrap().mark_revoking("in", 0);
        Gathering::release(&Arc::downgrade(&gathering), &[(Arc::from("in"), 0)]);
        let kept: Vec<(i32, i64)> = gathering
            .take()
            .iter()
            .map(|begun| (begun.taken.meta().partition, begun.taken.meta().offset))
            .collect();
        assert_eq!(kept, [(1, 20), (1, 21), (1, 22)]);
        assert_eq!(metrics.abandoned_count(), 2, "partition 0's two, abandoned");
        assert_eq!(slots.available_permits(), 16 - 3, "their slots freed");
        // Held weakly: once the loop's gathering is gone, a revoke finds nothing.
        let weak = Arc::downgrade(&gathering);
        drop(gathering);
        Gathering::release(&weak, &[(Arc::from("in"), 1)]);
    }

    /// Frees `n` of `held` after `after` (on paused time), from a task of
    /// its own: the loop, out of slots, is waiting by then.
    fn free_later(
        held: &mut tokio::sync::OwnedSemaphorePermit,
        n: usize,
        after: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let freed = held.split(n).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            drop(freed);
        })
    }

    /// Out of slots, the loop takes the first one freed at once, and the
    /// rest of a batch's worth only when they free up within the wait;
    /// otherwise none of them, and they stay free. With slots free it
    /// never waits for more.
    #[tokio::test(start_paused = true)]
    async fn slots_are_waited_for_a_batch_at_a_time_within_the_refill_wait() {
        use std::time::Duration;
        let slots = Arc::new(Semaphore::new(8));
        let mut held = slots.clone().acquire_many_owned(8).await.unwrap();
        // Four freed together: the first, and three more.
        let freeing = free_later(&mut held, 4, Duration::ZERO);
        let (one, more) = free_slots(slots.clone(), 4).await.unwrap();
        let more = more.expect("three more, freed within the wait");
        assert_eq!((one.num_permits(), more.num_permits()), (1, 3));
        freeing.await.unwrap();
        assert_eq!(slots.available_permits(), 0);
        held.merge(one);
        held.merge(more);
        // One freed, and no more within the wait: the loop goes on with it,
        // after the wait and no longer.
        let freeing = free_later(&mut held, 1, Duration::ZERO);
        let started = tokio::time::Instant::now();
        let (one, more) = free_slots(slots.clone(), 4).await.unwrap();
        assert_eq!((one.num_permits(), more.is_none()), (1, true));
        assert_eq!(started.elapsed(), REFILL_WAIT);
        freeing.await.unwrap();
        held.merge(one);
        // One freed, two more during the wait, too few: what the wait held
        // of them is handed back.
        let first = free_later(&mut held, 1, Duration::ZERO);
        let then = free_later(&mut held, 2, REFILL_WAIT / 2);
        let (one, more) = free_slots(slots.clone(), 4).await.unwrap();
        assert_eq!((one.num_permits(), more.is_none()), (1, true));
        first.await.unwrap();
        then.await.unwrap();
        assert_eq!(
            slots.available_permits(),
            2,
            "the two freed during the wait stay free"
        );
        held.merge(one);
        held.merge(slots.clone().try_acquire_many_owned(2).unwrap());
        // A loop with slots free (no message fetched yet) takes one, and
        // waits for no more.
        drop(held.split(3).unwrap());
        let started = tokio::time::Instant::now();
        let (one, more) = free_slots(slots.clone(), 4).await.unwrap();
        assert_eq!((one.num_permits(), more.is_none()), (1, true));
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(slots.available_permits(), 2);
        held.merge(one);
        held.merge(slots.clone().try_acquire_many_owned(2).unwrap());
        // A loop that takes one at a time: two freed, one taken at once,
        // the other stays free.
        let freeing = free_later(&mut held, 2, Duration::ZERO);
        let started = tokio::time::Instant::now();
        let (one, more) = free_slots(slots.clone(), 1).await.unwrap();
        assert_eq!((one.num_permits(), more.is_none()), (1, true));
        assert_eq!(started.elapsed(), Duration::ZERO);
        freeing.await.unwrap();
        assert_eq!(slots.available_permits(), 1);
    }
}
