//! The dead-letter producer: input that can never be processed is copied, key
//! and bytes unchanged, to the stage's DLQ topic with headers that say why and
//! where it came from. Its offset then counts as finished: redelivering it
//! would fail the same way.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

/// Header names on dead letters.
pub struct DlqHeaders;

impl DlqHeaders {
    pub const ERROR_KIND: &'static str = "hintstream.error.kind";
    pub const REASON: &'static str = "hintstream.error.reason";
    pub const SOURCE_TOPIC: &'static str = "hintstream.source.topic";
    pub const SOURCE_PARTITION: &'static str = "hintstream.source.partition";
    pub const SOURCE_OFFSET: &'static str = "hintstream.source.offset";
}

/// Longest reason text kept in a header; longer reasons are cut.
const MAX_REASON_BYTES: usize = 1024;

/// Where a dead letter came from and why.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub source_topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub kind: &'a str,
    pub reason: &'a str,
}

#[derive(Clone)]
pub struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetters {
    pub fn new(producer: FutureProducer, topic: impl Into<String>) -> Self {
        DeadLetters {
            producer,
            topic: topic.into(),
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces the dead letter and waits for the broker's ack, retrying with
    /// backoff until it is acknowledged: a dead letter is never dropped, and
    /// the caller finishes the source offset only after this returns.
    pub async fn send(&self, letter: &DeadLetter<'_>) {
        let reason = truncate(letter.reason, MAX_REASON_BYTES);
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let mut backoff = Duration::from_millis(100);
        loop {
            let headers = OwnedHeaders::new()
                .insert(header(DlqHeaders::ERROR_KIND, letter.kind))
                .insert(header(DlqHeaders::REASON, reason))
                .insert(header(DlqHeaders::SOURCE_TOPIC, letter.source_topic))
                .insert(header(DlqHeaders::SOURCE_PARTITION, &partition))
                .insert(header(DlqHeaders::SOURCE_OFFSET, &offset));
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic).headers(headers);
            if let Some(key) = letter.key {
                record = record.key(key);
            }
            if let Some(payload) = letter.payload {
                record = record.payload(payload);
            }
            match self
                .producer
                .send(record, Timeout::After(Duration::from_secs(30)))
                .await
            {
                Ok(_) => {
                    tracing::warn!(
                        topic = letter.source_topic, partition = letter.partition, offset = letter.offset,
                        kind = letter.kind, reason, dlq = %self.topic,
                        "input sent to dead-letter topic"
                    );
                    return;
                }
                Err((e, _)) => {
                    tracing::error!(dlq = %self.topic, error = %e, retry_in_ms = backoff.as_millis() as u64, "dead-letter produce failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
