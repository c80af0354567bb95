//! Producing a record until the broker acknowledges it. Outputs and dead
//! letters go through here: the caller finishes the source offset only after
//! this returns, so a transient produce failure delays a commit but never
//! loses input. Errors that retrying cannot fix (an unknown topic after
//! librdkafka's metadata refresh, no authorization, a record over
//! `message.max.bytes`, an invalid record) come back to the caller, which
//! dead-letters or reports them instead of stalling its partition. Once
//! shutdown began, retrying stops at the drain deadline. Each record is a
//! `produce` span, and carries its `traceparent` unless the caller set one.

use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use thiserror::Error;
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::health::Lifecycle;
use crate::telemetry;

/// How long one attempt may wait for room in the producer queue. (Its
/// delivery is bounded by librdkafka's `message.timeout.ms`.)
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// After failing this long, a produce says so at error level: the
/// partition's offsets stay uncommitted until it succeeds.
const STALL_WARNING: Duration = Duration::from_secs(60);

/// One record to produce. [`send`] takes it whole: at least once, its
/// headers go into the first attempt as they are (with the `traceparent`
/// added), not a copy. (Under exactly_once the transactions hold it and
/// copy the headers for each produce.)
pub struct Outgoing<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: OwnedHeaders,
}

/// Why a record was not acknowledged.
#[derive(Debug, Error)]
pub enum SendError {
    /// Retrying cannot help ([`is_permanent`]).
    #[error("{0}")]
    Permanent(KafkaError),
    /// Shutdown began and its drain deadline passed first: the source stays
    /// unfinished and is redelivered after a restart.
    #[error("the drain deadline passed before the broker acknowledged it")]
    Stopped,
}

/// Whether retrying cannot help.
pub fn is_permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidRequiredAcks
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::InvalidTopic
        )
    )
}

/// Produces `record`, retrying transient failures with exponential backoff
/// until it is acknowledged. Returns the (partition, offset) it was written
/// at; the error when it is permanent; or [`SendError::Stopped`] when the
/// stage's drain deadline passed first. The record gets a `traceparent`
/// header of its `produce` span unless `record.headers` has one.
pub async fn send<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    record: Outgoing<'_>,
    lifecycle: &Lifecycle,
) -> Result<(i32, i64), SendError> {
    // Only the export needs it: a log line of a retry names its topic and
    // attempt itself.
    let span = telemetry::export_span(|| {
        tracing::info_span!(
            "produce",
            otel.kind = "producer",
            otel.status_code = Empty,
            topic = record.topic,
            partition = Empty,
            offset = Empty,
            attempts = Empty,
        )
    });
    let Outgoing {
        topic,
        key,
        payload,
        headers,
    } = record;
    let headers = telemetry::with_traceparent(headers, &span);
    let result = send_with(producer, (topic, key, payload), headers, lifecycle)
        .instrument(span.clone())
        .await;
    // The span's outcome fields are for the trace export: a log line
    // written after this has none of them, so unexported they would only
    // cost a field formatted a record.
    if !telemetry::exporting() {
        return result;
    }
    match &result {
        Ok((partition, offset)) => {
            span.record("partition", partition);
            span.record("offset", offset);
        }
        Err(_) => {
            span.record("otel.status_code", "error");
        }
    }
    result
}

/// A record's topic, key and payload.
type Parts<'a> = (&'a str, Option<&'a [u8]>, Option<&'a [u8]>);

async fn send_with<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    (topic, key, payload): Parts<'_>,
    headers: OwnedHeaders,
    lifecycle: &Lifecycle,
) -> Result<(i32, i64), SendError> {
    // Each attempt's record takes the headers; a failed one gives them back
    // (rdkafka returns them with the record, or a copy of a delivered one's,
    // whenever it had any, and ours has a `traceparent` at least).
    let mut headers = Some(headers);
    let mut backoff = Duration::from_millis(100);
    let started = Instant::now();
    let mut attempts = 0u32;
    let deadline = lifecycle.deadline_passed();
    tokio::pin!(deadline);
    loop {
        attempts += 1;
        if attempts > 1 || telemetry::exporting() {
            tracing::Span::current().record("attempts", i64::from(attempts));
        }
        let attempt_headers = headers.take().unwrap_or_else(|| {
            // Not reached with rdkafka 0.39 (see above); said, should an
            // upgrade change it, since the record's other headers are gone.
            tracing::error!(
                topic, key = %key_text(key), attempts,
                "a failed produce gave its headers back empty; retrying with a traceparent only"
            );
            telemetry::with_traceparent(OwnedHeaders::new(), &tracing::Span::current())
        });
        let mut future: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(attempt_headers);
        if let Some(key) = key {
            future = future.key(key);
        }
        if let Some(payload) = payload {
            future = future.payload(payload);
        }
        let result = tokio::select! {
            biased;
            _ = &mut deadline => return Err(SendError::Stopped),
            result = producer.send(future, Timeout::After(QUEUE_TIMEOUT)) => result,
        };
        let error = match result {
            Ok(delivery) => return Ok((delivery.partition, delivery.offset)),
            Err((e, _)) if is_permanent(&e) => {
                tracing::error!(topic, key = %key_text(key), error = %e, "produce failed permanently");
                return Err(SendError::Permanent(e));
            }
            Err((e, mut returned)) => {
                headers = returned.detach_headers();
                e
            }
        };
        let failing_for = started.elapsed();
        if failing_for >= STALL_WARNING {
            tracing::error!(
                topic, key = %key_text(key), error = %error, attempts,
                failing_for_s = failing_for.as_secs(),
                "produce keeps failing; the offsets of the input it was made from stay uncommitted until it \
                 succeeds: check that the brokers are reachable"
            );
        } else {
            tracing::warn!(
                topic, key = %key_text(key), error = %error, attempts,
                retry_in_ms = backoff.as_millis() as u64,
                "produce failed; retrying"
            );
        }
        tokio::select! {
            biased;
            _ = &mut deadline => return Err(SendError::Stopped),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A record's key as text (lossy; none reads as ""), for logs and reports.
pub fn key_text(key: Option<&[u8]>) -> String {
    String::from_utf8_lossy(key.unwrap_or_default()).into_owned()
}

/// Headers from (name, value) pairs.
pub fn headers<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> OwnedHeaders {
    pairs.into_iter().fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(rdkafka::message::Header {
            key,
            value: Some(value),
        })
    })
}
