//! The group consumer both stages read with: the settings the
//! at-least-once and exactly-once contracts rest on (no automatic offset
//! store; under exactly_once no automatic commit; `read_committed`),
//! incremental rebalances, and a prefetch bound that pauses fetching only
//! briefly, with a partition's fetch sized to it.

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaResult;

use super::context::StageContext;
use super::settings::{apply, consumer_defaults, ensure_statistics, LIBRDKAFKA_QUEUE_BYTES};
use crate::config::{ClientKind, Config, GroupProtocol};

/// The consumer type both stages use.
pub type StageConsumer = StreamConsumer<StageContext>;

/// A group consumer for at-least-once processing: offsets are committed on a
/// timer, but only offsets the [`Committer`](super::Committer) stored.
/// `prefetch_bytes` bounds what librdkafka fetches ahead of the stage.
pub fn create_consumer(
    config: &Config,
    group_id: &str,
    context: StageContext,
    prefetch_bytes: Option<usize>,
) -> KafkaResult<StageConsumer> {
    consumer_config(config, group_id, prefetch_bytes).create_with_context(context)
}

/// [`create_consumer`]'s settings.
fn consumer_config(config: &Config, group_id: &str, prefetch_bytes: Option<usize>) -> ClientConfig {
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
    let mut queue_bytes = LIBRDKAFKA_QUEUE_BYTES;
    if let Some(bytes) = prefetch_bytes {
        // librdkafka's default (64 MiB) would let prefetched messages alone
        // exceed a small in-flight byte bound.
        let kbytes = (bytes / 1024).clamp(1024, LIBRDKAFKA_QUEUE_BYTES / 1024);
        client.set("queued.max.messages.kbytes", kbytes.to_string());
        queue_bytes = kbytes * 1024;
    }
    consumer_defaults(&mut client, config, queue_bytes);
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
    client
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::settings::FETCH_QUEUE_BACKOFF_MS;

    /// What the stage consumer's settings set `key` to.
    fn property(config: &Config, prefetch_bytes: Option<usize>, key: &str) -> Option<String> {
        consumer_config(config, "g", prefetch_bytes)
            .get(key)
            .map(str::to_string)
    }

    /// A config with `key = value` in `[kafka]` (`table` "kafka") or in
    /// `[kafka.consumer]`.
    fn set_in(table: &str, key: &str, value: &str) -> Config {
        let mut config = Config::default();
        if table == "kafka" {
            config.kafka.insert(key, value);
        } else {
            config.kafka.consumer.insert(key.into(), value.into());
        }
        config
    }

    #[test]
    fn a_full_prefetch_queue_pauses_fetching_briefly_unless_the_deployment_sets_it() {
        let backoff = |config: &Config| property(config, Some(1 << 20), "fetch.queue.backoff.ms");
        assert_eq!(
            backoff(&Config::default()).as_deref(),
            Some(FETCH_QUEUE_BACKOFF_MS)
        );
        for table in ["kafka", "consumer"] {
            let set = set_in(table, "fetch.queue.backoff.ms", "250");
            assert_eq!(backoff(&set).as_deref(), Some("250"), "[{table}]");
        }
    }

    #[test]
    fn a_partition_fetch_is_a_quarter_of_the_prefetch_queue_within_1_to_16_mib() {
        let partition_fetch = |config: &Config, prefetch: Option<usize>| {
            property(config, prefetch, "max.partition.fetch.bytes")
        };
        let config = Config::default();
        // A queue of librdkafka's default and over: 16 MiB.
        assert_eq!(partition_fetch(&config, None).as_deref(), Some("16777216"));
        assert_eq!(
            partition_fetch(&config, Some(2 << 30)).as_deref(),
            Some("16777216")
        );
        // Between: a quarter of the queue, itself the bound within 1-64 MiB.
        assert_eq!(
            partition_fetch(&config, Some(32 << 20)).as_deref(),
            Some("8388608")
        );
        // Small bounds: librdkafka's default, as before.
        for bound in [4 << 20, 2 << 20, 64 << 10] {
            assert_eq!(
                partition_fetch(&config, Some(bound)).as_deref(),
                Some("1048576"),
                "{bound}"
            );
        }
        // A queue the deployment sets is the one the fetch is a quarter of.
        for (table, kbytes, want) in [("kafka", "8192", "2097152"), ("consumer", "4096", "1048576")] {
            let queue = set_in(table, "queued.max.messages.kbytes", kbytes);
            for bound in [None, Some(2 << 30)] {
                assert_eq!(
                    partition_fetch(&queue, bound).as_deref(),
                    Some(want),
                    "[{table}] {bound:?}"
                );
            }
        }
        // The consumer's own table over `[kafka]`, as librdkafka gets them.
        let mut both = set_in("kafka", "queued.max.messages.kbytes", "65536");
        both.kafka
            .consumer
            .insert("queued.max.messages.kbytes".into(), 8192i64.into());
        assert_eq!(partition_fetch(&both, None).as_deref(), Some("2097152"));
        // The deployment's, under either of its names and in either table,
        // is the one left.
        let set = set_in("consumer", "max.partition.fetch.bytes", "2000000");
        assert_eq!(partition_fetch(&set, None).as_deref(), Some("2000000"));
        for table in ["kafka", "consumer"] {
            let alias = set_in(table, "fetch.message.max.bytes", "2000000");
            assert_eq!(partition_fetch(&alias, None), None, "[{table}]");
            assert_eq!(
                property(&alias, None, "fetch.message.max.bytes").as_deref(),
                Some("2000000"),
                "[{table}]"
            );
        }
    }
}
