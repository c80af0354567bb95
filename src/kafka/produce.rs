//! Producing a record until the broker acknowledges it. Outputs and dead
//! letters go through here: the caller finishes the source offset only after
//! this returns, so a transient produce failure delays a commit but never
//! loses input. Errors that retrying cannot fix (an unknown topic after
//! librdkafka's metadata refresh, no authorization, a record over
//! `message.max.bytes`, an invalid record) come back to the caller, which
//! dead-letters or reports them instead of stalling its partition. Once
//! shutdown began, retrying stops at the drain deadline. Each record is a
//! `produce` span, and carries its `traceparent` unless the caller set one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
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

impl<'a> Outgoing<'a> {
    /// A JSON record (`content-type: application/json`): a step's metrics,
    /// a hint outcome.
    pub fn json(topic: &'a str, key: &'a [u8], payload: &'a [u8]) -> Self {
        Outgoing {
            topic,
            key: Some(key),
            payload: Some(payload),
            headers: headers([("content-type", "application/json")]),
        }
    }
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
    let result = attempt_until_sent(
        producer,
        (topic, key, payload),
        headers,
        lifecycle,
        Attempts::new(),
    )
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

/// A record's attempts so far: how many, since when, and the pause before
/// the next.
struct Attempts {
    made: u32,
    backoff: Duration,
    started: Instant,
}

impl Attempts {
    fn new() -> Self {
        Self::since(Instant::now())
    }

    /// None made yet, the first about to be, at `started`.
    fn since(started: Instant) -> Self {
        Attempts {
            made: 0,
            backoff: Duration::from_millis(100),
            started,
        }
    }

    /// Says that an attempt failed with `error`, for retrying: at warning
    /// level, at error level once it has failed for [`STALL_WARNING`].
    fn failed(&self, (topic, key, _): Parts<'_>, error: &KafkaError) {
        let failing_for = self.started.elapsed();
        let attempts = self.made;
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
                retry_in_ms = self.backoff.as_millis() as u64,
                "produce failed; retrying"
            );
        }
    }

    /// Waits out the pause before the next attempt (`false`: the drain
    /// deadline passed first), and doubles the next one.
    async fn pause(&mut self, deadline: Pin<&mut impl Future<Output = ()>>) -> bool {
        let paused = tokio::select! {
            biased;
            _ = deadline => false,
            _ = tokio::time::sleep(self.backoff) => true,
        };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        paused
    }
}

/// Produces a record again and again, as [`send`] says, its attempts so
/// far `attempts`.
async fn attempt_until_sent<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    (topic, key, payload): Parts<'_>,
    headers: OwnedHeaders,
    lifecycle: &Lifecycle,
    mut attempts: Attempts,
) -> Result<(i32, i64), SendError> {
    // Each attempt's record takes the headers; a failed one gives them back
    // (rdkafka returns them with the record, or a copy of a delivered one's,
    // whenever it had any, and ours has a `traceparent` at least).
    let mut headers = Some(headers);
    let deadline = lifecycle.deadline_passed();
    tokio::pin!(deadline);
    loop {
        attempts.made += 1;
        if attempts.made > 1 || telemetry::exporting() {
            tracing::Span::current().record("attempts", i64::from(attempts.made));
        }
        let attempt_headers = headers_back(headers.take(), (topic, key, payload), attempts.made);
        let record = record_of((topic, key, payload), attempt_headers);
        let result = tokio::select! {
            biased;
            _ = &mut deadline => return Err(SendError::Stopped),
            result = producer.send(record, Timeout::After(QUEUE_TIMEOUT)) => result,
        };
        let error = match result {
            Ok(delivery) => return Ok((delivery.partition, delivery.offset)),
            Err((e, _)) if is_permanent(&e) => return Err(permanent(topic, key, e)),
            Err((e, mut returned)) => {
                headers = returned.detach_headers();
                e
            }
        };
        attempts.failed((topic, key, payload), &error);
        if !attempts.pause(deadline.as_mut()).await {
            return Err(SendError::Stopped);
        }
    }
}

/// A failed attempt's headers, given back with its record; when they are
/// not, a `traceparent` alone, and an error said (not reached with rdkafka
/// 0.39, which gives back the headers of a record that had any, and ours
/// have a `traceparent` at least; said should an upgrade change it, since
/// the record's other headers are gone).
fn headers_back(headers: Option<OwnedHeaders>, (topic, key, _): Parts<'_>, attempts: u32) -> OwnedHeaders {
    headers.unwrap_or_else(|| {
        tracing::error!(
            topic, key = %key_text(key), attempts,
            "a failed produce gave its headers back empty; retrying with a traceparent only"
        );
        telemetry::with_traceparent(OwnedHeaders::new(), &tracing::Span::current())
    })
}

/// A record to hand to the producer.
fn record_of<'a>((topic, key, payload): Parts<'a>, headers: OwnedHeaders) -> FutureRecord<'a, [u8], [u8]> {
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(payload) = payload {
        record = record.payload(payload);
    }
    record
}

/// A failure retrying cannot fix, said at error level.
fn permanent(topic: &str, key: Option<&[u8]>, e: KafkaError) -> SendError {
    tracing::error!(topic, key = %key_text(key), error = %e, "produce failed permanently");
    SendError::Permanent(e)
}

/// [`send`] for records that go out together (a step's hint outcomes): all
/// handed to the producer in one pass, so that its broker thread finds them
/// queued together and sends them in few requests, and their
/// acknowledgements awaited under one drain deadline. A record the producer
/// could not queue (its queue full) is produced as [`send`] produces it,
/// which waits for room; one whose delivery failed for a reason retrying may
/// fix is produced again after [`send`]'s warning and pause, and then as
/// [`send`] retries. With traces exported each goes through [`send`] (a
/// `produce` span each). The results are in `records`' order; once the
/// drain deadline passed, those not acknowledged by then are
/// [`SendError::Stopped`], and when it passed before the call none is
/// queued.
///
/// Through [`send`] one at a time, a 10,000-row step's 696 outcomes took
/// about 2 us each of the step's task, and left the broker thread a few at
/// a time (docs/BENCHMARKS.md, round thirty-six).
pub async fn send_all<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    records: Vec<Outgoing<'_>>,
    lifecycle: &Lifecycle,
) -> Vec<Result<(i32, i64), SendError>> {
    if telemetry::exporting() {
        return futures::future::join_all(records.into_iter().map(|r| send(producer, r, lifecycle))).await;
    }
    if lifecycle.deadline_has_passed() {
        return records.iter().map(|_| Err(SendError::Stopped)).collect();
    }
    let started = Instant::now();
    let unsent = tracing::Span::none();
    // Queued first, every one, before any delivery is awaited.
    let queued: Vec<_> = records
        .into_iter()
        .map(
            |Outgoing {
                 topic,
                 key,
                 payload,
                 headers,
             }| {
                let parts = (topic, key, payload);
                let headers = telemetry::with_traceparent(headers, &unsent);
                let queued = producer.send_result(record_of(parts, headers));
                (parts, queued.map_err(|(e, record)| (e, record.headers)))
            },
        )
        .collect();
    let mut results: Vec<Option<Result<(i32, i64), SendError>>> = queued.iter().map(|_| None).collect();
    let mut settling: FuturesUnordered<_> =
        queued
            .into_iter()
            .enumerate()
            .map(|(i, (parts, queued))| async move {
                (i, settle(producer, parts, queued, started, lifecycle).await)
            })
            .collect();
    let deadline = lifecycle.deadline_passed();
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            _ = &mut deadline => break,
            settled = settling.next() => match settled {
                Some((i, result)) => results[i] = Some(result),
                None => break,
            },
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(SendError::Stopped)))
        .collect()
}

/// One record of [`send_all`], queued at `started` (or refused then):
/// its delivery awaited as [`delivered`] awaits one (retried as [`send`]
/// retries); when the producer refused it for a reason retrying may fix
/// (its queue full), produced as [`send`] produces it. Its `attempts`
/// field is no span's: there is no `produce` span without the export.
async fn settle<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    parts: Parts<'_>,
    queued: Result<DeliveryFuture, (KafkaError, Option<OwnedHeaders>)>,
    started: Instant,
    lifecycle: &Lifecycle,
) -> Result<(i32, i64), SendError> {
    let (topic, key, _) = parts;
    match queued {
        Ok(delivery) => delivered(producer, delivery, started, lifecycle).await,
        Err((e, _)) if is_permanent(&e) => Err(permanent(topic, key, e)),
        // No attempt was made: the first is `send`'s.
        Err((_, headers)) => {
            let headers = headers_back(headers, parts, 0);
            attempt_until_sent(producer, parts, headers, lifecycle, Attempts::since(started))
                .instrument(tracing::Span::none())
                .await
        }
    }
}

/// Hands `record` to the producer without waiting (its `traceparent`
/// added, of the current trace: there is no `produce` span without the
/// export): its delivery to await with [`delivered`]; or, when the
/// producer refused it (its queue full, or a record it can never take),
/// the record given back, to produce as [`send`] does (which waits for
/// room, and says why it failed for good).
pub fn queue<'a, C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    record: Outgoing<'a>,
) -> Result<DeliveryFuture, Outgoing<'a>> {
    let parts = (record.topic, record.key, record.payload);
    let headers = telemetry::with_traceparent(record.headers, &tracing::Span::none());
    producer
        .send_result(record_of(parts, headers))
        .map_err(|(_, returned)| Outgoing {
            headers: headers_back(returned.headers, parts, 0),
            ..record
        })
}

/// A record [`queue`]d at `started`, until the broker acknowledges it, as
/// [`send`] produces one: when its delivery failed for a reason retrying
/// may fix, produced again (from the record the producer gave back) after
/// [`send`]'s warning and pause, and then as [`send`] retries until the
/// drain deadline. A delivery report the producer dropped (not reached:
/// the caller holds the producer, and rdkafka reports every record) is a
/// failure for good, said at error level, so that the caller dead-letters
/// or reports its inputs rather than leaving them to hold their
/// partition's offsets.
pub async fn delivered<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    delivery: DeliveryFuture,
    started: Instant,
    lifecycle: &Lifecycle,
) -> Result<(i32, i64), SendError> {
    let (error, mut returned) = match delivery.await {
        Ok(Ok(delivered)) => return Ok((delivered.partition, delivered.offset)),
        Ok(Err(failed)) => failed,
        Err(_canceled) => {
            tracing::error!(
                "the producer dropped a queued record's delivery report; it is not produced again"
            );
            return Err(SendError::Permanent(KafkaError::Canceled));
        }
    };
    let headers = returned.detach_headers();
    let parts = (returned.topic(), returned.key(), returned.payload());
    // Boxed: the retries' future is large, and inline it would size (and
    // be copied into) every delivery's, which nearly always ends above.
    Box::pin(retry_failed(
        producer,
        parts,
        error,
        headers,
        Attempts::since(started),
        lifecycle,
    ))
    .await
}

/// After a queued record's first delivery failed with `error`: a failure
/// retrying cannot fix is returned; else it is produced again after
/// [`send`]'s warning and pause, and then as [`send`] retries.
async fn retry_failed<C: ClientContext + 'static>(
    producer: &FutureProducer<C>,
    parts: Parts<'_>,
    error: KafkaError,
    headers: Option<OwnedHeaders>,
    mut attempts: Attempts,
    lifecycle: &Lifecycle,
) -> Result<(i32, i64), SendError> {
    let (topic, key, _) = parts;
    if is_permanent(&error) {
        return Err(permanent(topic, key, error));
    }
    attempts.made = 1;
    attempts.failed(parts, &error);
    let deadline = lifecycle.deadline_passed();
    tokio::pin!(deadline);
    if !attempts.pause(deadline.as_mut()).await {
        return Err(SendError::Stopped);
    }
    let headers = headers_back(headers, parts, attempts.made);
    attempt_until_sent(producer, parts, headers, lifecycle, attempts)
        .instrument(tracing::Span::none())
        .await
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
