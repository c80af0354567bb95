//! Consumer and producer construction: the librdkafka settings that the
//! delivery contract depends on are set here and nowhere else.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::FutureProducer;
use rdkafka::statistics::Statistics;
use rdkafka::TopicPartitionList;

use super::commit::lock;
use super::tracker::OffsetTracker;
use crate::config::Config;

/// The consumer type both stages use.
pub type StageConsumer = StreamConsumer<StageContext>;

/// Client configuration every client starts from: bootstrap servers, then the
/// `[kafka]` passthrough table, which may override anything below it.
pub fn base_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set_log_level(RDKafkaLogLevel::Warning);
    for (key, value) in &config.kafka {
        client.set(key, value);
    }
    client
}

/// Consumer context: keeps the offset tracker in step with the group's
/// assignment, reports commit failures and exports the consumer lag.
pub struct StageContext {
    pub(crate) tracker: Arc<Mutex<OffsetTracker>>,
    /// Messages behind the partitions' ends, summed over the assigned
    /// partitions (from librdkafka's statistics).
    lag: Gauge,
}

/// How often librdkafka reports statistics (and so the lag gauge updates).
const STATISTICS_INTERVAL_MS: &str = "5000";

impl ClientContext for StageContext {
    fn stats(&self, statistics: Statistics) {
        // librdkafka reports -1 for partitions without a known lag.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.lag.set(lag);
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            tracing::info!(partitions = %describe(tpl), "partitions revoked");
            self.reset(tpl);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = %describe(tpl), "partitions assigned");
                self.reset(tpl);
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!(offsets = %describe(offsets), "offsets committed"),
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            // A member left or joined meanwhile; the offsets stay stored and
            // the next commit after the rebalance carries them (librdkafka
            // #4059). Expected when a worker of the group stops.
            Err(KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::RebalanceInProgress
                | rdkafka::types::RDKafkaErrorCode::IllegalGeneration,
            )) => tracing::info!(offsets = %describe(offsets), "offset commit deferred: group rebalancing"),
            Err(e) => tracing::warn!(error = %e, offsets = %describe(offsets), "offset commit failed"),
        }
    }
}

impl StageContext {
    fn reset(&self, tpl: &TopicPartitionList) {
        let mut tracker = lock(&self.tracker);
        for element in tpl.elements() {
            tracker.reset(element.topic(), element.partition());
        }
    }
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
/// `lag` receives the consumer lag every few seconds.
pub fn create_consumer(config: &Config, group_id: &str, lag: Gauge) -> KafkaResult<StageConsumer> {
    let mut client = base_config(config);
    client
        .set("group.id", group_id)
        .set("statistics.interval.ms", STATISTICS_INTERVAL_MS)
        .set("auto.offset.reset", "earliest")
        // Incremental rebalances: a member joining or leaving moves only the
        // partitions that change owner, so in-flight work elsewhere is not
        // revoked and redone.
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("auto.commit.interval.ms", "1000");
    // The two settings the delivery contract rests on; set after the
    // passthrough table so that it cannot turn them off.
    client
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false");
    client.create_with_context(StageContext {
        tracker: Arc::new(Mutex::new(OffsetTracker::new())),
        lag,
    })
}

/// An idempotent producer: acks from all in-sync replicas and no reordering
/// or duplication by the producer's own retries, so per-key order holds.
pub fn create_producer(config: &Config) -> KafkaResult<FutureProducer> {
    let mut client = ClientConfig::new();
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5");
    // Passthrough last: a deployment may tune batching and timeouts.
    for (key, value) in base_config(config).config_map() {
        client.set(key, value);
    }
    client.create()
}
