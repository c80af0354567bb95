//! What `[hints]` and `[advantages]` have in common: where a stage reads,
//! writes and reports, and how much it holds at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::kafka::DrainBound;

/// The most `max_in_flight` accepted: beyond it the value is a typo, and
/// exits 2 instead of failing at start-up.
pub const MAX_IN_FLIGHT_MESSAGES: usize = 100_000_000;
/// The most `max_in_flight_bytes` accepted (1 TiB), for the same reason.
pub const MAX_IN_FLIGHT_BYTES: u64 = 1 << 40;

/// What each stage has in common: where it reads, writes and reports, and
/// its bounds. (No `deny_unknown_fields` here: it is flattened into each
/// stage's section, which reports unknown keys itself.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageConfig {
    /// Consumer group; processes with the same id share the partitions
    /// (`--group-id`).
    pub group_id: String,
    /// The topic the stage reads (`--input-topic`).
    pub input_topic: String,
    /// The topic the stage writes its results to (`--output-topic`).
    pub output_topic: String,
    /// Dead-letter topic for input that can never be processed
    /// (`--dlq-topic`).
    pub dlq_topic: String,
    /// Where the stage serves `/metrics` (Prometheus), `/healthz` and
    /// `/readyz`, as `HOST:PORT` with a numeric host (`--metrics-addr`);
    /// port 0 picks a free port and logs it.
    pub metrics_addr: String,
    /// Messages taken off Kafka but not yet finished (1 to 100,000,000);
    /// intake pauses at this bound, which also bounds redelivery after a
    /// crash. For stage 2 it bounds a JSON step's rows (its `step_end`
    /// included).
    pub max_in_flight: usize,
    /// Bytes held at once (1 to 1 TiB). Stage 1 counts a message's payload
    /// twice (its bytes, and the decoded trajectory a group keeps of its
    /// best member) and pauses intake at this bound; stage 2 counts messages, decoded rows and ~1 KB a parked
    /// message (near its resident memory) and dead-letters the oldest
    /// incomplete step (`step_evicted`) to stay under it. Stage 1 sets
    /// librdkafka's prefetch queue (`queued.max.messages.kbytes`) to it,
    /// within 1 to 64 MiB; stage 2 keeps librdkafka's 64 MiB. A partition's
    /// fetch (`max.partition.fetch.bytes`) is a quarter of the queue, within
    /// 1 to 16 MiB, and a full queue pauses fetching for 10 ms
    /// (`fetch.queue.backoff.ms`; `[kafka.consumer]` may set all three).
    pub max_in_flight_bytes: u64,
    /// On SIGTERM/SIGINT, and when partitions are revoked, how long in-flight
    /// work may take to finish and commit before it is dropped uncommitted,
    /// in seconds. It must be under `session.timeout.ms` (the classic group
    /// protocol) or `max.poll.interval.ms` (KIP-848's), else exit 2.
    pub drain_timeout_secs: u64,
}

/// Keys a stage section does not know, collected so that `validate` can name
/// them (serde cannot deny unknown fields next to a flattened struct).
pub(super) type UnknownKeys = BTreeMap<String, serde_json::Value>;

fn default_max_in_flight() -> usize {
    1000
}

fn default_drain_timeout_secs() -> u64 {
    20
}

impl StageConfig {
    /// A stage reading `input` (dead letters to `<input>.dlq`) and writing
    /// `output`, with the common defaults.
    pub(super) fn new(
        group_id: &str,
        input: &str,
        output: &str,
        metrics_addr: &str,
        max_in_flight_bytes: u64,
    ) -> Self {
        StageConfig {
            group_id: group_id.into(),
            input_topic: input.into(),
            output_topic: output.into(),
            dlq_topic: format!("{input}.dlq"),
            metrics_addr: metrics_addr.into(),
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes,
            drain_timeout_secs: default_drain_timeout_secs(),
        }
    }

    /// `max_in_flight_bytes` as a usize (saturating on 32-bit targets).
    pub fn max_in_flight_bytes(&self) -> usize {
        usize::try_from(self.max_in_flight_bytes).unwrap_or(usize::MAX)
    }

    /// The parsed metrics address.
    pub fn metrics_socket(&self) -> Result<SocketAddr, ConfigError> {
        self.metrics_addr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics_addr {:?} is not HOST:PORT with a numeric host (for example 127.0.0.1:9464; port 0 picks a free one)",
                self.metrics_addr
            ))
        })
    }

    /// The rules of section `[name]`; `drain` is what a drain on revoke
    /// must stay under ([`KafkaConfig::drain_bound`](super::KafkaConfig::drain_bound)).
    pub fn validate(&self, name: &str, drain: &DrainBound) -> Result<(), ConfigError> {
        for (key, value) in [
            ("input_topic", &self.input_topic),
            ("output_topic", &self.output_topic),
            ("dlq_topic", &self.dlq_topic),
            ("group_id", &self.group_id),
        ] {
            if value.trim().is_empty() {
                return invalid(format!("{name}.{key} is empty"));
            }
        }
        if self.input_topic == self.dlq_topic || self.input_topic == self.output_topic {
            return invalid(format!(
                "{name}: input_topic {:?} must differ from output_topic and dlq_topic",
                self.input_topic
            ));
        }
        self.validate_bounds(name)?;
        let drain_ms = self.drain_timeout_secs.saturating_mul(1000);
        if drain_ms >= drain.ms {
            return invalid(format!(
                "{name}.drain_timeout_secs ({}s) must be shorter than {} ({} ms), {}",
                self.drain_timeout_secs, drain.setting, drain.ms, drain.consequence
            ));
        }
        self.metrics_socket().map(drop)
    }

    /// What the stage may hold at once.
    fn validate_bounds(&self, name: &str) -> Result<(), ConfigError> {
        if !(1..=MAX_IN_FLIGHT_MESSAGES).contains(&self.max_in_flight) {
            return invalid(format!(
                "{name}.max_in_flight = {} must be within 1..={MAX_IN_FLIGHT_MESSAGES}",
                self.max_in_flight
            ));
        }
        if !(1..=MAX_IN_FLIGHT_BYTES).contains(&self.max_in_flight_bytes) {
            return invalid(format!(
                "{name}.max_in_flight_bytes = {} must be within 1..={MAX_IN_FLIGHT_BYTES} (1 TiB)",
                self.max_in_flight_bytes
            ));
        }
        Ok(())
    }
}

/// Names the first key of `[name]` that no field took.
pub(super) fn deny_unknown(name: &str, unknown: &UnknownKeys) -> Result<(), ConfigError> {
    match unknown.keys().next() {
        Some(key) => invalid(format!(
            "unknown key `{name}.{key}`; see hintstream.example.toml for the keys of [{name}]"
        )),
        None => Ok(()),
    }
}
