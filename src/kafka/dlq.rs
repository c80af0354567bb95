//! The dead-letter producer: input that can never be processed is copied, key
//! and bytes unchanged, to the stage's DLQ topic with headers that say why and
//! where it came from. Its offset then counts as finished: redelivering it
//! would fail the same way.

use rdkafka::producer::FutureProducer;

use super::produce::{headers, send_until_acked, Outgoing};

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

    /// Produces the dead letter and waits for the broker's ack, retrying
    /// until it is acknowledged: a dead letter is never dropped, and the
    /// caller finishes the source offset only after this returns.
    pub async fn send(&self, letter: &DeadLetter<'_>) {
        let reason = truncate(letter.reason, MAX_REASON_BYTES);
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let record = Outgoing {
            topic: &self.topic,
            key: letter.key,
            payload: letter.payload,
            headers: headers([
                (DlqHeaders::ERROR_KIND, letter.kind),
                (DlqHeaders::REASON, reason),
                (DlqHeaders::SOURCE_TOPIC, letter.source_topic),
                (DlqHeaders::SOURCE_PARTITION, partition.as_str()),
                (DlqHeaders::SOURCE_OFFSET, offset.as_str()),
            ]),
        };
        send_until_acked(&self.producer, &record).await;
        tracing::warn!(
            topic = letter.source_topic, partition = letter.partition, offset = letter.offset,
            kind = letter.kind, reason, dlq = %self.topic,
            "input sent to dead-letter topic"
        );
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
