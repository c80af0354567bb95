//! Prometheus metrics: the counters every stage keeps, and a registry
//! rendered in the text format (which the health endpoint serves). Imports
//! no other module of the crate.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{Atomic, Gauge};
use prometheus_client::registry::Registry;

/// Label set of one label, `kind` or `reason`.
pub type Labels = Vec<(&'static str, String)>;

/// Counters of the consume loop and the delivery contract, shared by both
/// stages.
pub struct StageMetrics {
    received: Counter,
    read_errors: Counter,
    dead_letters: Family<Labels, Counter>,
    handler_panics: Counter,
    abandoned: Counter,
    commit_failures: Counter,
    store_failures: Counter,
    revoke_finished: Counter,
    transaction_retries: Family<Labels, Counter>,
    rebalances: Family<Labels, Counter>,
    in_flight: StoredGauge,
    in_flight_bytes: Gauge,
    consumer_lag: Gauge,
    assigned: Gauge,
    ready: Gauge,
}

impl StageMetrics {
    /// Registers the loop's metrics under `registry` (which carries the stage
    /// prefix, for example `hintstream_hints`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = StageMetrics {
            received: Counter::default(),
            read_errors: Counter::default(),
            dead_letters: Family::default(),
            handler_panics: Counter::default(),
            abandoned: Counter::default(),
            commit_failures: Counter::default(),
            store_failures: Counter::default(),
            revoke_finished: Counter::default(),
            transaction_retries: Family::default(),
            rebalances: Family::default(),
            in_flight: StoredGauge::default(),
            in_flight_bytes: Gauge::default(),
            consumer_lag: Gauge::default(),
            assigned: Gauge::default(),
            ready: Gauge::default(),
        };
        registry.register(
            "messages_received",
            "Messages taken off the input topic",
            m.received.clone(),
        );
        registry.register(
            "kafka_read_errors",
            "Errors returned by the consumer",
            m.read_errors.clone(),
        );
        registry.register(
            "dead_letters",
            "Messages sent to the dead-letter topic, by kind",
            m.dead_letters.clone(),
        );
        registry.register(
            "handler_panics",
            "Handler tasks that panicked (their messages are dead-lettered as handler_panic)",
            m.handler_panics.clone(),
        );
        registry.register(
            "abandoned_messages",
            "Messages left unfinished at a partition revoke or shutdown (uncommitted, redelivered)",
            m.abandoned.clone(),
        );
        registry.register(
            "offset_commit_failures",
            "Offset commits that failed (not counting deferrals during a rebalance)",
            m.commit_failures.clone(),
        );
        registry.register(
            "offset_store_failures",
            "Offsets that could not be stored for commit",
            m.store_failures.clone(),
        );
        registry.register(
            "revoke_drained_messages",
            "In-flight messages of revoked partitions that finished during the drain",
            m.revoke_finished.clone(),
        );
        registry.register(
            "transaction_retries",
            "Transaction commits or aborts (call) not acknowledged within one call's wait and called again \
             (exactly_once)",
            m.transaction_retries.clone(),
        );
        registry.register(
            "rebalances",
            "Rebalance callbacks this member received, by kind (assign, revoke): a restarted static member \
             rejoins without any on the others",
            m.rebalances.clone(),
        );
        registry.register(
            "in_flight_messages",
            "Messages taken and not yet finished",
            m.in_flight.clone(),
        );
        registry.register(
            "in_flight_bytes",
            "Bytes of messages taken and not yet finished (stages with a byte bound on intake)",
            m.in_flight_bytes.clone(),
        );
        registry.register(
            "consumer_lag",
            "Messages behind the end of the assigned partitions (librdkafka statistics)",
            m.consumer_lag.clone(),
        );
        registry.register(
            "assigned_partitions",
            "Input partitions assigned to this member",
            m.assigned.clone(),
        );
        registry.register(
            "ready",
            "1 when the stage's /readyz answers 200 (in its consumer group, producer connected, stage 1: \
             LLM provider answered once or none configured), else 0",
            m.ready.clone(),
        );
        m
    }

    /// Metrics registered nowhere, for tools and tests that serve none.
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }

    pub fn received(&self) {
        self.received.inc();
    }

    /// Messages taken so far.
    pub fn received_count(&self) -> u64 {
        self.received.get()
    }

    pub fn read_error(&self) {
        self.read_errors.inc();
    }

    pub fn dead_lettered(&self, kind: &str) {
        self.dead_letters
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    pub fn dead_letter_count(&self, kind: &str) -> u64 {
        self.dead_letters
            .get_or_create(&vec![("kind", kind.to_string())])
            .get()
    }

    pub fn handler_panicked(&self) {
        self.handler_panics.inc();
    }

    pub fn handler_panic_count(&self) -> u64 {
        self.handler_panics.get()
    }

    pub fn abandoned(&self) {
        self.abandoned.inc();
    }

    pub fn commit_failed(&self) {
        self.commit_failures.inc();
    }

    pub fn store_failed(&self) {
        self.store_failures.inc();
    }

    /// A revoke's drain ended with `finished` messages completed (those
    /// cancelled are counted as abandoned when their handles drop).
    pub fn revoke_drained(&self, finished: usize) {
        self.revoke_finished.inc_by(finished as u64);
    }

    /// A transaction `call` (`commit` or `abort`) timed out and is called
    /// again.
    pub fn transaction_retried(&self, call: &str) {
        self.transaction_retries
            .get_or_create(&vec![("call", call.to_string())])
            .inc();
    }

    pub fn transaction_retry_count(&self, call: &str) -> u64 {
        self.transaction_retries
            .get_or_create(&vec![("call", call.to_string())])
            .get()
    }

    /// A rebalance callback: `kind` is `assign` or `revoke`.
    pub fn rebalanced(&self, kind: &str) {
        self.rebalances
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    /// Rebalance callbacks of `kind` so far.
    pub fn rebalance_count(&self, kind: &str) -> u64 {
        self.rebalances
            .get_or_create(&vec![("kind", kind.to_string())])
            .get()
    }

    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A hold of `n` bytes began: added atomically, so holds that begin and
    /// end on other threads at once leave the sum exact.
    pub fn add_in_flight_bytes(&self, n: usize) {
        self.in_flight_bytes.inc_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A hold of `n` bytes ended.
    pub fn remove_in_flight_bytes(&self, n: usize) {
        self.in_flight_bytes.dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn set_consumer_lag(&self, lag: i64) {
        self.consumer_lag.set(lag);
    }

    pub fn set_assigned(&self, partitions: usize) {
        self.assigned.set(i64::try_from(partitions).unwrap_or(i64::MAX));
    }

    /// Partitions assigned now.
    pub fn assigned(&self) -> i64 {
        self.assigned.get()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// 1 when the stage was ready at its last check, else 0.
    pub fn ready(&self) -> i64 {
        self.ready.get()
    }

    /// Messages in flight now.
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.in_flight.get()).unwrap_or(0)
    }

    /// Messages abandoned so far.
    pub fn abandoned_count(&self) -> u64 {
        self.abandoned.get()
    }

    /// In-flight messages of revoked partitions that finished during drains.
    pub fn revoke_finished(&self) -> u64 {
        self.revoke_finished.get()
    }
}

/// A counter of `f64` (cost in dollars and the like).
pub type FloatCounter = Counter<f64, AtomicU64>;

/// A gauge of `f64` (dollars left and the like).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// A gauge set for each message (what is in flight, what is pending), whose
/// `set` is a store: a plain `Gauge`'s is a swap, a locked instruction,
/// and the two of stage 2's pending steps were about 3% of its intake of
/// JSON rows.
pub type StoredGauge = Gauge<i64, Stored>;

/// The `i64` of a [`StoredGauge`]. Adding to it is atomic, as a `Gauge`'s.
#[derive(Debug, Default)]
pub struct Stored(AtomicI64);

impl Atomic<i64> for Stored {
    fn inc(&self) -> i64 {
        self.inc_by(1)
    }

    fn inc_by(&self, v: i64) -> i64 {
        self.0.fetch_add(v, Ordering::Relaxed)
    }

    fn dec(&self) -> i64 {
        self.dec_by(1)
    }

    fn dec_by(&self, v: i64) -> i64 {
        self.0.fetch_sub(v, Ordering::Relaxed)
    }

    /// Returns the value it replaced, read just before: not atomic with the
    /// store, as a swap's is (no caller reads it).
    fn set(&self, v: i64) -> i64 {
        let before = self.0.load(Ordering::Relaxed);
        self.0.store(v, Ordering::Relaxed);
        before
    }

    fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Renders a registry in the Prometheus/OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_gauge_reads_adds_and_renders_as_a_gauge() {
        let mut registry = Registry::default();
        let gauge = StoredGauge::default();
        registry.register("pending_bytes", "Bytes pending", gauge.clone());
        assert_eq!(gauge.set(7), 0);
        assert_eq!(gauge.inc_by(3), 7);
        assert_eq!(gauge.dec(), 10);
        assert_eq!(gauge.get(), 9);
        let text = render(&registry);
        assert!(text.contains("# TYPE pending_bytes gauge"), "{text}");
        assert!(text.contains("\npending_bytes 9\n"), "{text}");
    }
}
