//! Exactly-once delivery (`kafka.delivery = "exactly_once"`): one open
//! transaction per worker, committed every `kafka.transaction_interval_ms`,
//! carrying the stage's outputs, its dead letters and the input offsets
//! they came from (`send_offsets_to_transaction` with the consumer's group
//! metadata). A `read_committed` reader then sees each output once.
//!
//! An output is *held* until its partition's contiguous finished offset
//! has passed every one of its inputs; only then does it join a
//! transaction, together with that committable offset. No committed offset
//! can therefore pass an input whose output is not in the same or an
//! earlier transaction, and no output is committed whose inputs are not.
//!
//! The order that makes this hold: a stage registers an output
//! ([`Settlement::send`](super::Settlement::send)) before it acknowledges the output's inputs; a cycle
//! reads the committable offsets and picks the ready outputs under the
//! tracker's lock, so an input below a committable offset it reads has its
//! outputs registered already.
//!
//! Bounded memory: a finished input keeps its intake holds (its message
//! slot and bytes) until a commit passed it, so held outputs and the
//! uncommitted window count in the stage's in-flight bounds.
//!
//! How a transaction ends (every call bounded; a commit that timed out is
//! called again, never followed by an abort) is [`ending`](super::ending)'s;
//! which held outputs join it is [`held`](super::held)'s.
//!
//! An abort (a failed produce, offsets send or commit) rewinds: every
//! assigned partition's unfinished and uncommitted work is reset, the
//! stage's parked work released, and the consumer seeks back to the
//! committed offsets (done by the consume loop, between two messages). A
//! fatal error (fenced by a newer instance with the same
//! `transactional.id`) stops the stage with exit 1. The LLM call stays
//! at-least-once: the hint cache makes a repeat free.
//!
//! Limits: a record the broker refuses for good (too large for its topic,
//! no write ACL) aborts the transaction and stops the stage (exit 1) naming
//! the topic: under at_least_once it would be dead-lettered instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::ending::{sort, Calls, End, Ending, Sorted, Step};
use super::held::{select, Held, Inputs, Record};
use super::hold::Holds;
use super::partition::Partition;
use super::produce::{is_permanent, Outgoing};
use super::producers::StageProducer;
use super::tracker::{lock, OffsetTracker, Ticket};
use crate::health::Lifecycle;
use crate::metrics::StageMetrics;
use crate::telemetry;

/// How long one produce may wait for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(10);

/// The share of a bounded cycle's time left to its end (commit or abort):
/// the calls before it (the produces, the offsets sent) stop when the
/// last quarter of the time left at the transaction's begin is reached.
/// A produce that waited the whole bound for room in a full queue left
/// its abort no time: the abort stayed pending until the next cycle, and
/// at shutdown the producer closed with the transaction open, which held
/// `read_committed` readers back until the broker aborted it at the
/// transaction's timeout (`kafka.transaction_timeout_ms`).
const END_SHARE: u32 = 4;

#[derive(Default)]
struct State {
    /// In registration order (a step's chunks stay in order).
    held: Vec<Held>,
    /// The intake holds of finished inputs, by partition and offset, kept
    /// until a commit passes them.
    holds: HashMap<Partition, BTreeMap<i64, Holds>>,
    /// The offsets committed by this worker, by partition (the next offset
    /// to consume).
    committed: HashMap<Partition, i64>,
    /// An abort happened: no cycle commits until the loop rewound.
    rewinding: bool,
    /// Partition resets so far (see [`End::Commit`]'s `resets`).
    resets: u64,
}

/// What one cycle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cycle {
    /// Nothing to commit (or a rewind is pending, or the caller's bound
    /// passed before one could begin).
    Idle,
    /// A commit or abort still in progress at the caller's bound: the next
    /// cycle resumes it.
    Pending,
    /// Committed this many outputs and this many partitions' offsets.
    Committed { outputs: usize, partitions: usize },
    /// Aborted: the loop rewinds.
    Aborted,
    /// A fatal error: the stage stops.
    Fatal,
}

struct Inner {
    producer: StageProducer,
    tracker: Arc<Mutex<OffsetTracker>>,
    state: Mutex<State>,
    /// One cycle at a time (the timer's, a revoke's, shutdown's), with the
    /// commit or abort a cycle left in progress at its caller's bound.
    cycling: Mutex<Option<Ending>>,
    rewind: Notify,
    interval: Duration,
    /// The bound of each transaction call (`kafka.transaction_timeout_ms`).
    call_timeout: Duration,
    transactional_id: String,
    lifecycle: Lifecycle,
    metrics: Arc<StageMetrics>,
}

/// A worker's transactions; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Transactions(Arc<Inner>);

impl Transactions {
    /// Initialises `producer`'s transactions (fencing an older instance of
    /// the same `transactional.id` and aborting what it left open), within
    /// `within`. Blocking: call it on the blocking pool.
    #[allow(clippy::too_many_arguments)]
    pub fn init(
        producer: StageProducer,
        tracker: Arc<Mutex<OffsetTracker>>,
        lifecycle: Lifecycle,
        metrics: Arc<StageMetrics>,
        transactional_id: String,
        interval: Duration,
        call_timeout: Duration,
        within: Duration,
    ) -> Result<Self, KafkaError> {
        producer.init_transactions(within)?;
        tracing::info!(transactional_id = %transactional_id, "exactly-once delivery: transactions initialised");
        Ok(Transactions(Arc::new(Inner {
            producer,
            tracker,
            state: Mutex::new(State::default()),
            cycling: Mutex::new(None),
            rewind: Notify::new(),
            interval,
            call_timeout,
            transactional_id,
            lifecycle,
            metrics,
        })))
    }

    pub fn interval(&self) -> Duration {
        self.0.interval
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every method completes its change of the state before it returns.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `record` until the committable offset passed all of `inputs`.
    /// An output of a reset partition's input is dropped (it is redone).
    pub(crate) fn register(&self, record: Outgoing<'_>, inputs: Inputs) {
        // The record carries the trace of the span registering it.
        let headers = telemetry::with_traceparent(record.headers, &tracing::Span::current());
        self.hold(Held {
            record: Some(Record {
                topic: record.topic.to_string(),
                key: record.key.map(<[u8]>::to_vec),
                payload: record.payload.map(<[u8]>::to_vec),
                headers,
            }),
            inputs,
        });
    }

    /// Binds inputs that finish together without an output (a group not
    /// hinted): no commit passes some of them but not the others.
    pub(crate) fn bind(&self, inputs: Inputs) {
        if inputs.len() > 1 {
            self.hold(Held { record: None, inputs });
        }
    }

    fn hold(&self, held: Held) {
        let tracker = lock(&self.0.tracker);
        if !held.inputs.lives().iter().all(|t| tracker.is_current(t)) {
            return;
        }
        self.state().held.push(held);
    }

    /// Keeps a finished input's intake holds until a commit passes it.
    pub(crate) fn keep(&self, ticket: &Ticket, holds: Holds) {
        let tracker = lock(&self.0.tracker);
        if !tracker.is_current(ticket) {
            return;
        }
        self.state()
            .holds
            .entry((ticket.topic.clone(), ticket.partition))
            .or_default()
            .insert(ticket.offset, holds);
    }

    /// Forgets reset partitions (revoked, re-assigned, rewound): their held
    /// outputs and holds go, and their committed offsets are asked of the
    /// broker again.
    pub(crate) fn forget(&self, partitions: &[Partition]) {
        let mut state = self.state();
        state.held.retain(|h| {
            !h.inputs
                .lives()
                .iter()
                .any(|t| partitions.contains(&(t.topic.clone(), t.partition)))
        });
        for partition in partitions {
            state.holds.remove(partition);
            state.committed.remove(partition);
        }
        state.resets += 1;
    }

    /// Outputs held now (for tests and logs).
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// The input tickets the held outputs hold, a list shared by several
    /// outputs counted once (for tests and logs).
    pub fn held_inputs(&self) -> usize {
        let state = self.state();
        let mut seen = std::collections::HashSet::new();
        state
            .held
            .iter()
            .filter(|h| seen.insert(h.inputs.id()))
            .map(|h| h.inputs.len())
            .sum()
    }

    /// Resolves while an abort asks the loop to rewind: at once when one
    /// does, else at the next. A wake stored by an abort whose rewind is
    /// done already (the loop saw its flag before it waited) is used up
    /// here, never taken for a new request.
    pub(crate) async fn rewind_requested(&self) {
        raised(&self.0.rewind, || self.is_rewinding()).await
    }

    pub(crate) fn is_rewinding(&self) -> bool {
        self.state().rewinding
    }

    /// The rewind is done: cycles commit again.
    pub(crate) fn rewound(&self) {
        self.state().rewinding = false;
    }

    /// The offsets this worker committed last, of `partitions` it knows.
    pub(crate) fn committed(&self, partition: &Partition) -> Option<i64> {
        self.state().committed.get(partition).copied()
    }

    /// One transaction: the ready outputs and the committable offsets that
    /// moved, committed at once; or first the commit or abort a cycle left
    /// in progress, resumed. Blocking, one at a time: `within` bounds it
    /// for a caller with a bound of its own (a revoke's drain, shutdown),
    /// waiting for a cycle in progress included; without one, each call is
    /// bounded as [`ending`](super::ending) says. `group` is the consumer's
    /// group metadata (none: not in a group; nothing commits).
    pub fn cycle(&self, group: Option<&ConsumerGroupMetadata>, within: Option<Instant>) -> Cycle {
        let Some(mut pending) = self.turn(within) else {
            return Cycle::Pending;
        };
        if let Some(mut ending) = pending.take() {
            let cycle = self.end(&mut ending, within);
            if cycle == Cycle::Pending {
                *pending = Some(ending);
            }
            return cycle;
        }
        let Some(group) = group else {
            return Cycle::Idle;
        };
        if within.is_some_and(|w| Instant::now() >= w) {
            return Cycle::Idle;
        }
        let (ready, offsets, resets) = {
            let tracker = lock(&self.0.tracker);
            let mut state = self.state();
            if state.rewinding {
                return Cycle::Idle;
            }
            let (ready, waiting, caps) = select(&tracker, std::mem::take(&mut state.held));
            state.held = waiting;
            let offsets: Vec<(Partition, i64)> = tracker
                .committable_all()
                .into_iter()
                .map(|(p, next)| {
                    let next = caps.get(&p).map_or(next, |cap| next.min(*cap));
                    (p, next)
                })
                .filter(|(p, next)| state.committed.get(p).is_none_or(|c| c < next))
                .collect();
            (ready, offsets, state.resets)
        };
        if ready.is_empty() && offsets.is_empty() {
            return Cycle::Idle;
        }
        let mut ending = match self.begin(&ready, &offsets, group, within) {
            Ok(deliveries) => Ending::commit(ready.len(), offsets, resets, deliveries),
            Err(Failure::Fatal(reason)) => {
                self.0.lifecycle.fail(reason);
                return Cycle::Fatal;
            }
            Err(Failure::Abort(reason)) => self.aborting(reason),
        };
        let cycle = self.end(&mut ending, within);
        if cycle == Cycle::Pending {
            *pending = Some(ending);
        }
        cycle
    }

    /// The cycle lock, waited for until `within` at most (none: when
    /// the bound passed first).
    fn turn(&self, within: Option<Instant>) -> Option<MutexGuard<'_, Option<Ending>>> {
        let Some(within) = within else {
            return Some(self.0.cycling.lock().unwrap_or_else(|p| p.into_inner()));
        };
        loop {
            match self.0.cycling.try_lock() {
                Ok(guard) => return Some(guard),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < within => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// Says why the transaction is aborted, and begins the abort.
    fn aborting(&self, reason: String) -> Ending {
        tracing::warn!(reason = %reason, "transaction aborted; rewinding to the committed offsets");
        Ending::abort(reason)
    }

    /// Ends `ending` (a commit that fails for the transaction becomes an
    /// abort) within `within` and its own bound.
    fn end(&self, ending: &mut Ending, within: Option<Instant>) -> Cycle {
        let calls = Calls {
            producer: &self.0.producer,
            transactional_id: &self.0.transactional_id,
            per_call: self.0.call_timeout,
            metrics: &self.0.metrics,
        };
        loop {
            match calls.end(ending, within) {
                Step::Done => return self.ended(ending),
                Step::Pending => {
                    tracing::info!(
                        call = ending.call(),
                        "transaction {} still in progress at its caller's bound; the next cycle resumes it",
                        ending.call()
                    );
                    return Cycle::Pending;
                }
                Step::Abort(reason) => *ending = self.aborting(reason),
                Step::Fatal(reason) => {
                    self.0.lifecycle.fail(reason);
                    return Cycle::Fatal;
                }
            }
        }
    }

    /// What an acknowledged commit or abort leaves: the offsets committed
    /// (unknown after a reset meanwhile: asked of the broker when needed)
    /// and their holds released, or a rewind asked for.
    fn ended(&self, ending: &Ending) -> Cycle {
        let End::Commit {
            outputs,
            offsets,
            resets,
            ..
        } = &ending.end
        else {
            self.state().rewinding = true;
            self.0.rewind.notify_one();
            return Cycle::Aborted;
        };
        let mut state = self.state();
        let known = state.resets == *resets;
        for (partition, next) in offsets {
            if known {
                state.committed.insert(partition.clone(), *next);
            } else {
                state.committed.remove(partition);
            }
            if let Some(holds) = state.holds.get_mut(partition) {
                *holds = holds.split_off(next);
            }
        }
        tracing::debug!(
            outputs,
            partitions = offsets.len(),
            retries = ending.retries,
            "transaction committed"
        );
        Cycle::Committed {
            outputs: *outputs,
            partitions: offsets.len(),
        }
    }

    /// Begins a transaction, produces `ready` and sends `offsets` (each
    /// call bounded by one call's time and `within`, less the end's share
    /// of it, [`END_SHARE`]): the records' deliveries, by topic.
    fn begin(
        &self,
        ready: &[Held],
        offsets: &[(Partition, i64)],
        group: &ConsumerGroupMetadata,
        within: Option<Instant>,
    ) -> Result<Vec<(String, DeliveryFuture)>, Failure> {
        let producer = &self.0.producer;
        // What comes before the end leaves it a share of the bound.
        let within = within.map(|w| {
            let now = Instant::now();
            w - w.saturating_duration_since(now) / END_SHARE
        });
        producer
            .begin_transaction()
            .map_err(|e| self.failure("begin", &e))?;
        let mut deliveries = Vec::with_capacity(ready.len());
        for record in ready.iter().filter_map(|h| h.record.as_ref()) {
            deliveries.push((record.topic.clone(), self.produce(record, within)?));
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .map_err(|e| Failure::Abort(format!("cannot build the offset list: {e}")))?;
        }
        if tpl.count() > 0 {
            let timeout = within.map_or(self.0.call_timeout, |w| {
                w.saturating_duration_since(Instant::now())
                    .min(self.0.call_timeout)
            });
            // Not resumable in librdkafka: an error here (a timeout too)
            // leaves the transaction to abort.
            producer
                .send_offsets_to_transaction(&tpl, group, timeout)
                .map_err(|e| self.failure("send the offsets of", &e))?;
        }
        Ok(deliveries)
    }

    /// Produces one held output into the open transaction, waiting for room
    /// in the queue at most [`QUEUE_WAIT`], and not past `within` (a cycle
    /// with a deadline: a revoke's, shutdown's).
    fn produce(&self, held: &Record, within: Option<Instant>) -> Result<DeliveryFuture, Failure> {
        let bound = Instant::now() + QUEUE_WAIT;
        let give_up = within.map_or(bound, |w| w.min(bound));
        loop {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&held.topic).headers(held.headers.clone());
            if let Some(key) = &held.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = &held.payload {
                record = record.payload(payload.as_slice());
            }
            match self.0.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if Instant::now() < give_up =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) if is_permanent(&e) => {
                    return Err(Failure::Fatal(format!(
                        "{} refuses a record of the transaction of {} ({e}): grant this client write \
                         access to it, or raise message.max.bytes",
                        held.topic, self.0.transactional_id
                    )))
                }
                Err((e, _)) => return Err(Failure::Abort(format!("produce to {}: {e}", held.topic))),
            }
        }
    }

    /// Sorts an error of a call before the commit: fatal (fenced) or
    /// abortable.
    fn failure(&self, what: &str, e: &KafkaError) -> Failure {
        match sort(e) {
            Sorted::Fatal { fenced } => Failure::Fatal(
                Calls {
                    producer: &self.0.producer,
                    transactional_id: &self.0.transactional_id,
                    per_call: self.0.call_timeout,
                    metrics: &self.0.metrics,
                }
                .fatal(what, e, fenced),
            ),
            _ => Failure::Abort(format!(
                "could not {what} the transaction of {}: {e}",
                self.0.transactional_id
            )),
        }
    }
}

enum Failure {
    Abort(String),
    Fatal(String),
}

/// Resolves once `flag` reads true, waking at each of `notify`'s wakes to
/// read it again: a wake stored when the flag had fallen already is used up
/// and waited past.
async fn raised(notify: &Notify, flag: impl Fn() -> bool) {
    loop {
        if flag() {
            return;
        }
        notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_wake_stored_for_a_rewind_done_already_is_not_a_new_request() {
        let (notify, rewinding) = (Notify::new(), AtomicBool::new(false));
        let flag = || rewinding.load(Ordering::SeqCst);
        // An abort: the flag, then the wake, stored with no one waiting.
        rewinding.store(true, Ordering::SeqCst);
        notify.notify_one();
        // The loop rewound, seeing the flag, without waiting on the wake.
        rewinding.store(false, Ordering::SeqCst);
        let mut wait = Box::pin(raised(&notify, flag));
        assert!(
            wait.as_mut().now_or_never().is_none(),
            "the stale wake is no request"
        );
        // The next abort is one.
        rewinding.store(true, Ordering::SeqCst);
        notify.notify_one();
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the next abort's wake is seen");
        assert!(
            raised(&notify, flag).now_or_never().is_some(),
            "raised already: at once"
        );
    }

    /// The outputs made from one list of inputs (a step's chunks, hint
    /// outcomes and metrics, and the marker binding them) hold the list
    /// once, not a copy each: a 10,000-row step of JSON rows with hints
    /// that learn held 10,001 tickets for each of its 698 outputs.
    #[test]
    fn outputs_of_one_list_of_inputs_hold_it_once() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("out", 1, 1).unwrap();
        let tracker = Arc::new(Mutex::new(OffsetTracker::new()));
        let transactions = mock_transactions(&cluster, "held-once", 100_000, tracker.clone());
        let tickets: Vec<Ticket> = {
            let mut tracker = lock(&tracker);
            (0..1_000).map(|o| tracker.begin("in", 0, o).0).collect()
        };
        let step = Inputs::new(tickets.clone());
        transactions.bind(step.clone());
        for _ in 0..100 {
            transactions.register(output(), step.clone());
        }
        transactions.register(output(), Inputs::new(vec![tickets[0].clone()]));
        assert_eq!(transactions.held(), 102);
        assert_eq!(transactions.held_inputs(), 1_001);
    }

    /// Transactions of the transactional id `id` on `cluster`, whose
    /// producer's queue holds `queued` records at most, over `tracker`.
    fn mock_transactions(
        cluster: &rdkafka::mocking::MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
        id: &str,
        queued: i64,
        tracker: Arc<Mutex<OffsetTracker>>,
    ) -> Transactions {
        use crate::config::Config;
        use crate::health::Signal;
        use crate::kafka::producers::create_transactional_producer;

        let mut config = Config {
            bootstrap_servers: cluster.bootstrap_servers(),
            ..Default::default()
        };
        config
            .kafka
            .producer
            .insert("queue.buffering.max.messages".into(), queued.into());
        let producer =
            create_transactional_producer(&config, id, 1 << 20, Arc::new(Signal::new("not connected yet")))
                .unwrap();
        Transactions::init(
            producer,
            tracker,
            Lifecycle::new(),
            Arc::new(StageMetrics::unregistered()),
            id.into(),
            Duration::from_secs(1),
            Duration::from_secs(10),
            Duration::from_secs(10),
        )
        .unwrap()
    }

    /// An output of one byte for topic `out`.
    fn output() -> Outgoing<'static> {
        Outgoing {
            topic: "out",
            key: None,
            payload: Some(b"x"),
            headers: rdkafka::message::OwnedHeaders::new(),
        }
    }

    /// A cycle with a bound whose produces find the queue full until the
    /// bound leaves its abort the end's share: the transaction is aborted
    /// within the bound, not left open. On librdkafka's mock cluster, each
    /// request answered 100 ms late and the queue one record long, so each
    /// record waits for the one before it to be acknowledged.
    #[test]
    fn an_abort_after_the_produces_ran_out_of_time_ends_within_the_bound() {
        use rdkafka::config::ClientConfig;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::mocking::MockCluster;

        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("out", 1, 1).unwrap();
        let tracker = Arc::new(Mutex::new(OffsetTracker::new()));
        let transactions = mock_transactions(&cluster, "abort-in-time", 1, tracker);
        cluster
            .broker_round_trip_time(1, Duration::from_millis(100))
            .unwrap();
        // Far more records than 4 s of one-at-a-time round trips carry.
        for _ in 0..100 {
            transactions.register(output(), Inputs::new(Vec::new()));
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "abort-in-time")
            .create()
            .unwrap();
        let group = consumer.group_metadata();
        let bound = Instant::now() + Duration::from_secs(4);
        let cycle = transactions.cycle(group.as_ref(), Some(bound));
        assert_eq!(cycle, Cycle::Aborted, "the abort ended within the bound");
        assert!(
            Instant::now() < bound + Duration::from_secs(1),
            "the cycle kept to its bound"
        );
    }
}
