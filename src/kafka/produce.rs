//! Producing a record until the broker acknowledges it. Outputs and dead
//! letters go through here: the caller finishes the source offset only after
//! this returns, so a transient produce failure delays a commit but never
//! loses input. Errors that retrying cannot fix (a record over
//! `message.max.bytes`, an invalid record, no authorization) come back to the
//! caller, which dead-letters or reports them instead of stalling its
//! partition.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;

/// How long one attempt may wait in the producer queue and for its ack.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One record to produce.
pub struct Outgoing<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: OwnedHeaders,
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
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    )
}

/// Produces `record`, retrying transient failures with exponential backoff
/// until it is acknowledged. Returns the (partition, offset) it was written
/// at, or the error when it is permanent ([`is_permanent`]).
pub async fn send_until_acked(
    producer: &FutureProducer,
    record: &Outgoing<'_>,
) -> Result<(i32, i64), KafkaError> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut future: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(record.topic).headers(record.headers.clone());
        if let Some(key) = record.key {
            future = future.key(key);
        }
        if let Some(payload) = record.payload {
            future = future.payload(payload);
        }
        match producer.send(future, Timeout::After(ATTEMPT_TIMEOUT)).await {
            Ok(delivery) => return Ok((delivery.partition, delivery.offset)),
            Err((e, _)) if is_permanent(&e) => {
                tracing::error!(topic = record.topic, error = %e, "produce failed permanently");
                return Err(e);
            }
            Err((e, _)) => {
                tracing::error!(
                    topic = record.topic, error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "produce failed; retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
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
