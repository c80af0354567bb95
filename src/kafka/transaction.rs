//! Exactly-once delivery (`kafka.delivery = "exactly_once"`): one open
//! transaction per worker, committed every `kafka.transaction_interval_ms`,
//! carrying the stage's outputs, its dead letters and the input offsets
//! they came from (`send_offsets_to_transaction` with the consumer's group
//! metadata). A `read_committed` reader then sees each output once.
//!
//! Work finishes out of order (hints per group; steps interleaved on one
//! partition), so an output is *held* until its partition's contiguous
//! finished offset (the tracker's committable offset) has passed every one
//! of its inputs ([`Passage::Passed`]); only then does it join a
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

use futures::FutureExt;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::hold::Hold;
use super::partition::Partition;
use super::produce::{is_permanent, Outgoing};
use super::producers::StageProducer;
use super::tracker::{lock, OffsetTracker, Passage, Ticket};
use crate::health::Lifecycle;
use crate::telemetry;

/// How long one produce may wait for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(10);

/// An output waiting for its inputs to be passed by the committable offset
/// (no record: inputs finished together with no output, which must not be
/// split by a commit either).
struct Held {
    record: Option<Record>,
    inputs: Vec<Ticket>,
}

/// An output's record, owned.
struct Record {
    topic: String,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: OwnedHeaders,
}

#[derive(Default)]
struct State {
    /// In registration order (a step's chunks stay in order).
    held: Vec<Held>,
    /// The intake holds of finished inputs, by partition and offset, kept
    /// until a commit passes them.
    holds: HashMap<Partition, BTreeMap<i64, Vec<Hold>>>,
    /// The offsets committed by this worker, by partition (the next offset
    /// to consume).
    committed: HashMap<Partition, i64>,
    /// An abort happened: no cycle commits until the loop rewound.
    rewinding: bool,
}

/// What one cycle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cycle {
    /// Nothing to commit (or a rewind is pending).
    Idle,
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
    /// One cycle at a time (the timer's, a revoke's, shutdown's).
    cycling: Mutex<()>,
    rewind: Notify,
    interval: Duration,
    /// The bound of each transaction call (`kafka.transaction_timeout_ms`).
    call_timeout: Duration,
    transactional_id: String,
    lifecycle: Lifecycle,
}

/// A worker's transactions; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Transactions(Arc<Inner>);

impl Transactions {
    /// Initialises `producer`'s transactions (fencing an older instance of
    /// the same `transactional.id` and aborting what it left open), within
    /// `within`. Blocking: call it on the blocking pool.
    pub fn init(
        producer: StageProducer,
        tracker: Arc<Mutex<OffsetTracker>>,
        lifecycle: Lifecycle,
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
            cycling: Mutex::new(()),
            rewind: Notify::new(),
            interval,
            call_timeout,
            transactional_id,
            lifecycle,
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
    pub(crate) fn register(&self, record: &Outgoing<'_>, inputs: Vec<Ticket>) {
        // The record carries the trace of the span registering it.
        let headers = telemetry::with_traceparent(record.headers.clone(), &tracing::Span::current());
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
    pub(crate) fn bind(&self, inputs: Vec<Ticket>) {
        if inputs.len() > 1 {
            self.hold(Held { record: None, inputs });
        }
    }

    fn hold(&self, held: Held) {
        let tracker = lock(&self.0.tracker);
        if !held.inputs.iter().all(|t| tracker.is_current(t)) {
            return;
        }
        self.state().held.push(held);
    }

    /// Keeps a finished input's intake holds until a commit passes it.
    pub(crate) fn keep(&self, ticket: &Ticket, holds: Vec<Hold>) {
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
                .iter()
                .any(|t| partitions.contains(&(t.topic.clone(), t.partition)))
        });
        for partition in partitions {
            state.holds.remove(partition);
            state.committed.remove(partition);
        }
    }

    /// Outputs held now (for tests and logs).
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// Resolves when an abort asks the loop to rewind.
    pub(crate) async fn rewind_requested(&self) {
        self.0.rewind.notified().await
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
    /// moved, committed at once. Blocking (every call is bounded by
    /// `kafka.transaction_timeout_ms`); one at a time. `group` is the
    /// consumer's group metadata (none: not in a group; nothing commits).
    pub fn cycle(&self, group: Option<&ConsumerGroupMetadata>) -> Cycle {
        let _one = self.0.cycling.lock().unwrap_or_else(|p| p.into_inner());
        let Some(group) = group else {
            return Cycle::Idle;
        };
        let (ready, offsets) = {
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
            (ready, offsets)
        };
        if ready.is_empty() && offsets.is_empty() {
            return Cycle::Idle;
        }
        match self.commit(&ready, &offsets, group) {
            Ok(()) => {
                let mut state = self.state();
                for (partition, next) in &offsets {
                    state.committed.insert(partition.clone(), *next);
                    if let Some(holds) = state.holds.get_mut(partition) {
                        *holds = holds.split_off(next);
                    }
                }
                tracing::debug!(
                    outputs = ready.len(),
                    partitions = offsets.len(),
                    "transaction committed"
                );
                Cycle::Committed {
                    outputs: ready.len(),
                    partitions: offsets.len(),
                }
            }
            Err(Failure::Fatal(reason)) => {
                self.0.lifecycle.fail(reason);
                Cycle::Fatal
            }
            Err(Failure::Abort(reason)) => {
                tracing::warn!(reason = %reason, "transaction aborted; rewinding to the committed offsets");
                match self.0.producer.abort_transaction(self.0.call_timeout) {
                    Ok(()) => {
                        self.state().rewinding = true;
                        self.0.rewind.notify_one();
                        Cycle::Aborted
                    }
                    Err(e) => {
                        self.0.lifecycle.fail(format!(
                            "the transaction of {} could not be aborted ({e}) after: {reason}",
                            self.0.transactional_id
                        ));
                        Cycle::Fatal
                    }
                }
            }
        }
    }

    /// Begins a transaction, produces `ready`, sends `offsets`, commits.
    fn commit(
        &self,
        ready: &[Held],
        offsets: &[(Partition, i64)],
        group: &ConsumerGroupMetadata,
    ) -> Result<(), Failure> {
        let id = &self.0.transactional_id;
        let producer = &self.0.producer;
        let timeout = self.0.call_timeout;
        producer
            .begin_transaction()
            .map_err(|e| self.failure("begin", &e))?;
        let mut deliveries: Vec<(&str, DeliveryFuture)> = Vec::with_capacity(ready.len());
        for record in ready.iter().filter_map(|h| h.record.as_ref()) {
            deliveries.push((&record.topic, self.produce(record)?));
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .map_err(|e| Failure::Abort(format!("cannot build the offset list: {e}")))?;
        }
        if tpl.count() > 0 {
            producer
                .send_offsets_to_transaction(&tpl, group, timeout)
                .map_err(|e| self.failure("send the offsets of", &e))?;
        }
        if let Err(e) = producer.commit_transaction(timeout) {
            // A record the broker refused for good cannot be retried.
            for (topic, delivery) in deliveries {
                if let Some(Ok(Err((e, _)))) = delivery.now_or_never() {
                    if is_permanent(&e) {
                        return Err(Failure::Fatal(format!(
                            "{topic} refused a record of the transaction of {id} ({e}); under exactly_once \
                             such a record stops the stage: grant this client write access to {topic} or \
                             raise its max.message.bytes"
                        )));
                    }
                }
            }
            return Err(self.failure("commit", &e));
        }
        Ok(())
    }

    /// Produces one held output into the open transaction, waiting for room
    /// in the queue at most [`QUEUE_WAIT`].
    fn produce(&self, held: &Record) -> Result<DeliveryFuture, Failure> {
        let started = Instant::now();
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
                    if started.elapsed() < QUEUE_WAIT =>
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

    /// Sorts a transaction call's error: fatal (fenced) or abortable.
    fn failure(&self, what: &str, e: &KafkaError) -> Failure {
        let id = &self.0.transactional_id;
        let fatal = match e {
            KafkaError::Transaction(t) => t.is_fatal(),
            _ => false,
        };
        if fatal {
            let fenced = matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
            );
            Failure::Fatal(if fenced {
                format!(
                    "fenced: a newer instance with transactional.id {id} started (another worker runs with \
                     the same --worker-id, or this one was restarted); this one stops ({e})"
                )
            } else {
                format!("could not {what} the transaction of {id}: {e}")
            })
        } else {
            Failure::Abort(format!("could not {what} the transaction of {id}: {e}"))
        }
    }
}

enum Failure {
    Abort(String),
    Fatal(String),
}

/// Splits the held outputs into those that join this transaction and those
/// that wait, and returns, per partition, the offset a commit may not pass:
/// the lowest input of a waiting output. An output is ready when every input
/// is passed by the committable offset AND below that cap, so that no commit
/// ever splits an output's inputs (steps interleave on a partition: a step
/// whose rows sit below and above an unfinished one waits whole, and the
/// offset stays below its first row). Stale outputs (of a reset partition)
/// are dropped.
fn select(tracker: &OffsetTracker, held: Vec<Held>) -> (Vec<Held>, Vec<Held>, HashMap<Partition, i64>) {
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    for h in held {
        match passage_of(tracker, &h.inputs) {
            Passage::Passed => ready.push(h),
            Passage::Waiting => waiting.push(h),
            Passage::Stale => {}
        }
    }
    let mut caps: HashMap<Partition, i64> = HashMap::new();
    fn lower(caps: &mut HashMap<Partition, i64>, h: &Held) {
        for t in &h.inputs {
            let cap = caps.entry((t.topic.clone(), t.partition)).or_insert(t.offset);
            *cap = (*cap).min(t.offset);
        }
    }
    for h in &waiting {
        lower(&mut caps, h);
    }
    // A ready output above a cap waits too, which may lower the cap: until
    // nothing moves (each round moves at least one, so at most n rounds).
    loop {
        let (stay, held_back): (Vec<Held>, Vec<Held>) = ready.into_iter().partition(|h| {
            h.inputs.iter().all(|t| {
                caps.get(&(t.topic.clone(), t.partition))
                    .is_none_or(|cap| t.offset < *cap)
            })
        });
        ready = stay;
        if held_back.is_empty() {
            break;
        }
        for h in &held_back {
            lower(&mut caps, h);
        }
        waiting.extend(held_back);
    }
    // Outputs of one input set (a step's chunks, outcomes, metrics) move
    // together, so their registration order holds in every transaction.
    (ready, waiting, caps)
}

/// Where an output stands: [`Passage::Passed`] once all its inputs are,
/// [`Passage::Stale`] when any was reset, [`Passage::Waiting`] otherwise.
fn passage_of(tracker: &OffsetTracker, inputs: &[Ticket]) -> Passage {
    let mut all = Passage::Passed;
    for input in inputs {
        match tracker.passage(input) {
            Passage::Stale => return Passage::Stale,
            Passage::Waiting => all = Passage::Waiting,
            Passage::Passed => {}
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_joins_only_once_the_contiguous_offset_passed_all_its_inputs() {
        let mut tracker = OffsetTracker::new();
        let t = |tracker: &mut OffsetTracker, o| tracker.begin("in", 0, o).0;
        let (a, b, c, d) = (
            t(&mut tracker, 10),
            t(&mut tracker, 11),
            t(&mut tracker, 12),
            t(&mut tracker, 13),
        );
        // Output of 11 and 13 (a group of two): both finish, 10 and 12 do not.
        tracker.finish(&b);
        tracker.finish(&d);
        let group = [b.clone(), d.clone()];
        assert_eq!(passage_of(&tracker, &group), Passage::Waiting, "10 is unfinished");
        tracker.finish(&a);
        assert_eq!(
            passage_of(&tracker, std::slice::from_ref(&b)),
            Passage::Passed,
            "10 and 11 finished"
        );
        assert_eq!(
            passage_of(&tracker, &group),
            Passage::Waiting,
            "12 is unfinished: 13 is past the committable offset"
        );
        tracker.finish(&c);
        assert_eq!(passage_of(&tracker, &group), Passage::Passed);
        assert_eq!(tracker.committable("in", 0), Some(14));
    }

    #[test]
    fn an_unfinished_input_holds_its_output_even_below_later_finished_ones() {
        let mut tracker = OffsetTracker::new();
        let a = tracker.begin("in", 0, 5).0;
        let b = tracker.begin("in", 0, 6).0;
        tracker.finish(&b);
        assert_eq!(tracker.passage(&a), Passage::Waiting);
        assert_eq!(tracker.passage(&b), Passage::Waiting);
        // Inputs on two partitions: each partition's offset must pass its own.
        let other = tracker.begin("in", 1, 100).0;
        tracker.finish(&other);
        assert_eq!(
            passage_of(&tracker, std::slice::from_ref(&other)),
            Passage::Passed
        );
        assert_eq!(passage_of(&tracker, &[other, b]), Passage::Waiting);
    }

    fn marker(inputs: &[&Ticket]) -> Held {
        Held {
            record: None,
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
        }
    }

    #[test]
    fn no_commit_splits_the_inputs_of_an_output_across_interleaved_steps() {
        let mut tracker = OffsetTracker::new();
        let t: Vec<Ticket> = (0..10).map(|o| tracker.begin("in", 0, o).0).collect();
        // Step Y: offsets 3 and 9, finished together; step X: offset 5;
        // offset 7 (another step) unfinished; the rest finished alone.
        for (o, ticket) in t.iter().enumerate() {
            if o != 7 {
                tracker.finish(ticket);
            }
        }
        assert_eq!(tracker.committable("in", 0), Some(7));
        let held = vec![marker(&[&t[3], &t[9]]), marker(&[&t[5]]), marker(&[&t[1]])];
        let (ready, waiting, caps) = select(&tracker, held);
        let key = (t[0].topic.clone(), 0);
        assert_eq!(caps.get(&key), Some(&3), "a commit stops below Y's first input");
        assert_eq!(ready.len(), 1, "only the output of 1 joins");
        assert_eq!(ready[0].inputs[0].offset, 1);
        assert_eq!(waiting.len(), 2, "X (5) waits behind Y's cap, Y behind 7");
        tracker.finish(&t[7]);
        let (ready, waiting, caps) = select(&tracker, waiting);
        assert_eq!((ready.len(), waiting.len()), (2, 0));
        assert!(caps.is_empty());
        assert_eq!(tracker.committable("in", 0), Some(10));
    }

    #[test]
    fn outputs_of_a_reset_partition_are_stale_and_dropped() {
        let mut tracker = OffsetTracker::new();
        let a = tracker.begin("in", 0, 1).0;
        tracker.finish(&a);
        assert_eq!(tracker.passage(&a), Passage::Passed);
        tracker.reset("in", 0);
        assert_eq!(tracker.passage(&a), Passage::Stale);
        let b = tracker.begin("in", 0, 1).0;
        assert_eq!(passage_of(&tracker, &[b, a]), Passage::Stale);
    }

    #[test]
    fn random_completion_never_lets_an_output_pass_an_unfinished_input() {
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        let mut tracker = OffsetTracker::new();
        let tickets: Vec<Ticket> = (0..300).map(|o| tracker.begin("in", 0, o).0).collect();
        // Outputs of three inputs each, far apart.
        let outputs: Vec<Vec<Ticket>> = (0..100)
            .map(|i| {
                vec![
                    tickets[i].clone(),
                    tickets[i + 100].clone(),
                    tickets[i + 200].clone(),
                ]
            })
            .collect();
        let mut order = tickets.clone();
        order.shuffle(&mut rng);
        let mut finished = std::collections::HashSet::new();
        for ticket in order {
            tracker.finish(&ticket);
            finished.insert(ticket.offset);
            for inputs in &outputs {
                if passage_of(&tracker, inputs) == Passage::Passed {
                    let top = inputs.iter().map(|t| t.offset).max().unwrap_or(0);
                    assert!(
                        (0..=top).all(|o| finished.contains(&o)),
                        "passed before {top} was contiguous"
                    );
                }
            }
        }
        assert!(outputs.iter().all(|i| passage_of(&tracker, i) == Passage::Passed));
    }
}
