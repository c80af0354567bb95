//! The `[kafka]` section: librdkafka properties passed through to every
//! client, with optional `[kafka.consumer]` and `[kafka.producer]` tables for
//! one client kind only. Values may be TOML strings, integers, floats or
//! booleans; librdkafka gets them as strings. The two properties other
//! settings are checked against, `session.timeout.ms` and the producers'
//! `message.max.bytes`, are read here. A few keys of `[kafka]` are ours, not
//! librdkafka's ([`OUR_KEYS`]: the delivery guarantee and its transactions,
//! the worker id and static membership); they never reach a client.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// librdkafka's default `message.max.bytes`, when `[kafka]` does not set it.
pub const LIBRDKAFKA_MESSAGE_MAX_BYTES: u64 = 1_000_000;
/// librdkafka's default `session.timeout.ms`, when `[kafka]` does not set it.
const LIBRDKAFKA_SESSION_TIMEOUT_MS: u64 = 45_000;
/// librdkafka's range of `session.timeout.ms`.
const SESSION_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=3_600_000;
/// librdkafka's default `max.poll.interval.ms`, when `[kafka]` does not set it.
const LIBRDKAFKA_MAX_POLL_INTERVAL_MS: u64 = 300_000;
/// librdkafka's default `metadata.recovery.rebootstrap.trigger.ms`, when
/// `[kafka]` does not set it.
const LIBRDKAFKA_REBOOTSTRAP_TRIGGER_MS: u64 = 300_000;
/// The consumer properties the broker owns under `group.protocol=consumer`
/// (librdkafka refuses them there), with what to set instead.
const CLASSIC_ONLY: [(&str, &str); 4] = [
    (
        "session.timeout.ms",
        "the broker's group.consumer.session.timeout.ms",
    ),
    (
        "heartbeat.interval.ms",
        "the broker's group.consumer.heartbeat.interval.ms",
    ),
    (
        "partition.assignment.strategy",
        "group.remote.assignor (or the broker's group.consumer.assignors)",
    ),
    (
        "group.protocol.type",
        "nothing: the consumer protocol has one type",
    ),
];

/// The consumer group protocol (`group.protocol`): the `classic` one, whose
/// members assign partitions among themselves (we ask for
/// `cooperative-sticky`) and keep their session with `session.timeout.ms`;
/// or KIP-848's `consumer`, where the broker assigns partitions and owns the
/// session timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    Classic,
    Consumer,
}

/// What a stage's drain on revoke must stay shorter than, and its name for
/// the error that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainBound {
    pub ms: u64,
    /// The setting, as the config names it.
    pub setting: &'static str,
    /// What happens past it.
    pub consequence: &'static str,
}

/// The keys of `[kafka]` that are hintstream's own settings: never passed
/// to librdkafka.
pub const OUR_KEYS: &[&str] = &[
    "delivery",
    "transaction_interval_ms",
    "transactional_id_prefix",
    "transaction_timeout_ms",
    "worker_id",
    "static_membership",
];

/// librdkafka properties that hintstream sets itself from its own keys; a
/// passthrough table may not set them.
const RESERVED_PROPERTIES: &[(&str, &str)] = &[
    (
        "transactional.id",
        "kafka.transactional_id_prefix and --worker-id",
    ),
    ("transaction.timeout.ms", "kafka.transaction_timeout_ms"),
    ("group.instance.id", "kafka.static_membership and --worker-id"),
];

/// The range of `transaction_interval_ms`.
const TRANSACTION_INTERVAL_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;
/// The range of `transaction_timeout_ms` (the broker's default
/// `transaction.max.timeout.ms` is 900000: a longer one is refused by it).
const TRANSACTION_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=900_000;
/// The longest transactional-id prefix and worker id accepted.
const MAX_ID_PART_CHARS: usize = 100;
/// The longest `group.instance.id` a broker accepts (Kafka checks it as it
/// checks a topic name: at most 249 of `[A-Za-z0-9._-]`).
const MAX_GROUP_INSTANCE_ID_CHARS: usize = 249;

/// The delivery guarantee of both stages (`kafka.delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// Outputs are produced, then the inputs' offsets committed: a crash
    /// may publish an output twice, never lose one.
    #[default]
    AtLeastOnce,
    /// Outputs and the inputs' offsets go in one Kafka transaction per
    /// `transaction_interval_ms`: a `read_committed` reader sees each once.
    ExactlyOnce,
}

fn default_transaction_interval_ms() -> u64 {
    100
}

fn default_transactional_id_prefix() -> String {
    "hintstream".into()
}

fn default_transaction_timeout_ms() -> u64 {
    60_000
}

/// One property value, as TOML wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum KafkaValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl fmt::Display for KafkaValue {
    /// The string librdkafka takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaValue::Bool(b) => write!(f, "{b}"),
            KafkaValue::Int(i) => write!(f, "{i}"),
            KafkaValue::Float(x) => write!(f, "{x}"),
            KafkaValue::Text(s) => f.write_str(s),
        }
    }
}

impl From<String> for KafkaValue {
    fn from(s: String) -> Self {
        KafkaValue::Text(s)
    }
}

impl From<&str> for KafkaValue {
    fn from(s: &str) -> Self {
        KafkaValue::Text(s.to_string())
    }
}

impl From<i64> for KafkaValue {
    fn from(i: i64) -> Self {
        KafkaValue::Int(i)
    }
}

impl From<bool> for KafkaValue {
    fn from(b: bool) -> Self {
        KafkaValue::Bool(b)
    }
}

/// Which clients a property applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    Consumer,
    Producer,
    /// Admin clients and start-up probes: the common table only.
    Other,
}

/// librdkafka properties by client kind, and our own keys of `[kafka]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend(
    "x-key" = "librdkafka property",
    "x-key-doc" = "Any other key of `[kafka]` is a librdkafka property passed to every client \
                   (`\"security.protocol\" = \"SASL_SSL\"`, `\"compression.type\" = \"zstd\"`): a \
                   string, a number or a boolean, given to librdkafka as a string. Quote the dotted \
                   names. It has no variable of its own: the whole table does, \
                   `HINTSTREAM_KAFKA='{ \"security.protocol\" = \"SSL\" }'`. `transactional.id` and \
                   `transaction.timeout.ms` are refused (exit 2): hintstream sets them from its own keys."
))]
pub struct KafkaConfig {
    /// The delivery guarantee of both stages. Under `exactly_once` a
    /// `read_committed` reader sees each output once, through kills and
    /// rebalances; each worker then needs a stable `worker_id`.
    #[serde(default)]
    pub delivery: DeliveryMode,
    /// Under exactly_once: how often each worker commits its open
    /// transaction, in milliseconds (10 to 60,000): the longest an output
    /// waits for, besides its inputs.
    #[serde(default = "default_transaction_interval_ms")]
    pub transaction_interval_ms: u64,
    /// Under exactly_once: each worker's `transactional.id` is
    /// `<prefix>-<stage>-<worker id>` (`hintstream-hints-hints-0`): 1 to 100
    /// characters of A-Z, a-z, 0-9, `.`, `_` or `-`.
    #[serde(default = "default_transactional_id_prefix")]
    pub transactional_id_prefix: String,
    /// Under exactly_once: the longest one transaction may stay open, in
    /// milliseconds (1,000 to 900,000, the broker's default
    /// `transaction.max.timeout.ms`; librdkafka's `transaction.timeout.ms`);
    /// the broker aborts it after.
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// This worker's stable id (also `--worker-id`, or
    /// `HINTSTREAM_WORKER_ID`): required under exactly_once, the same across
    /// restarts of one worker (so that it fences its predecessor) and unique
    /// among its stage's workers; 1 to 100 characters of A-Z, a-z, 0-9, `.`,
    /// `_` or `-`. On Kubernetes, a StatefulSet's pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// Static group membership (KIP-345): each stage consumer joins with
    /// `group.instance.id` = `<group id>-<worker id>`, so that a worker
    /// restarted within the session timeout takes its partitions back
    /// without a rebalance. Needs a worker id, as exactly_once does. A
    /// static member sends no leave when it stops: after a scale-down its
    /// partitions wait for the session timeout before another member
    /// takes them.
    #[serde(default)]
    pub static_membership: bool,
    /// librdkafka properties of the consumers only, over `[kafka]`'s
    /// (`"group.protocol" = "consumer"`, `"session.timeout.ms" = 45000`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-key" = "librdkafka property"))]
    pub consumer: BTreeMap<String, KafkaValue>,
    /// librdkafka properties of the producers only, over `[kafka]`'s
    /// (`"compression.type" = "zstd"`, `"message.max.bytes" = 2000000`).
    /// A `linger.ms` here is set over hintstream's: 5, and 0 for stage 2's
    /// outputs at least once (a step's chunks each fill a request, and its
    /// outcomes and metrics wait for them, so waiting mostly delays it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-key" = "librdkafka property"))]
    pub producer: BTreeMap<String, KafkaValue>,
    /// Properties of every client (`[kafka]`).
    #[serde(flatten)]
    pub common: BTreeMap<String, KafkaValue>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            delivery: DeliveryMode::default(),
            transaction_interval_ms: default_transaction_interval_ms(),
            transactional_id_prefix: default_transactional_id_prefix(),
            transaction_timeout_ms: default_transaction_timeout_ms(),
            worker_id: None,
            static_membership: false,
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
            common: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// Whether the stages run under exactly-once delivery.
    pub fn exactly_once(&self) -> bool {
        self.delivery == DeliveryMode::ExactlyOnce
    }

    /// The `transactional.id` of a worker of `stage` (`hints` or
    /// `advantages`): `<prefix>-<stage>-<worker id>`; `None` under
    /// at_least_once. Under exactly_once without a worker id, an error that
    /// says what to set.
    pub fn transactional_id(&self, stage: &str) -> Result<Option<String>, ConfigError> {
        if !self.exactly_once() {
            return Ok(None);
        }
        match self.worker_id.as_deref().map(str::trim) {
            Some(id) if !id.is_empty() => Ok(Some(format!("{}-{stage}-{id}", self.transactional_id_prefix))),
            _ => invalid(
                "kafka.delivery = \"exactly_once\" needs a stable worker id: set --worker-id or \
                 HINTSTREAM_WORKER_ID (on Kubernetes, a StatefulSet's pod name, e.g. hints-0, through \
                 the downward API), the same across restarts of this worker and unique among its stage's workers",
            ),
        }
    }

    /// The consumers' `group.instance.id` in consumer group `group`:
    /// `<group>-<worker id>` under `static_membership`, else `None`. Without
    /// a worker id, or when the two make an id the broker would refuse, an
    /// error that says what to set.
    pub fn group_instance_id(&self, group: &str) -> Result<Option<String>, ConfigError> {
        if !self.static_membership {
            return Ok(None);
        }
        let Some(worker) = self
            .worker_id
            .as_deref()
            .map(str::trim)
            .filter(|id| !id.is_empty())
        else {
            return invalid(
                "kafka.static_membership = true needs a stable worker id: set --worker-id or \
                 HINTSTREAM_WORKER_ID (on Kubernetes, a StatefulSet's pod name, e.g. hints-0, through \
                 the downward API), the same across restarts of this worker and unique among its stage's workers",
            );
        };
        let id = format!("{group}-{worker}");
        let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if id.chars().count() > MAX_GROUP_INSTANCE_ID_CHARS || !id.chars().all(fine) {
            return invalid(format!(
                "kafka.static_membership: the group.instance.id {id:?} (<group id>-<worker id>) must be at most \
                 {MAX_GROUP_INSTANCE_ID_CHARS} characters of A-Z, a-z, 0-9, '.', '_' or '-': rename the group \
                 or turn static membership off"
            ));
        }
        Ok(Some(id))
    }

    /// Sets a property of every client.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<KafkaValue>) {
        self.common.insert(key.into(), value.into());
    }

    /// A property as a client of `kind` sees it (its own table first).
    pub fn get(&self, kind: ClientKind, key: &str) -> Option<String> {
        let own = match kind {
            ClientKind::Consumer => self.consumer.get(key),
            ClientKind::Producer => self.producer.get(key),
            ClientKind::Other => None,
        };
        own.or_else(|| self.common.get(key)).map(ToString::to_string)
    }

    /// Every property a client of `kind` gets, as librdkafka strings: the
    /// common table, then the kind's own table over it.
    pub fn properties(&self, kind: ClientKind) -> BTreeMap<String, String> {
        let own = match kind {
            ClientKind::Consumer => Some(&self.consumer),
            ClientKind::Producer => Some(&self.producer),
            ClientKind::Other => None,
        };
        self.common
            .iter()
            .chain(own.into_iter().flatten())
            .filter(|(k, _)| !OUR_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }

    /// The properties other settings are checked against must be numbers
    /// in librdkafka's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.group_protocol()? == GroupProtocol::Consumer {
            for (key, instead) in CLASSIC_ONLY {
                if self.get(ClientKind::Consumer, key).is_some() {
                    return invalid(format!(
                        "kafka.\"{key}\" is not supported with kafka.\"group.protocol\" = \"consumer\" \
                         (the broker owns it under KIP-848): remove it and set {instead}"
                    ));
                }
            }
        }
        self.drain_bound()?;
        self.out_of_group_limit_ms()?;
        self.producer_message_max_bytes()?;
        self.consumer_fetch()?;
        self.validate_our_keys()
    }

    /// A consumer's prefetch queue (`queued.max.messages.kbytes`) a table
    /// sets, which its partition's fetch is sized from
    /// (`kafka::settings`): a number in librdkafka's range. And the
    /// partition's fetch under one of its two names, not both (librdkafka
    /// would take either, whichever it was given last).
    fn consumer_fetch(&self) -> Result<(), ConfigError> {
        let kbytes = self.prefetch_queue_kbytes()?.unwrap_or(LIBRDKAFKA_QUEUE_KBYTES);
        if !(1..=LIBRDKAFKA_MAX_QUEUE_KBYTES).contains(&kbytes) {
            return invalid(format!(
                "kafka.\"queued.max.messages.kbytes\" = {kbytes} must be within 1..={LIBRDKAFKA_MAX_QUEUE_KBYTES} \
                 (librdkafka's range)"
            ));
        }
        let named = |key| self.get(ClientKind::Consumer, key).is_some();
        if named("max.partition.fetch.bytes") && named("fetch.message.max.bytes") {
            return invalid(
                "kafka.\"max.partition.fetch.bytes\" and kafka.\"fetch.message.max.bytes\" are one librdkafka \
                 property under two names: set one of them"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// The consumers' `queued.max.messages.kbytes` when a table sets it.
    pub fn prefetch_queue_kbytes(&self) -> Result<Option<u64>, ConfigError> {
        self.consumer_number_set("queued.max.messages.kbytes")
    }

    /// Our own keys: in range, in `[kafka]` only, and the librdkafka
    /// properties they set not set in the passthrough tables as well.
    fn validate_our_keys(&self) -> Result<(), ConfigError> {
        for (table, map) in [
            ("kafka.consumer", &self.consumer),
            ("kafka.producer", &self.producer),
        ] {
            if let Some(key) = OUR_KEYS.iter().find(|k| map.contains_key(**k)) {
                return invalid(format!(
                    "{table}.{key} is not a librdkafka property: set kafka.{key} in [kafka] itself"
                ));
            }
        }
        for (property, ours) in RESERVED_PROPERTIES {
            for (table, map) in [
                ("kafka", &self.common),
                ("kafka.consumer", &self.consumer),
                ("kafka.producer", &self.producer),
            ] {
                if map.contains_key(*property) {
                    return invalid(format!(
                        "{table}.\"{property}\" is set by hintstream from {ours}; remove it"
                    ));
                }
            }
        }
        if !TRANSACTION_INTERVAL_MS_RANGE.contains(&self.transaction_interval_ms) {
            return invalid(format!(
                "kafka.transaction_interval_ms = {} must be within 10..=60000",
                self.transaction_interval_ms
            ));
        }
        if !TRANSACTION_TIMEOUT_MS_RANGE.contains(&self.transaction_timeout_ms) {
            return invalid(format!(
                "kafka.transaction_timeout_ms = {} must be within 1000..=900000 (the broker's default \
                 transaction.max.timeout.ms is 900000)",
                self.transaction_timeout_ms
            ));
        }
        if self.transaction_interval_ms * 2 > self.transaction_timeout_ms {
            return invalid(format!(
                "kafka.transaction_interval_ms = {} must be at most half of kafka.transaction_timeout_ms = {}: \
                 a transaction stays open for about one interval",
                self.transaction_interval_ms, self.transaction_timeout_ms
            ));
        }
        check_id_part("kafka.transactional_id_prefix", &self.transactional_id_prefix)?;
        if let Some(id) = &self.worker_id {
            check_id_part("the worker id (--worker-id, HINTSTREAM_WORKER_ID)", id)?;
        }
        Ok(())
    }

    /// The consumers' `group.protocol` (librdkafka's default: classic).
    pub fn group_protocol(&self) -> Result<GroupProtocol, ConfigError> {
        match self
            .get(ClientKind::Consumer, "group.protocol")
            .as_deref()
            .map(str::trim)
        {
            None | Some("classic") => Ok(GroupProtocol::Classic),
            Some("consumer") => Ok(GroupProtocol::Consumer),
            Some(other) => invalid(format!(
                "kafka.\"group.protocol\" = {other:?} must be \"classic\" or \"consumer\" (KIP-848)"
            )),
        }
    }

    /// What a stage's drain on revoke must stay under. Classic: the
    /// session timeout, which the group evicts a member past. KIP-848: the
    /// member acknowledges a revocation by finishing its callback, and the
    /// broker waits for that up to the rebalance timeout,
    /// `max.poll.interval.ms` (the session timeout is the broker's, and
    /// heartbeats go on during the drain).
    pub fn drain_bound(&self) -> Result<DrainBound, ConfigError> {
        Ok(match self.group_protocol()? {
            GroupProtocol::Classic => DrainBound {
                ms: self.session_timeout_ms()?,
                setting: "kafka.\"session.timeout.ms\"",
                consequence: "or the group evicts the member while it drains",
            },
            GroupProtocol::Consumer => DrainBound {
                ms: self.max_poll_interval_ms()?,
                setting: "kafka.\"max.poll.interval.ms\"",
                consequence: "the rebalance timeout under group.protocol = consumer, or the broker fences the member while it drains",
            },
        })
    }

    /// The consumers' `max.poll.interval.ms`.
    fn max_poll_interval_ms(&self) -> Result<u64, ConfigError> {
        self.consumer_number("max.poll.interval.ms", LIBRDKAFKA_MAX_POLL_INTERVAL_MS)
    }

    /// The consumers' numeric property `key`, or librdkafka's `default`
    /// when no table sets it.
    fn consumer_number(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
        Ok(self.consumer_number_set(key)?.unwrap_or(default))
    }

    /// The consumers' numeric property `key`; `None` when no table sets it.
    fn consumer_number_set(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.get(ClientKind::Consumer, key)
            .map(|v| {
                v.trim()
                    .parse()
                    .map_err(|_| ConfigError::Invalid(format!("kafka.\"{key}\" = {v:?} is not a number")))
            })
            .transpose()
    }

    /// How long a stage's consumer may stay out of its group before the
    /// stage gives up: twice `session.timeout.ms` (a rejoin after the group
    /// evicted the member) plus the longer of `max.poll.interval.ms` (how
    /// long a rebalance may wait for the group's members) and
    /// `metadata.recovery.rebootstrap.trigger.ms` (librdkafka's own recovery
    /// when it can reach no broker). 390 s with librdkafka's defaults.
    pub fn out_of_group_limit_ms(&self) -> Result<u64, ConfigError> {
        let rebootstrap = self.consumer_number(
            "metadata.recovery.rebootstrap.trigger.ms",
            LIBRDKAFKA_REBOOTSTRAP_TRIGGER_MS,
        )?;
        Ok(2 * self.session_timeout_ms()? + rebootstrap.max(self.max_poll_interval_ms()?))
    }

    /// The consumers' `session.timeout.ms`, which a stage's drain must stay
    /// under with the classic protocol.
    pub fn session_timeout_ms(&self) -> Result<u64, ConfigError> {
        let session_ms: u64 = match self.get(ClientKind::Consumer, "session.timeout.ms") {
            Some(v) => v.parse().map_err(|_| {
                ConfigError::Invalid(format!("kafka.\"session.timeout.ms\" = {v:?} is not a number"))
            })?,
            None => LIBRDKAFKA_SESSION_TIMEOUT_MS,
        };
        if !SESSION_TIMEOUT_MS_RANGE.contains(&session_ms) {
            return invalid(format!(
                "kafka.\"session.timeout.ms\" = {session_ms} must be within 1..=3600000 (librdkafka's range)"
            ));
        }
        Ok(session_ms)
    }

    /// The producers' `message.max.bytes` and the table that sets it
    /// (`kafka.producer` or `kafka`: the producer's own table wins, as
    /// librdkafka gets them); `None` when neither does.
    pub fn producer_message_max_bytes(&self) -> Result<Option<(u64, &'static str)>, ConfigError> {
        let Some(v) = self.get(ClientKind::Producer, "message.max.bytes") else {
            return Ok(None);
        };
        let table = if self.producer.contains_key("message.max.bytes") {
            "kafka.producer"
        } else {
            "kafka"
        };
        let max: u64 = v.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!("{table}.\"message.max.bytes\" = {v:?} is not a number"))
        })?;
        Ok(Some((max, table)))
    }
}

/// A part of the `transactional.id`: 1 to [`MAX_ID_PART_CHARS`] of
/// `[A-Za-z0-9._-]` (what Kafka's resource names and a pod name allow).
fn check_id_part(what: &str, value: &str) -> Result<(), ConfigError> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if value.is_empty() || value.chars().count() > MAX_ID_PART_CHARS || !value.chars().all(fine) {
        return invalid(format!(
            "{what} = {value:?} must be 1 to {MAX_ID_PART_CHARS} characters of A-Z, a-z, 0-9, '.', '_' or '-'"
        ));
    }
    Ok(())
}

/// librdkafka's `queued.max.messages.kbytes`: its default and its most.
pub const LIBRDKAFKA_QUEUE_KBYTES: u64 = 65_536;
const LIBRDKAFKA_MAX_QUEUE_KBYTES: u64 = 2_097_151;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_queue_out_of_librdkafkas_range_or_a_fetch_under_both_names_is_refused() {
        for (text, says) in [
            (
                "[consumer]\n\"queued.max.messages.kbytes\" = \"0x2000\"",
                "is not a number",
            ),
            ("\"queued.max.messages.kbytes\" = 0", "within 1..=2097151"),
            (
                "\"max.partition.fetch.bytes\" = 1048576\n[consumer]\n\"fetch.message.max.bytes\" = 2097152",
                "under two names",
            ),
        ] {
            let config: KafkaConfig = toml::from_str(text).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        for text in [
            "[consumer]\n\"queued.max.messages.kbytes\" = 4096",
            "\"max.partition.fetch.bytes\" = 1048576",
            "[consumer]\n\"fetch.message.max.bytes\" = 2097152",
        ] {
            let config: KafkaConfig = toml::from_str(text).unwrap();
            assert!(config.validate().is_ok(), "{text}");
        }
    }

    #[test]
    fn the_out_of_group_bound_is_two_sessions_and_the_longer_of_a_rebalance_and_the_rebootstrap_trigger() {
        let defaults = KafkaConfig::default();
        assert_eq!(defaults.out_of_group_limit_ms().unwrap(), 390_000);
        let config: KafkaConfig = toml::from_str(
            r#"
            "session.timeout.ms" = 6000
            [consumer]
            "max.poll.interval.ms" = 7000
            "metadata.recovery.rebootstrap.trigger.ms" = 2000
            "#,
        )
        .unwrap();
        assert_eq!(config.out_of_group_limit_ms().unwrap(), 19_000);
        let bad: KafkaConfig =
            toml::from_str(r#""metadata.recovery.rebootstrap.trigger.ms" = "soon""#).unwrap();
        let e = bad.out_of_group_limit_ms().unwrap_err().to_string();
        assert!(e.contains("rebootstrap.trigger.ms"), "{e}");
    }

    #[test]
    fn values_of_every_toml_type_become_librdkafka_strings_per_client_kind() {
        let config: KafkaConfig = toml::from_str(
            r#"
            "security.protocol" = "SASL_SSL"
            "session.timeout.ms" = 6000
            "enable.ssl.certificate.verification" = true
            [consumer]
            "fetch.wait.max.ms" = 50
            [producer]
            "compression.type" = "zstd"
            "session.timeout.ms" = 7000
            "#,
        )
        .unwrap();
        let consumer = config.properties(ClientKind::Consumer);
        assert_eq!(consumer["session.timeout.ms"], "6000");
        assert_eq!(consumer["enable.ssl.certificate.verification"], "true");
        assert_eq!(consumer["fetch.wait.max.ms"], "50");
        assert!(!consumer.contains_key("compression.type"));
        let producer = config.properties(ClientKind::Producer);
        assert_eq!(producer["compression.type"], "zstd");
        assert_eq!(producer["session.timeout.ms"], "7000", "the kind's table wins");
        assert!(!config
            .properties(ClientKind::Other)
            .contains_key("compression.type"));
        assert_eq!(
            config.get(ClientKind::Producer, "security.protocol").as_deref(),
            Some("SASL_SSL")
        );
    }

    #[test]
    fn our_keys_of_kafka_never_reach_a_client_config() {
        let config: KafkaConfig = toml::from_str(
            r#"
            delivery = "exactly_once"
            transaction_interval_ms = 50
            transactional_id_prefix = "rl"
            transaction_timeout_ms = 10000
            worker_id = "hints-0"
            "security.protocol" = "SASL_SSL"
            "#,
        )
        .unwrap();
        assert!(config.exactly_once());
        assert_eq!(config.transaction_interval_ms, 50);
        assert_eq!(config.transaction_timeout_ms, 10_000);
        config.validate().unwrap();
        for kind in [ClientKind::Consumer, ClientKind::Producer, ClientKind::Other] {
            let properties = config.properties(kind);
            for key in OUR_KEYS {
                assert!(!properties.contains_key(*key), "{key} reached a {kind:?} config");
            }
            assert_eq!(properties["security.protocol"], "SASL_SSL");
        }
        assert_eq!(
            config.transactional_id("hints").unwrap().as_deref(),
            Some("rl-hints-hints-0")
        );
        // Even one put in the passthrough map by hand stays out.
        let mut by_hand = KafkaConfig::default();
        by_hand.insert("delivery", "exactly_once");
        assert!(!by_hand.properties(ClientKind::Producer).contains_key("delivery"));
    }

    #[test]
    fn delivery_defaults_to_at_least_once_and_exactly_once_needs_a_worker_id() {
        let config = KafkaConfig::default();
        assert_eq!(config.delivery, DeliveryMode::AtLeastOnce);
        assert_eq!(config.transactional_id("hints").unwrap(), None);
        let eos = KafkaConfig {
            delivery: DeliveryMode::ExactlyOnce,
            ..KafkaConfig::default()
        };
        let e = eos.transactional_id("advantages").unwrap_err().to_string();
        assert!(
            e.contains("--worker-id") && e.contains("HINTSTREAM_WORKER_ID"),
            "{e}"
        );
    }

    #[test]
    fn bad_transaction_settings_are_refused_with_the_key_named() {
        let cases = [
            ("transaction_interval_ms = 0", "kafka.transaction_interval_ms"),
            (
                "transaction_timeout_ms = 999999999",
                "kafka.transaction_timeout_ms",
            ),
            (
                "transaction_interval_ms = 6000\ntransaction_timeout_ms = 10000",
                "at most half",
            ),
            (
                "transactional_id_prefix = \"a b\"",
                "kafka.transactional_id_prefix",
            ),
            ("worker_id = \"\"", "--worker-id"),
            ("\"transactional.id\" = \"x\"", "transactional.id"),
            (
                "[producer]\ndelivery = \"exactly_once\"",
                "kafka.producer.delivery",
            ),
            ("delivery = \"twice\"", ""),
        ];
        for (toml_text, named) in cases {
            let parsed: Result<KafkaConfig, _> = toml::from_str(toml_text);
            let e = match parsed {
                Err(e) => e.to_string(),
                Ok(c) => c.validate().unwrap_err().to_string(),
            };
            assert!(e.contains(named), "{toml_text}: {e}");
        }
    }

    #[test]
    fn static_membership_joins_as_group_dash_worker_id_and_needs_a_worker_id() {
        let off = KafkaConfig {
            worker_id: Some("hints-0".into()),
            ..KafkaConfig::default()
        };
        assert_eq!(off.group_instance_id("hintstream-hints").unwrap(), None);
        let on: KafkaConfig = toml::from_str("static_membership = true\nworker_id = \"hints-0\"").unwrap();
        on.validate().unwrap();
        assert_eq!(
            on.group_instance_id("hintstream-hints").unwrap().as_deref(),
            Some("hintstream-hints-hints-0")
        );
        for kind in [ClientKind::Consumer, ClientKind::Producer, ClientKind::Other] {
            assert!(!on.properties(kind).contains_key("static_membership"));
        }
        let without = KafkaConfig {
            static_membership: true,
            ..KafkaConfig::default()
        };
        let e = without.group_instance_id("g").unwrap_err().to_string();
        assert!(
            e.contains("static_membership") && e.contains("HINTSTREAM_WORKER_ID"),
            "{e}"
        );
        let e = on.group_instance_id("team/hints").unwrap_err().to_string();
        assert!(e.contains("\"team/hints-hints-0\""), "{e}");
        let e = on.group_instance_id(&"g".repeat(250)).unwrap_err().to_string();
        assert!(e.contains("249"), "{e}");
    }

    #[test]
    fn group_instance_id_is_not_settable_directly() {
        for text in [
            "\"group.instance.id\" = \"x\"",
            "[consumer]\n\"group.instance.id\" = \"x\"",
        ] {
            let config: KafkaConfig = toml::from_str(text).unwrap();
            let e = config.validate().unwrap_err().to_string();
            assert!(
                e.contains("group.instance.id") && e.contains("kafka.static_membership"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn the_consumer_protocol_refuses_what_the_broker_owns_and_bounds_the_drain_by_the_rebalance_timeout() {
        let config: KafkaConfig = toml::from_str("\"group.protocol\" = \"consumer\"").unwrap();
        assert_eq!(config.group_protocol().unwrap(), GroupProtocol::Consumer);
        let bound = config.drain_bound().unwrap();
        assert_eq!(
            (bound.ms, bound.setting),
            (300_000, "kafka.\"max.poll.interval.ms\"")
        );
        config.validate().unwrap();
        for key in [
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "partition.assignment.strategy",
        ] {
            let text = format!("\"group.protocol\" = \"consumer\"\n[consumer]\n\"{key}\" = \"1000\"");
            let config: KafkaConfig = toml::from_str(&text).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("KIP-848"), "{err}");
        }
        let classic: KafkaConfig = toml::from_str("\"session.timeout.ms\" = 6000").unwrap();
        assert_eq!(classic.group_protocol().unwrap(), GroupProtocol::Classic);
        assert_eq!(classic.drain_bound().unwrap().ms, 6000);
        let wrong: KafkaConfig = toml::from_str("\"group.protocol\" = \"eager\"").unwrap();
        assert!(wrong.validate().unwrap_err().to_string().contains("classic"));
    }
}
