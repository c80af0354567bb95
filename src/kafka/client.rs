//! Consumer and producer construction: the librdkafka settings that the
//! delivery contract depends on are set here and nowhere else. The consumer's
//! context keeps the offset tracker in step with the group's assignment and
//! drains a revoked partition's in-flight work before letting it go. Both
//! contexts keep their part of the stage's readiness current (in its group;
//! connected to a broker) from rebalances and librdkafka's statistics.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::FutureProducer;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;

use super::commit::lock;
use super::tracker::OffsetTracker;
use super::transaction::Transactions;
use crate::config::{ClientKind, Config, GroupProtocol};
use crate::health::Lifecycle;
use crate::health::Signal;
use crate::metrics::StageMetrics;

/// The consumer type both stages use.
pub type StageConsumer = StreamConsumer<StageContext>;

/// A partition of an input topic.
pub type Partition = (Arc<str>, i32);

/// Called when partitions are revoked, before their drain: a stage releases
/// work it parks outside handler tasks (stage 2's incomplete steps), which
/// could never finish on this member.
pub type RevokeHook = Box<dyn Fn(&[Partition]) + Send + Sync>;

/// Called after every rebalance (partitions assigned or revoked) with the
/// consumer's whole assignment then: stage 1 re-splits the group's rate
/// limits by the share of partitions it holds.
pub type AssignmentHook = Box<dyn Fn(&[Partition]) + Send + Sync>;

/// Client configuration every client starts from: bootstrap servers, then the
/// `[kafka]` passthrough table, which may override anything below it.
pub fn base_config(config: &Config) -> ClientConfig {
    client_config(config, ClientKind::Other)
}

/// The configuration a client of `kind` starts from: bootstrap servers,
/// then the `[kafka]` table and the kind's own table over it.
pub fn client_config(config: &Config, kind: ClientKind) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set_log_level(RDKafkaLogLevel::Warning);
    apply(&mut client, config, kind);
    client
}

/// Sets bootstrap servers and the passthrough properties of `kind` on
/// `client`, over what it has. (From the config itself: rdkafka's
/// `ClientConfig::config_map` shows `sasl.password` as a placeholder, so
/// copying one client config into another would lose the password.)
fn apply(client: &mut ClientConfig, config: &Config, kind: ClientKind) {
    client.set("bootstrap.servers", &config.bootstrap_servers);
    for (key, value) in config.kafka.properties(kind) {
        client.set(key, value);
    }
}

/// Consumer context: keeps the offset tracker in step with the group's
/// assignment, drains revoked partitions, reports commit failures and
/// exports the consumer lag.
pub struct StageContext {
    pub(crate) tracker: Arc<Mutex<OffsetTracker>>,
    pub(crate) metrics: Arc<StageMetrics>,
    pub(crate) lifecycle: Lifecycle,
    /// How long a revoked partition's in-flight work may take to finish.
    drain_timeout: Duration,
    revoke_hooks: Mutex<Vec<RevokeHook>>,
    assignment_hooks: Mutex<Vec<AssignmentHook>>,
    /// Whether the consumer is in its group (readiness): held on an
    /// assignment and while statistics say the group is up and steady.
    group: Arc<Signal>,
    /// Under exactly_once: the worker's transactions, committed for the
    /// revoked partitions before they go, and told of every reset.
    pub(crate) transactions: OnceLock<Transactions>,
}

impl StageContext {
    pub fn new(metrics: Arc<StageMetrics>, lifecycle: Lifecycle, drain_timeout: Duration) -> Self {
        StageContext {
            tracker: Arc::new(Mutex::new(OffsetTracker::new())),
            metrics,
            lifecycle,
            drain_timeout,
            revoke_hooks: Mutex::new(Vec::new()),
            assignment_hooks: Mutex::new(Vec::new()),
            group: Arc::new(Signal::new("the consumer has not joined its group yet")),
            transactions: OnceLock::new(),
        }
    }

    /// Whether the consumer is in its group, for the stage's readiness.
    pub fn group_signal(&self) -> Arc<Signal> {
        self.group.clone()
    }

    /// Registers a hook called when partitions are revoked.
    pub fn on_revoke(&self, hook: RevokeHook) {
        self.revoke_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    /// Registers a hook called after every rebalance with the whole
    /// assignment.
    pub fn on_assignment(&self, hook: AssignmentHook) {
        self.assignment_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    pub(crate) fn reset(&self, partitions: &[Partition]) {
        {
            let mut tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.reset(topic, *partition);
            }
        }
        // After the tracker: what registers meanwhile is stale already.
        if let Some(transactions) = self.transactions.get() {
            transactions.forget(partitions);
        }
    }

    /// Calls the revoke hooks: the stage releases what it parks for
    /// `partitions`.
    pub(crate) fn release_parked(&self, partitions: &[Partition]) {
        for hook in self.revoke_hooks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            hook(partitions);
        }
    }

    /// Under exactly_once, commits the open transaction (what the revoked
    /// partitions finished goes with it), so that their next owner starts
    /// after it. Blocking, bounded by the transaction calls' timeout.
    fn commit_before_revoke(&self, consumer: &BaseConsumer<Self>) {
        let Some(transactions) = self.transactions.get() else {
            return;
        };
        let group = consumer.group_metadata();
        let commit = || transactions.cycle(group.as_ref());
        let cycle = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(commit),
            _ => commit(),
        };
        tracing::info!(?cycle, "transaction committed before the revoke");
    }

    /// Drain on revoke: the revoked partitions' in-flight work gets up to
    /// the drain timeout to finish and store its offsets (librdkafka commits
    /// a removed partition's stored offsets itself on unassign); what has not
    /// finished by then is cancelled, uncommitted, and its new owner redoes
    /// it. A lost assignment (the group moved on without us) is not drained:
    /// its partitions belong to others already. Shutdown beginning meanwhile
    /// ends the wait.
    fn drain(&self, consumer: &BaseConsumer<Self>, partitions: &[Partition]) {
        {
            let mut tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.mark_revoking(topic, *partition);
            }
        }
        self.release_parked(partitions);
        let started = Instant::now();
        let live = || {
            let tracker = lock(&self.tracker);
            partitions
                .iter()
                .map(|(t, p)| tracker.live_on(t, *p))
                .sum::<usize>()
        };
        let before = live();
        let lost = consumer.assignment_lost();
        let wait = || {
            while !lost
                && live() > 0
                && started.elapsed() < self.drain_timeout
                && !self.lifecycle.is_stopping()
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        // The callback runs inside the consume loop's poll, on a runtime
        // worker: hand the worker's other tasks off while waiting, so the
        // handlers being waited for keep running.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            Ok(_) => {} // a current-thread runtime cannot run them meanwhile
            Err(_) => wait(),
        }
        let abandoned = live();
        {
            let tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.cancel(topic, *partition);
            }
        }
        self.metrics.revoke_drained(before.saturating_sub(abandoned));
        tracing::info!(
            partitions = %describe_partitions(partitions),
            finished = before.saturating_sub(abandoned),
            abandoned,
            assignment_lost = lost,
            drain_ms = started.elapsed().as_millis() as u64,
            "revoked partitions drained"
        );
    }

    fn commit_failed(&self, e: &KafkaError, what: &str) {
        match e {
            KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset) => {}
            // A member left or joined meanwhile; the offsets stay stored and
            // the next commit after the rebalance carries them (librdkafka
            // #4059). Expected when a worker of the group stops.
            KafkaError::ConsumerCommit(
                RDKafkaErrorCode::RebalanceInProgress | RDKafkaErrorCode::IllegalGeneration,
            ) => tracing::info!(error = %e, "offset commit deferred: group rebalancing"),
            _ => {
                self.metrics.commit_failed();
                tracing::warn!(error = %e, "{what}");
            }
        }
    }
}

/// How often librdkafka reports statistics, and so how often the lag gauge
/// and the clients' parts of readiness update.
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Sets `statistics.interval.ms` unless the passthrough tables set a
/// positive value: readiness rests on statistics, so 0 (off) is not allowed.
fn ensure_statistics(client: &mut ClientConfig) {
    let set = client
        .get("statistics.interval.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|ms| ms > 0);
    if !set {
        client.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
}

impl ClientContext for StageContext {
    fn stats(&self, statistics: Statistics) {
        // Joined with or without partitions: up (coordinator known and
        // connected) and steady (no join or sync in progress).
        match &statistics.cgrp {
            Some(group) if group.state == "up" && group.join_state == "steady" => self.group.hold(),
            Some(group) => self.group.fail(format!(
                "the consumer is not in its group (group state {}, join state {})",
                group.state, group.join_state
            )),
            None => self.group.fail("the consumer has not joined its group yet"),
        }
        // librdkafka reports -1 for partitions without a known lag.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.metrics.set_consumer_lag(lag);
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = partitions_of(tpl);
            tracing::info!(partitions = %describe_partitions(&partitions), "partitions revoked");
            self.metrics.rebalanced("revoke");
            // At shutdown the stage drained already; the close revokes all.
            if !self.lifecycle.is_stopping() {
                self.drain(consumer, &partitions);
                self.commit_before_revoke(consumer);
            }
            self.reset(&partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = partitions_of(tpl);
                tracing::info!(partitions = %describe_partitions(&partitions), "partitions assigned");
                self.metrics.rebalanced("assign");
                self.reset(&partitions);
                self.group.hold();
            }
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                self.group.fail(format!("the last rebalance failed: {e}"));
            }
            Rebalance::Revoke(_) => {}
        }
        let assignment = consumer
            .assignment()
            .map(|a| partitions_of(&a))
            .unwrap_or_default();
        self.metrics.set_assigned(assignment.len());
        if !matches!(rebalance, Rebalance::Error(_)) {
            for hook in self
                .assignment_hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                hook(&assignment);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!(offsets = %describe(offsets), "offsets committed"),
            Err(e) => self.commit_failed(&e, "offset commit failed"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| (Arc::from(e.topic()), e.partition()))
        .collect()
}

fn describe_partitions(partitions: &[Partition]) -> String {
    partitions
        .iter()
        .map(|(t, p)| format!("{t}[{p}]"))
        .collect::<Vec<_>>()
        .join(",")
}

fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| format!("{}[{}]@{:?}", e.topic(), e.partition(), e.offset()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A group consumer for at-least-once processing: offsets are committed on a
/// timer, but only offsets the [`Committer`](super::Committer) stored.
/// `prefetch_bytes` bounds what librdkafka fetches ahead of the stage.
pub fn create_consumer(
    config: &Config,
    group_id: &str,
    context: StageContext,
    prefetch_bytes: Option<usize>,
) -> KafkaResult<StageConsumer> {
    let mut client = ClientConfig::new();
    client.set_log_level(RDKafkaLogLevel::Warning);
    client
        .set("auto.offset.reset", "earliest")
        .set("auto.commit.interval.ms", "1000");
    // Incremental rebalances: a member joining or leaving moves only the
    // partitions that change owner, so in-flight work elsewhere is not
    // revoked and redone. Under KIP-848 (`group.protocol = "consumer"`) the
    // broker assigns, always incrementally, and librdkafka refuses a client
    // assignor; the config check refused one set there already.
    if config.kafka.group_protocol().unwrap_or(GroupProtocol::Classic) == GroupProtocol::Classic {
        client.set("partition.assignment.strategy", "cooperative-sticky");
    }
    if let Some(bytes) = prefetch_bytes {
        // librdkafka's default (64 MiB) would let prefetched messages alone
        // exceed a small in-flight byte bound.
        let kbytes = (bytes / 1024).clamp(1024, 65_536);
        client.set("queued.max.messages.kbytes", kbytes.to_string());
    }
    // The passthrough tables may tune anything above.
    apply(&mut client, config, ClientKind::Consumer);
    ensure_statistics(&mut client);
    client.set("group.id", group_id);
    // Static membership (KIP-345); the stage refused a bad one before.
    if let Ok(Some(instance)) = config.kafka.group_instance_id(group_id) {
        client.set("group.instance.id", instance);
    }
    // The settings the delivery contract rests on; set after the passthrough
    // table so that it cannot turn them off. Under exactly_once offsets are
    // committed only through the transactions, never by the consumer.
    let auto_commit = if config.kafka.exactly_once() {
        "false"
    } else {
        "true"
    };
    client
        .set("enable.auto.commit", auto_commit)
        .set("enable.auto.offset.store", "false")
        // Inputs written in transactions are read once committed (also
        // librdkafka's default; set so that a passthrough cannot change it).
        .set("isolation.level", "read_committed");
    client.create_with_context(context)
}

/// How long librdkafka tries to deliver one produced message before it
/// reports a failure, which the stage then retries or dead-letters
/// (librdkafka's default is 300 s).
const MESSAGE_TIMEOUT_MS: &str = "30000";

/// An idempotent producer: acks from all in-sync replicas and no reordering
/// or duplication by the producer's own retries, so per-key order holds.
pub fn create_producer(config: &Config) -> KafkaResult<FutureProducer> {
    producer_config(config).create()
}

fn producer_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set_log_level(RDKafkaLogLevel::Warning);
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", MESSAGE_TIMEOUT_MS);
    // Passthrough last: a deployment may tune batching and timeouts.
    apply(&mut client, config, ClientKind::Producer);
    client
}

/// A stage's dead-letter producer: [`create_producer`]'s settings, taking
/// messages of at least `message_max_bytes` (`kafka::dlq::dlq_message_max_bytes`;
/// a larger `message.max.bytes` set in `[kafka]` stays).
pub fn create_dlq_producer(config: &Config, message_max_bytes: usize) -> KafkaResult<FutureProducer> {
    let mut client = producer_config(config);
    let configured = client
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    client.set("message.max.bytes", configured.max(message_max_bytes).to_string());
    client.create()
}

/// A stage's output producer: [`create_producer`]'s, whose statistics say
/// whether it is connected.
pub type StageProducer = FutureProducer<OutputContext>;

/// The output producer's context: keeps "connected to a broker" (readiness)
/// current from librdkafka's statistics.
pub struct OutputContext {
    connected: Arc<Signal>,
}

impl ClientContext for OutputContext {
    fn stats(&self, statistics: Statistics) {
        // The internal and logical "brokers" are librdkafka's own.
        let brokers: Vec<_> = statistics
            .brokers
            .values()
            .filter(|b| b.source == "learned" || b.source == "configured")
            .collect();
        if brokers.iter().any(|b| b.state == "UP") {
            self.connected.hold();
        } else {
            let states: Vec<String> = brokers
                .iter()
                .map(|b| format!("{} {}", b.name, b.state))
                .collect();
            self.connected.fail(format!(
                "the output producer has no broker connection ({})",
                if states.is_empty() {
                    "no broker known".to_string()
                } else {
                    states.join(", ")
                }
            ));
        }
    }
}

/// Under exactly_once, the worker's one producer, for its outputs and its
/// dead letters: [`create_stage_producer`]'s settings with
/// `transactional.id` and `transaction.timeout.ms`, and a
/// `message.max.bytes` of at least `message_max_bytes` (the dead letters'
/// need; a larger one set in `[kafka]` stays). Transactions are
/// initialised by [`Transactions::init`].
pub fn create_transactional_producer(
    config: &Config,
    transactional_id: &str,
    message_max_bytes: usize,
    connected: Arc<Signal>,
) -> KafkaResult<StageProducer> {
    let mut client = producer_config(config);
    ensure_statistics(&mut client);
    let configured = client
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    // librdkafka refuses a message timeout longer than the transaction's.
    let message_timeout = client
        .get("message.timeout.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX)
        .min(config.kafka.transaction_timeout_ms);
    client
        .set("message.max.bytes", configured.max(message_max_bytes).to_string())
        .set("message.timeout.ms", message_timeout.to_string())
        .set("transactional.id", transactional_id)
        .set(
            "transaction.timeout.ms",
            config.kafka.transaction_timeout_ms.to_string(),
        );
    client.create_with_context(OutputContext { connected })
}

/// The stage's output producer: [`create_producer`]'s settings, with
/// statistics on so that `connected` tracks its broker connection.
pub fn create_stage_producer(config: &Config, connected: Arc<Signal>) -> KafkaResult<StageProducer> {
    let mut client = producer_config(config);
    ensure_statistics(&mut client);
    client.create_with_context(OutputContext { connected })
}
