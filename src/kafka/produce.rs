//! Producing a record until the broker acknowledges it. Outputs and dead
//! letters go through here: the caller finishes the source offset only after
//! this returns, so a produce failure delays a commit but never loses input.

use std::time::Duration;

use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
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

/// Produces `record`, retrying with exponential backoff until it is
/// acknowledged. Returns the (partition, offset) it was written at.
pub async fn send_until_acked(producer: &FutureProducer, record: &Outgoing<'_>) -> (i32, i64) {
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
            Ok(delivery) => return (delivery.partition, delivery.offset),
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
