//! The librdkafka settings every client starts from: bootstrap servers,
//! then the `[kafka]` passthrough table and the client kind's own table,
//! and statistics (readiness rests on them); a consumer's brief fetch
//! backoff, under the tables. The consumer's settings the
//! delivery contract depends on (no automatic offset store, the commit
//! mode, `read_committed`) are set over these where it is made
//! (`consumer`), so that no table turns them off. The producers' `acks=all`
//! and idempotence are set before them (`producers`): a deployment may
//! change them, for a broker without idempotent producers, at the cost of
//! per-key order and of duplicates on a retry.

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::statistics::{Broker, Statistics};

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
        brief_fetch_backoff(&mut client);
    }
    apply(&mut client, config, kind);
    client
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
pub(crate) fn brief_fetch_backoff(client: &mut ClientConfig) {
    client.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
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

    #[test]
    fn every_consumer_pauses_a_full_queue_briefly_and_no_other_client_is_told_to() {
        let backoff = |config: &Config, kind| {
            client_config(config, kind)
                .get("fetch.queue.backoff.ms")
                .map(str::to_string)
        };
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
}
