//! Start-up checks, before a stage (or a tool) takes any work: the cluster
//! answers within a bound, every topic the stage reads or writes exists, and
//! the cluster's ACLs let it read its input and write the rest (KIP-430, see
//! [`super::acl`]).
//! A client that cannot connect says why and exits: wrong credentials and an
//! untrusted certificate are named as such (librdkafka reports them through
//! its error callback, then retries forever), and nothing loops silently.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;
use thiserror::Error;

use super::acl::{describe_topics, missing_acls, topics_to_describe, MissingAcl};
use super::client_config;
use super::embedded::is_embedded;
use crate::config::{ClientKind, Config};

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot reach the Kafka cluster at {servers} within {within:?}: {cause}. Check bootstrap_servers (--bootstrap-servers) and the [kafka] security settings")]
    Unreachable {
        servers: String,
        within: Duration,
        cause: String,
    },
    #[error("authentication failed ({mechanism}, user {user}): {detail}. Check sasl.username and sasl.password (or their ${{...}} variables) in [kafka]")]
    Authentication {
        mechanism: String,
        user: String,
        detail: String,
    },
    #[error("TLS certificate verification failed for {broker}: {detail}. Point ssl.ca.location at the CA that signed the broker's certificate")]
    TlsVerification { broker: String, detail: String },
    #[error("TLS handshake failed for {broker}: {detail}")]
    Tls { broker: String, detail: String },
    #[error("topic {topic:?} does not exist on {servers}; create the pipeline's topics with `hintstream topics create` (or point the stage at an existing topic)")]
    MissingTopic { topic: String, servers: String },
    #[error("missing ACLs for {principal}: {}. Grant them with kafka-acls (docs/acls.md lists each stage's)", list(.missing))]
    MissingAcls {
        principal: String,
        missing: Vec<MissingAcl>,
    },
    #[error("kafka client: {0}")]
    Client(#[from] KafkaError),
}

fn list(missing: &[MissingAcl]) -> String {
    let items: Vec<String> = missing.iter().map(ToString::to_string).collect();
    items.join("; ")
}

impl ConnectError {
    /// A missing topic is a configuration problem (exit 2); the rest are
    /// runtime failures (exit 1).
    pub fn is_config(&self) -> bool {
        matches!(self, ConnectError::MissingTopic { .. })
    }
}

/// A client context that remembers the errors librdkafka reports while the
/// probe runs.
#[derive(Default)]
struct Probe {
    errors: Mutex<Vec<(Option<RDKafkaErrorCode>, String)>>,
}

impl ClientContext for Probe {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "kafka client error while connecting");
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((error.rdkafka_error_code(), reason.to_string()));
    }
}

impl ConsumerContext for Probe {}

/// How long one metadata request of the probe may take (less when the
/// probe's deadline is nearer).
const PROBE_ATTEMPT: Duration = Duration::from_secs(1);

/// How long the probe waits for one more error once an attempt failed: the
/// errors librdkafka reported are queued by then, behind its log lines.
const PROBE_EVENTS: Duration = Duration::from_millis(5);

/// Fetches the cluster's metadata within `within` (as a consumer, and as a
/// producer too when `[kafka.producer]` sets anything) and checks that every
/// topic of `topics` exists. `topics` is a stage's input first, then every
/// topic it writes: the stage's principal must hold READ on the first and
/// WRITE on the others ([`check_access`]).
pub async fn check_cluster(config: &Config, topics: &[&str], within: Duration) -> Result<(), ConnectError> {
    let started = Instant::now();
    let mut kinds = vec![ClientKind::Consumer];
    if !config.kafka.producer.is_empty() {
        kinds.push(ClientKind::Producer);
    }
    let mut metadata = None;
    for kind in kinds {
        let config = config.clone();
        metadata = Some(
            tokio::task::spawn_blocking(move || probe(&config, kind, within))
                .await
                .map_err(|_| KafkaError::Canceled)??,
        );
    }
    let Some(metadata) = metadata else {
        return Ok(());
    };
    let left = within
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(1));
    check_access(config, topics, left).await?;
    for topic in topics {
        let present = metadata
            .topics()
            .iter()
            .any(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
        if !present {
            return Err(ConnectError::MissingTopic {
                topic: topic.to_string(),
                servers: config.bootstrap_servers.clone(),
            });
        }
    }
    Ok(())
}

/// Whether `topic` exists, from the cluster's metadata within `within` (no
/// ACL check: for topics a stage may do without).
pub async fn topic_exists(config: &Config, topic: &str, within: Duration) -> Result<bool, ConnectError> {
    Ok(partition_count(config, topic, within).await?.is_some())
}

/// The partitions of `topic` from the cluster's metadata within `within`;
/// `None` when it does not exist.
pub async fn partition_count(
    config: &Config,
    topic: &str,
    within: Duration,
) -> Result<Option<usize>, ConnectError> {
    let probe_config = config.clone();
    let metadata = tokio::task::spawn_blocking(move || probe(&probe_config, ClientKind::Consumer, within))
        .await
        .map_err(|_| KafkaError::Canceled)??;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.partitions().len()))
}

/// Checks that the principal may READ `topics[0]` (as the consumer) and
/// WRITE the rest (as the producer), from the topics' authorized operations.
/// A broker that cannot answer leaves the ACLs unchecked (a warning): the
/// check refuses only what the broker says is refused.
async fn check_access(config: &Config, topics: &[&str], within: Duration) -> Result<(), ConnectError> {
    let Some((input, writes)) = topics.split_first() else {
        return Ok(());
    };
    check_topic_access(config, &[*input], writes, within).await
}

/// How long a start-up waits for a topic's authorized operations, within
/// its connect timeout: an optional question. A broker answers it in
/// milliseconds, and one that cannot (librdkafka's mock cluster, which waits
/// for a controller it never names) took the whole connect timeout, 30 s
/// by default, at every start.
const ACL_QUESTION_WAIT: Duration = Duration::from_secs(5);

/// Checks that the principal may READ `reads` (as the consumer) and WRITE
/// `writes` (as the producer), as [`check_cluster`] does for a stage's
/// input and outputs; for a topic a stage uses besides those (stage 1's
/// spend ledger, which it reads and writes). The quick start's embedded
/// broker has no ACLs to read and is not asked (see [`super::embedded`]).
/// A broker that does not answer within [`ACL_QUESTION_WAIT`] is not
/// checked: an expected state, logged at info (the stage goes on; a
/// missing ACL then shows as its produce's or fetch's error).
pub async fn check_topic_access(
    config: &Config,
    reads: &[&str],
    writes: &[&str],
    within: Duration,
) -> Result<(), ConnectError> {
    if is_embedded(&config.bootstrap_servers) {
        tracing::debug!("the embedded broker has no ACLs; not read");
        return Ok(());
    }
    let mut missing = vec![];
    let mut principal = String::new();
    let separate = !config.kafka.producer.is_empty();
    let mut asks = vec![(
        ClientKind::Consumer,
        reads.to_vec(),
        if separate { vec![] } else { writes.to_vec() },
    )];
    if separate && !writes.is_empty() {
        asks.push((ClientKind::Producer, vec![], writes.to_vec()));
    }
    for (kind, reads, writes) in asks {
        let names = topics_to_describe(&reads, &writes);
        let client = start_up_client(config, kind);
        let answer = tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = client.create()?;
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            describe_topics(consumer.client(), &names, within.min(ACL_QUESTION_WAIT))
        })
        .await
        .map_err(|_| KafkaError::Canceled)?;
        match answer {
            Ok(access) => {
                let lacking = missing_acls(&access, &reads, &writes);
                if !lacking.is_empty() && principal.is_empty() {
                    principal = config
                        .kafka
                        .get(kind, "sasl.username")
                        .map_or_else(|| "this client's principal".into(), |u| format!("User:{u}"));
                }
                missing.extend(lacking);
            }
            Err(e) => {
                tracing::info!(error = %e, "the cluster did not tell the topics' authorized operations; ACLs not checked")
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ConnectError::MissingAcls { principal, missing })
    }
}

/// A start-up check's first connection when `[kafka]` sets no reconnect
/// backoff: librdkafka's default (100 ms) would hold it for most of 50 ms.
///
/// The first metadata answer names the cluster's brokers, and librdkafka
/// then closes the connection to the bootstrap address. A request still
/// waiting then needs a named broker, which librdkafka connects at most
/// once every half of `reconnect.backoff.ms` (its sparse connections'
/// interval, 11 ms at least; rdkafka_conf.c), counted from the bootstrap
/// connection. A start's first requests waited 44-54 ms there (traced in
/// docs/BENCHMARKS.md, round twenty-six). A check's client lives for a
/// few requests, so the shorter backoff changes nothing else.
const START_UP_RECONNECT_BACKOFF_MS: &str = "20";

/// The client of a start-up check of `kind`: its settings
/// ([`client_config`], less [`strip_producer_only`]), reconnecting sooner
/// ([`START_UP_RECONNECT_BACKOFF_MS`]) unless `[kafka]` sets the backoff.
fn start_up_client(config: &Config, kind: ClientKind) -> rdkafka::ClientConfig {
    let mut client = client_config(config, kind);
    strip_producer_only(config, kind, &mut client);
    let set = ["reconnect.backoff.ms", "reconnect.backoff.max.ms"]
        .iter()
        .any(|key| client.get(key).is_some());
    if !set {
        client.set("reconnect.backoff.ms", START_UP_RECONNECT_BACKOFF_MS);
    }
    client
}

/// A producer's settings are probed by a consumer with the same security
/// properties; producer-only properties would only draw warnings.
fn strip_producer_only(config: &Config, kind: ClientKind, client: &mut rdkafka::ClientConfig) {
    if kind == ClientKind::Producer {
        for key in config.kafka.producer.keys() {
            if !(key.starts_with("security.") || key.starts_with("sasl.") || key.starts_with("ssl.")) {
                client.remove(key);
            }
        }
    }
}

/// Asks for metadata until it comes, the deadline passes, or librdkafka
/// reports a failure that retrying cannot fix (authentication, TLS).
/// Blocking.
fn probe(config: &Config, kind: ClientKind, within: Duration) -> Result<Metadata, ConnectError> {
    let consumer: BaseConsumer<Probe> = start_up_client(config, kind).create_with_context(Probe::default())?;
    let started = Instant::now();
    loop {
        let attempt = PROBE_ATTEMPT.min(within.saturating_sub(started.elapsed()));
        let mut last = match consumer.fetch_metadata(None, attempt) {
            Ok(metadata) => return Ok(metadata),
            Err(e) => e.to_string(),
        };
        // Errors reach the context's callback only when the client is
        // polled (it has no subscription: nothing else comes back). One poll
        // answers at most one error, and librdkafka queues its log lines
        // (rdkafka's `log.queue`) ahead of errors, even those queued before
        // them: serve the queue until no error comes within PROBE_EVENTS
        // (at least once, so that the last attempt's errors are read too),
        // or the deadline passes.
        while consumer.poll(PROBE_EVENTS).is_some() && started.elapsed() < within {}
        let errors = std::mem::take(
            &mut *consumer
                .context()
                .errors
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (code, reason) in errors {
            if let Some(fatal) = classify(config, kind, code, &reason) {
                return Err(fatal);
            }
            last = reason;
        }
        if started.elapsed() >= within {
            return Err(ConnectError::Unreachable {
                servers: config.bootstrap_servers.clone(),
                within,
                cause: last,
            });
        }
    }
}

/// The error a librdkafka report means, when retrying cannot fix it.
fn classify(
    config: &Config,
    kind: ClientKind,
    code: Option<RDKafkaErrorCode>,
    reason: &str,
) -> Option<ConnectError> {
    let broker = broker_of(reason).unwrap_or_else(|| config.bootstrap_servers.clone());
    match code {
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
            let get = |key| config.kafka.get(kind, key);
            Some(ConnectError::Authentication {
                mechanism: get("sasl.mechanism")
                    .or_else(|| get("sasl.mechanisms"))
                    .unwrap_or_else(|| "GSSAPI".into()),
                user: get("sasl.username").unwrap_or_else(|| "(none)".into()),
                detail: reason.to_string(),
            })
        }
        Some(RDKafkaErrorCode::SSL) if reason.contains("certificate verify failed") => {
            Some(ConnectError::TlsVerification {
                broker,
                detail: reason.to_string(),
            })
        }
        Some(RDKafkaErrorCode::SSL) => Some(ConnectError::Tls {
            broker,
            detail: reason.to_string(),
        }),
        _ => None,
    }
}

/// `HOST:PORT` of a librdkafka reason such as
/// `sasl_ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: ...`.
fn broker_of(reason: &str) -> Option<String> {
    let after = &reason[reason.find("://")? + 3..];
    let end = after.find('/')?;
    Some(after[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_up_check_reconnects_sooner_unless_the_deployment_sets_the_backoff() {
        let backoff = |config: &Config, kind| {
            start_up_client(config, kind)
                .get("reconnect.backoff.ms")
                .map(str::to_string)
        };
        let plain = Config::default();
        for kind in [ClientKind::Consumer, ClientKind::Producer] {
            assert_eq!(
                backoff(&plain, kind).as_deref(),
                Some(START_UP_RECONNECT_BACKOFF_MS)
            );
        }
        let mut set = Config::default();
        set.kafka.insert("reconnect.backoff.ms", "250");
        assert_eq!(backoff(&set, ClientKind::Consumer).as_deref(), Some("250"));
        // A maximum set alone may be under ours: both are left to librdkafka.
        let mut most = Config::default();
        most.kafka.insert("reconnect.backoff.max.ms", "10");
        assert_eq!(backoff(&most, ClientKind::Consumer), None);
    }

    #[test]
    fn missing_acls_point_at_the_book_chapter_that_lists_them() {
        let e = ConnectError::MissingAcls {
            principal: "User:hints".into(),
            missing: vec![MissingAcl {
                topic: "rl.hints.spend".into(),
                operation: super::super::acl::TopicOperation::Write,
                granted: vec![],
            }],
        };
        let said = e.to_string();
        assert!(said.contains("docs/acls.md"), "{said}");
        assert!(!said.contains("README"), "{said}");
        let chapter = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/acls.md")).unwrap();
        assert!(
            chapter.starts_with("# ACLs per stage"),
            "docs/acls.md is the chapter the message names"
        );
    }

    #[test]
    fn names_the_broker_of_a_librdkafka_reason() {
        assert_eq!(
            broker_of("sasl_ssl://127.0.0.1:39281/bootstrap: SSL handshake failed: x").as_deref(),
            Some("127.0.0.1:39281")
        );
        assert_eq!(broker_of("no url here"), None);
    }

    #[test]
    fn authentication_and_tls_failures_are_final_and_say_what_they_are() {
        let mut config = Config::default();
        config.kafka.insert("sasl.mechanism", "SCRAM-SHA-512");
        config.kafka.insert("sasl.username", "trainer");
        let auth = classify(
            &config,
            ClientKind::Consumer,
            Some(RDKafkaErrorCode::Authentication),
            "SASL authentication error: invalid-proof",
        )
        .unwrap();
        assert!(
            auth.to_string()
                .starts_with("authentication failed (SCRAM-SHA-512, user trainer)"),
            "{auth}"
        );
        let tls = classify(
            &config,
            ClientKind::Consumer,
            Some(RDKafkaErrorCode::SSL),
            "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
        )
        .unwrap();
        assert!(
            tls.to_string()
                .starts_with("TLS certificate verification failed for 127.0.0.1:9093"),
            "{tls}"
        );
        assert!(classify(
            &config,
            ClientKind::Consumer,
            Some(RDKafkaErrorCode::AllBrokersDown),
            "down"
        )
        .is_none());
    }
}
