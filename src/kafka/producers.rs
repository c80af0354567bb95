//! The producers: plain (tools, clients), the stage's output producer
//! whose statistics say whether it is connected, the dead-letter producer
//! sized for every input the stage accepts, and under exactly_once the
//! worker's transactional producer. Idempotent, `acks=all`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaResult;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::statistics::Statistics;

use super::settings::{apply, client_brokers, ensure_statistics};
use crate::config::{ClientKind, Config};
use crate::health::Signal;

/// How long librdkafka tries to deliver one produced message before it
/// reports a failure, which the stage then retries or dead-letters
/// (librdkafka's default is 300 s).
const MESSAGE_TIMEOUT_MS: &str = "30000";

/// librdkafka's idempotent producer sends no new request for a partition
/// while this many of its messages or more are in flight
/// (`RD_KAFKA_IDEMP_MAX_INFLIGHT`; it counts messages, each batch adding
/// its own). A batch ready meanwhile waits, and the broker thread polls for
/// it without sleeping until an acknowledgement frees a place. A sender of
/// large messages (one request each, as a step's chunks of about 900 KB
/// against `batch.size`'s 1 MB) keeps at most this many in the producer.
pub const IDEMPOTENT_IN_FLIGHT: usize = 5;

/// How long a producer holds a message for others to join its produce
/// request (`linger.ms`). A `linger.ms` in `[kafka]` or `[kafka.producer]`
/// is set over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linger {
    /// 5 ms: for outputs that stream, none waiting on another (stage 1's
    /// hints, a tool's records), which then share requests.
    Shared,
    /// None: for stage 2's outputs at least once. A step is its chunks
    /// (each a request of its own, five at a time), then, once they are
    /// acknowledged, its hint outcomes (all at once), then its metrics. Only
    /// the outcomes could share requests by waiting; each wait delayed the
    /// step. At 5 ms a step of 10,000 rows took about 15 ms from its last
    /// input to its metrics, and 3-5 ms without (docs/BENCHMARKS.md, round
    /// twenty-six). A step's outcomes may then take a few requests, and
    /// librdkafka's broker thread polls without sleeping while those of one
    /// partition wait behind five in flight: about a round trip a step.
    Off,
}

impl Linger {
    fn ms(self) -> &'static str {
        match self {
            Linger::Shared => "5",
            Linger::Off => "0",
        }
    }
}

/// An idempotent producer: acks from all in-sync replicas and no reordering
/// or duplication by the producer's own retries, so per-key order holds.
pub fn create_producer(config: &Config) -> KafkaResult<FutureProducer> {
    create_producer_lingering(config, Linger::Shared)
}

/// [`create_producer`]'s, holding messages as `linger` says.
pub fn create_producer_lingering(config: &Config, linger: Linger) -> KafkaResult<FutureProducer> {
    producer_config(config, linger).create()
}

fn producer_config(config: &Config, linger: Linger) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set_log_level(RDKafkaLogLevel::Warning);
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger.ms())
        .set("message.timeout.ms", MESSAGE_TIMEOUT_MS);
    // Passthrough last: a deployment may tune batching and timeouts.
    apply(&mut client, config, ClientKind::Producer);
    client
}

/// A stage's dead-letter producer: [`create_producer`]'s settings, taking
/// messages of at least `message_max_bytes` (`kafka::dlq::dlq_message_max_bytes`;
/// a larger `message.max.bytes` set in `[kafka]` stays).
pub fn create_dlq_producer(config: &Config, message_max_bytes: usize) -> KafkaResult<FutureProducer> {
    let mut client = producer_config(config, Linger::Shared);
    raise_message_max_bytes(&mut client, message_max_bytes);
    client.create()
}

/// Sets `message.max.bytes` to at least `at_least`; a larger one set in
/// `[kafka]` stays.
fn raise_message_max_bytes(client: &mut ClientConfig, at_least: usize) {
    let configured = client
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    client.set("message.max.bytes", configured.max(at_least).to_string());
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
        let brokers: Vec<_> = client_brokers(&statistics).collect();
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
/// dead letters: [`create_stage_producer`]'s settings, lingering as
/// [`Linger::Shared`] whatever the stage's outputs (a transaction hands
/// over every ready record at once, and its commit sends what lingers), with
/// `transactional.id` and `transaction.timeout.ms`, and a
/// `message.max.bytes` of at least `message_max_bytes` (the dead letters'
/// need; a larger one set in `[kafka]` stays). Transactions are
/// initialised by [`Transactions::init`](super::Transactions::init).
pub fn create_transactional_producer(
    config: &Config,
    transactional_id: &str,
    message_max_bytes: usize,
    connected: Arc<Signal>,
) -> KafkaResult<StageProducer> {
    let mut client = producer_config(config, Linger::Shared);
    ensure_statistics(&mut client);
    raise_message_max_bytes(&mut client, message_max_bytes);
    // librdkafka refuses a message timeout longer than the transaction's.
    let message_timeout = client
        .get("message.timeout.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX)
        .min(config.kafka.transaction_timeout_ms);
    client
        .set("message.timeout.ms", message_timeout.to_string())
        .set("transactional.id", transactional_id)
        .set(
            "transaction.timeout.ms",
            config.kafka.transaction_timeout_ms.to_string(),
        );
    client.create_with_context(OutputContext { connected })
}

/// How long [`connect_output`]'s questions for the producer id may take in
/// all: they only speed it up (librdkafka's own timer asks 500 ms after the
/// producer is made), so a start does not wait on them longer than this.
const PRODUCER_ID_QUESTIONS: Duration = Duration::from_secs(1);

/// Asks `topic`'s metadata through `producer`: whether a broker answered
/// within `within`. Blocking (a start-up step; the caller runs it off the
/// runtime). Then, within [`PRODUCER_ID_QUESTIONS`], partition 0's
/// offsets, which connects the broker that leads it, and the metadata
/// again, so that the (idempotent) producer asks for its producer id at
/// once.
///
/// librdkafka asks for the id when it reads a metadata answer while a
/// broker it learned from metadata is up, and otherwise on a 500 ms timer.
/// The first answer retires the bootstrap broker before the question is
/// asked, and the producer's own attempt to connect another broker does
/// nothing while the bootstrap one still counts as up. So about one start
/// in three had no broker to ask and held its first outputs back until the
/// timer (docs/BENCHMARKS.md, round twenty-three). What the two later
/// questions answer, or their timeout, changes nothing else.
pub fn connect_output<C: ClientContext>(producer: &FutureProducer<C>, topic: &str, within: Duration) -> bool {
    let client = producer.client();
    if client.fetch_metadata(Some(topic), within).is_err() {
        return false;
    }
    let deadline = Instant::now() + PRODUCER_ID_QUESTIONS;
    let left = || deadline.saturating_duration_since(Instant::now());
    let _ = client.fetch_watermarks(topic, 0, left());
    let _ = client.fetch_metadata(Some(topic), left());
    true
}

/// The stage's output producer: [`create_producer`]'s settings, holding
/// messages as `linger` says, with statistics on so that `connected` tracks
/// its broker connection.
pub fn create_stage_producer(
    config: &Config,
    connected: Arc<Signal>,
    linger: Linger,
) -> KafkaResult<StageProducer> {
    let mut client = producer_config(config, linger);
    ensure_statistics(&mut client);
    client.create_with_context(OutputContext { connected })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linger_ms(config: &Config, linger: Linger) -> Option<String> {
        producer_config(config, linger)
            .get("linger.ms")
            .map(str::to_string)
    }

    #[test]
    fn a_producer_lingers_as_its_outputs_need_unless_the_deployment_sets_it() {
        let config = Config::default();
        assert_eq!(linger_ms(&config, Linger::Shared).as_deref(), Some("5"));
        assert_eq!(linger_ms(&config, Linger::Off).as_deref(), Some("0"));
        for table in ["kafka", "producer"] {
            let mut set = Config::default();
            if table == "kafka" {
                set.kafka.insert("linger.ms", "400");
            } else {
                set.kafka.producer.insert("linger.ms".into(), 400i64.into());
            }
            for linger in [Linger::Shared, Linger::Off] {
                assert_eq!(
                    linger_ms(&set, linger).as_deref(),
                    Some("400"),
                    "[{table}] {linger:?}"
                );
            }
        }
    }

    #[test]
    fn message_max_bytes_is_raised_to_what_dead_letters_need_and_never_lowered() {
        let max_bytes = |configured: Option<&str>, at_least: usize| {
            let mut config = Config::default();
            if let Some(value) = configured {
                config.kafka.insert("message.max.bytes", value);
            }
            let mut client = producer_config(&config, Linger::Shared);
            raise_message_max_bytes(&mut client, at_least);
            client.get("message.max.bytes").map(str::to_string)
        };
        assert_eq!(max_bytes(None, 2_000_000).as_deref(), Some("2000000"));
        assert_eq!(max_bytes(Some("1000000"), 2_000_000).as_deref(), Some("2000000"));
        assert_eq!(max_bytes(Some(" 5000000"), 2_000_000).as_deref(), Some("5000000"));
    }
}
