//! The librdkafka settings every client starts from: bootstrap servers,
//! then the `[kafka]` passthrough table and the client kind's own table,
//! and statistics (readiness rests on them). The consumer's settings the
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
    apply(&mut client, config, kind);
    client
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
