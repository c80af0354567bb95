//! The librdkafka settings every client starts from: bootstrap servers,
//! then the `[kafka]` passthrough table and the client kind's own table,
//! and statistics (readiness rests on them); a consumer's brief fetch
//! backoff and its partition's fetch size, under the tables. The consumer's settings the
//! delivery contract depends on (no automatic offset store, the commit
//! mode, `read_committed`) are set over these where it is made
//! (`consumer`), so that no table turns them off. The producers' `acks=all`
//! and idempotence are set before them (`producers`): a deployment may
//! change them, for a broker without idempotent producers, at the cost of
//! per-key order and of duplicates on a retry.

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::statistics::{Broker, Statistics};

use crate::config::kafka::LIBRDKAFKA_QUEUE_KBYTES;
use crate::config::{ClientKind, Config};

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
    if kind == ClientKind::Consumer {
        consumer_defaults(&mut client, config, LIBRDKAFKA_QUEUE_BYTES);
    }
    apply(&mut client, config, kind);
    client
}

/// A consumer's own defaults, set before the passthrough tables (which may
/// set their own): the brief fetch backoff, and a partition's share of a
/// fetch sized to the consumer's prefetch queue of `queue_bytes`.
pub(crate) fn consumer_defaults(client: &mut ClientConfig, config: &Config, queue_bytes: usize) {
    brief_fetch_backoff(client);
    partition_fetch(client, config, queue_bytes);
}

/// How long librdkafka waits before fetching a partition again once the
/// local queue holds `queued.min.messages` or `queued.max.messages.kbytes`
/// (a stage's is set from its byte bound). Its default, 1000 ms, stops a
/// consumer that drains its queue quicker than that for the rest of the
/// second: with `hints.max_in_flight_bytes` at 4 MiB, stage 1 took
/// 15,000-17,000 static hints a second instead of 81,000-117,000
/// (docs/BENCHMARKS.md, round thirty-two). A waiting partition is looked
/// at again after this long, with no request sent while the queue is
/// still full.
pub(crate) const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// Sets a consumer's [`FETCH_QUEUE_BACKOFF_MS`]; the passthrough tables,
/// applied after, may set their own.
fn brief_fetch_backoff(client: &mut ClientConfig) {
    client.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
}

/// librdkafka's prefetch queue (`queued.max.messages.kbytes`) by default:
/// the readers built by [`client_config`] have it.
pub(crate) const LIBRDKAFKA_QUEUE_BYTES: usize = LIBRDKAFKA_QUEUE_KBYTES as usize * 1024;

/// The least and the most a consumer asks of one partition in a fetch
/// (`max.partition.fetch.bytes`); between them, a quarter of its prefetch
/// queue. librdkafka's default, the least, is 1 MiB: a fetch then carries
/// one Arrow chunk (each up to ~900 KB) of a partition, so a consumer
/// behind on a step's chunks caught up one round trip a chunk. With 16 MiB
/// a stage-2 worker had 14-42 ms of a 1M-row step left to take after the
/// trainer's last acknowledgement, against 73-137 ms, summed over a set's
/// six rounds (docs/BENCHMARKS.md, round thirty-three). A response brings
/// at most about the queue: unless a deployment sets `fetch.max.bytes`,
/// librdkafka lowers its 50 MB to the queue (and raises it to
/// `message.max.bytes`). It looks at the queue before it asks, so the queue
/// can hold that much more for a moment, as it could hold a partition's
/// 1 MiB more before.
const MIN_PARTITION_FETCH_BYTES: usize = 1 << 20;
const MAX_PARTITION_FETCH_BYTES: usize = 16 << 20;

/// Sets `max.partition.fetch.bytes` to a quarter of the consumer's queue,
/// within [`MIN_PARTITION_FETCH_BYTES`] and [`MAX_PARTITION_FETCH_BYTES`]:
/// `queue_bytes`, or the tables' `queued.max.messages.kbytes` when they set
/// it (a number, as the config's check made sure). Not when the tables
/// set the fetch under its other name,
/// `fetch.message.max.bytes` (the two would then race in librdkafka's
/// configuration; under this name the tables, applied after, replace it).
/// The trainer's Python client sets the same (`consumer_settings`); both
/// suites read `schemas/vectors/fetch.json`.
fn partition_fetch(client: &mut ClientConfig, config: &Config, queue_bytes: usize) {
    if config
        .kafka
        .get(ClientKind::Consumer, "fetch.message.max.bytes")
        .is_some()
    {
        return;
    }
    let queue_bytes = match config.kafka.prefetch_queue_kbytes() {
        Ok(Some(kbytes)) => usize::try_from(kbytes).map_or(usize::MAX, |k| k.saturating_mul(1024)),
        _ => queue_bytes,
    };
    let bytes = (queue_bytes / 4).clamp(MIN_PARTITION_FETCH_BYTES, MAX_PARTITION_FETCH_BYTES);
    client.set("max.partition.fetch.bytes", bytes.to_string());
}

/// Sets bootstrap servers and the passthrough properties of `kind` on
/// `client`, over what it has. (From the config itself: rdkafka's
/// `ClientConfig::config_map` shows `sasl.password` as a placeholder, so
/// copying one client config into another would lose the password.)
pub(crate) fn apply(client: &mut ClientConfig, config: &Config, kind: ClientKind) {
    client.set("bootstrap.servers", &config.bootstrap_servers);
    for (key, value) in config.kafka.properties(kind) {
        client.set(key, value);
    }
}

/// How often librdkafka reports statistics, and so how often the lag gauge
/// and the clients' parts of readiness update.
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Sets `statistics.interval.ms` unless the passthrough tables set a
/// positive value: readiness rests on statistics, so 0 (off) is not allowed.
pub(crate) fn ensure_statistics(client: &mut ClientConfig) {
    let set = client
        .get("statistics.interval.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|ms| ms > 0);
    if !set {
        client.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
}

/// The brokers a client's statistics list that are real ones, bootstrap or
/// learned: not librdkafka's internal and logical "brokers".
pub(crate) fn client_brokers(statistics: &Statistics) -> impl Iterator<Item = &Broker> {
    statistics
        .brokers
        .values()
        .filter(|b| b.source == "learned" || b.source == "configured")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`client_config`] sets `key` to for a client of `kind`.
    fn property(config: &Config, kind: ClientKind, key: &str) -> Option<String> {
        client_config(config, kind).get(key).map(str::to_string)
    }

    #[test]
    fn every_consumer_pauses_a_full_queue_briefly_and_no_other_client_is_told_to() {
        let backoff = |config: &Config, kind| property(config, kind, "fetch.queue.backoff.ms");
        let config = Config::default();
        assert_eq!(
            backoff(&config, ClientKind::Consumer).as_deref(),
            Some(FETCH_QUEUE_BACKOFF_MS)
        );
        // A producer would log that the consumer property is ignored.
        assert_eq!(backoff(&config, ClientKind::Producer), None);
        assert_eq!(backoff(&config, ClientKind::Other), None);
        let mut set = Config::default();
        set.kafka
            .consumer
            .insert("fetch.queue.backoff.ms".into(), 250i64.into());
        assert_eq!(backoff(&set, ClientKind::Consumer).as_deref(), Some("250"));
    }

    #[test]
    fn a_reader_fetches_up_to_16_mib_of_a_partition_and_no_other_client_is_told_to() {
        let fetch = |kind| property(&Config::default(), kind, "max.partition.fetch.bytes");
        assert_eq!(
            fetch(ClientKind::Consumer),
            Some(MAX_PARTITION_FETCH_BYTES.to_string())
        );
        assert_eq!(fetch(ClientKind::Producer), None);
        assert_eq!(fetch(ClientKind::Other), None);
    }

    /// The vectors both languages read (`schemas/vectors/fetch.json`;
    /// python/tests/test_consumer_settings.py), given in `[kafka.consumer]`
    /// to a reader.
    #[test]
    fn a_readers_partition_fetch_matches_the_shared_vectors() {
        let vectors = crate::messages::vectors::shared("fetch.json");
        let cases = vectors["cases"].as_array().unwrap();
        assert!(cases.len() >= 10, "{} cases", cases.len());
        for case in cases {
            let mut config = Config::default();
            for (key, value) in case["given"].as_object().unwrap() {
                let value = match value {
                    serde_json::Value::String(s) => s.as_str().into(),
                    number => number.as_i64().unwrap().into(),
                };
                config.kafka.consumer.insert(key.clone(), value);
            }
            config.kafka.validate().unwrap();
            let expected = case["max.partition.fetch.bytes"].as_u64().map(|b| b.to_string());
            assert_eq!(
                property(&config, ClientKind::Consumer, "max.partition.fetch.bytes"),
                expected,
                "{}",
                case["case"]
            );
        }
    }
}
