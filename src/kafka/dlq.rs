//! The dead-letter producer: input that can never be processed is copied, key
//! and bytes unchanged, to the stage's DLQ topic with headers that say why and
//! where it came from. Its offset then counts as finished: redelivering it
//! would fail the same way. Every dead letter of a stage goes through here
//! and is counted here, by kind (`dead_letters_total{kind}`).
//!
//! Dead letters stay whole: a stage's dead-letter producer takes messages of
//! `limits.max_message_bytes` plus [`DLQ_HEADROOM_BYTES`] (and `topics
//! create` gives the DLQ topics that `max.message.bytes`), and keeps every
//! payload up to `limits.max_message_bytes` plus what the headroom leaves
//! past the key and headers: every input the stage accepts, and a
//! `too_large` one within that margin, goes to its dead letter unchanged.

use std::sync::Arc;

use rdkafka::error::KafkaResult;
use rdkafka::producer::FutureProducer;

use super::produce::{headers, send, Outgoing, SendError};
use super::producers::create_dlq_producer;
use crate::config::Config;
use crate::health::Lifecycle;
use crate::metrics::StageMetrics;

/// Header names on dead letters.
pub struct DlqHeaders;

impl DlqHeaders {
    pub const ERROR_KIND: &'static str = "hintstream.error.kind";
    pub const REASON: &'static str = "hintstream.error.reason";
    pub const SOURCE_TOPIC: &'static str = "hintstream.source.topic";
    pub const SOURCE_PARTITION: &'static str = "hintstream.source.partition";
    pub const SOURCE_OFFSET: &'static str = "hintstream.source.offset";
    /// Present when the payload was cut to fit: the original length in bytes.
    pub const TRUNCATED_FROM: &'static str = "hintstream.payload.truncated-from";
    /// Present when the key was cut to fit: the original length in bytes.
    pub const KEY_TRUNCATED_FROM: &'static str = "hintstream.key.truncated-from";
}

/// Payload bytes a dead letter carries at most by default: librdkafka's
/// default `message.max.bytes` (1,000,000) less room for key and headers.
/// Longer payloads are cut and marked with [`DlqHeaders::TRUNCATED_FROM`];
/// the original stays in the source topic at the offset the headers name.
pub const DEFAULT_MAX_DLQ_PAYLOAD_BYTES: usize = 900_000;

/// Longest reason text kept in a header; longer reasons are cut.
const MAX_REASON_BYTES: usize = 1024;

/// Bytes a dead letter may take beyond `limits.max_message_bytes`: its key
/// (at most [`MAX_DLQ_KEY_BYTES`]), its headers and the record's framing.
/// The DLQ producer's `message.max.bytes` and the DLQ topics'
/// `max.message.bytes` are `limits.max_message_bytes` plus this.
pub const DLQ_HEADROOM_BYTES: usize = 64 * 1024;

/// What the headers (the reason at most [`MAX_REASON_BYTES`], the source
/// topic, partition, offset and the truncation marks) and the record's
/// framing take at most, with room to spare.
const DLQ_HEADER_BYTES: usize = 8 * 1024;

/// The largest message librdkafka's `message.max.bytes` accepts.
const LIBRDKAFKA_MAX_MESSAGE_BYTES: usize = 1_000_000_000;

/// The `message.max.bytes` of a stage's dead-letter producer and the
/// `max.message.bytes` of its DLQ topic: `limits.max_message_bytes` plus
/// [`DLQ_HEADROOM_BYTES`] (at most librdkafka's own maximum).
pub fn dlq_message_max_bytes(config: &Config) -> usize {
    config
        .limits
        .max_message_bytes
        .saturating_add(DLQ_HEADROOM_BYTES)
        .min(LIBRDKAFKA_MAX_MESSAGE_BYTES)
}

/// Payload bytes a stage's dead letter keeps: what its message limit
/// ([`dlq_message_max_bytes`]) leaves past the longest key and the headers,
/// so never less than `limits.max_message_bytes`.
pub fn dlq_max_payload_bytes(config: &Config) -> usize {
    dlq_message_max_bytes(config) - MAX_DLQ_KEY_BYTES - DLQ_HEADER_BYTES
}

/// Key bytes a dead letter carries at most; longer keys are cut and marked
/// with [`DlqHeaders::KEY_TRUNCATED_FROM`] (the original stays in the source
/// topic), so one record with a huge key cannot make its dead letter too
/// large for the broker.
pub const MAX_DLQ_KEY_BYTES: usize = 16 * 1024;

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
    max_payload: usize,
    metrics: Arc<StageMetrics>,
}

impl DeadLetters {
    /// A stage's dead letters to `topic`: a producer whose limit is
    /// [`dlq_message_max_bytes`], keeping [`dlq_max_payload_bytes`] of each
    /// payload (every input within `limits.max_message_bytes` whole).
    pub fn for_stage(
        config: &Config,
        topic: impl Into<String>,
        metrics: Arc<StageMetrics>,
    ) -> KafkaResult<Self> {
        let producer = create_dlq_producer(config, dlq_message_max_bytes(config))?;
        Ok(Self::with_max_payload(
            producer,
            topic,
            metrics,
            dlq_max_payload_bytes(config),
        ))
    }

    /// Dead letters keep [`DEFAULT_MAX_DLQ_PAYLOAD_BYTES`] of their payload.
    pub fn new(producer: FutureProducer, topic: impl Into<String>, metrics: Arc<StageMetrics>) -> Self {
        Self::with_max_payload(producer, topic, metrics, DEFAULT_MAX_DLQ_PAYLOAD_BYTES)
    }

    /// `max_payload`: payload bytes kept.
    pub fn with_max_payload(
        producer: FutureProducer,
        topic: impl Into<String>,
        metrics: Arc<StageMetrics>,
        max_payload: usize,
    ) -> Self {
        DeadLetters {
            producer,
            topic: topic.into(),
            max_payload,
            metrics,
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces the dead letter and waits for the broker's ack, retrying
    /// transient failures until it is acknowledged or the drain deadline
    /// passes: a dead letter is never dropped, and the caller finishes the
    /// source offset only after this returned `Ok`. A permanent failure means
    /// the dead-letter topic itself is unusable.
    pub async fn send(&self, letter: &DeadLetter<'_>, lifecycle: &Lifecycle) -> Result<(), SendError> {
        let reason = truncate(letter.reason, MAX_REASON_BYTES);
        match self.send_cut(letter, reason, self.max_payload, lifecycle).await {
            // Still too large for the broker (the DLQ topic was not made
            // by `topics create` and its limit is below ours): the dead
            // letter goes without its payload rather than failing the
            // stage on every restart.
            Err(SendError::Permanent(e))
                if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge) =>
            {
                tracing::warn!(
                    dlq = %self.topic, topic = letter.source_topic, partition = letter.partition,
                    offset = letter.offset, error = %e, "dead letter too large; sending it without its payload"
                );
                self.send_cut(letter, reason, 0, lifecycle).await?;
            }
            other => {
                other?;
            }
        }
        self.counted(letter, reason);
        Ok(())
    }

    /// Hands the dead letter's record to `register` instead of producing
    /// it (under exactly_once it joins the worker's transactions, see
    /// [`guarantee`](super::guarantee)), and counts it.
    pub(crate) fn register_with(&self, letter: &DeadLetter<'_>, register: impl FnOnce(Outgoing<'_>)) {
        let reason = truncate(letter.reason, MAX_REASON_BYTES);
        let (partition, offset) = (letter.partition.to_string(), letter.offset.to_string());
        register(self.record(letter, reason, self.max_payload, &partition, &offset));
        self.counted(letter, reason);
    }

    fn counted(&self, letter: &DeadLetter<'_>, reason: &str) {
        self.metrics.dead_lettered(letter.kind);
        tracing::warn!(
            topic = letter.source_topic, partition = letter.partition, offset = letter.offset,
            kind = letter.kind, reason, dlq = %self.topic,
            "input sent to dead-letter topic"
        );
    }

    /// Sends the letter with its payload cut to `max_payload` bytes and its
    /// key to [`MAX_DLQ_KEY_BYTES`], marking what was cut.
    async fn send_cut(
        &self,
        letter: &DeadLetter<'_>,
        reason: &str,
        max_payload: usize,
        lifecycle: &Lifecycle,
    ) -> Result<(i32, i64), SendError> {
        let (partition, offset) = (letter.partition.to_string(), letter.offset.to_string());
        let record = self.record(letter, reason, max_payload, &partition, &offset);
        send(&self.producer, record, lifecycle).await
    }

    /// The dead letter's record: its payload cut to `max_payload` bytes and
    /// its key to [`MAX_DLQ_KEY_BYTES`], what was cut marked.
    fn record<'b>(
        &'b self,
        letter: &DeadLetter<'b>,
        reason: &str,
        max_payload: usize,
        partition: &str,
        offset: &str,
    ) -> Outgoing<'b> {
        let payload_len = letter.payload.map_or(0, <[u8]>::len);
        let payload = letter.payload.map(|p| &p[..p.len().min(max_payload)]);
        let key_len = letter.key.map_or(0, <[u8]>::len);
        let key = letter.key.map(|k| &k[..k.len().min(MAX_DLQ_KEY_BYTES)]);
        let (payload_from, key_from) = (payload_len.to_string(), key_len.to_string());
        let mut pairs = vec![
            (DlqHeaders::ERROR_KIND, letter.kind),
            (DlqHeaders::REASON, reason),
            (DlqHeaders::SOURCE_TOPIC, letter.source_topic),
            (DlqHeaders::SOURCE_PARTITION, partition),
            (DlqHeaders::SOURCE_OFFSET, offset),
        ];
        if payload_len > max_payload {
            pairs.push((DlqHeaders::TRUNCATED_FROM, payload_from.as_str()));
        }
        if key_len > MAX_DLQ_KEY_BYTES {
            pairs.push((DlqHeaders::KEY_TRUNCATED_FROM, key_from.as_str()));
        }
        Outgoing {
            topic: &self.topic,
            key,
            payload,
            headers: headers(pairs),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_accepted_input_fits_its_dead_letter_whole() {
        let mut config = Config::default();
        for limit in [1, 64 * 1024, 4 * 1024 * 1024, 10 * 1024 * 1024] {
            config.limits.max_message_bytes = limit;
            let payload = dlq_max_payload_bytes(&config);
            assert!(payload >= limit, "{limit}");
            // Payload, longest key and headers fit the producer's limit.
            assert!(payload + MAX_DLQ_KEY_BYTES + DLQ_HEADER_BYTES <= dlq_message_max_bytes(&config));
            assert_eq!(dlq_message_max_bytes(&config), limit + DLQ_HEADROOM_BYTES);
        }
        config.limits.max_message_bytes = usize::MAX;
        assert_eq!(dlq_message_max_bytes(&config), LIBRDKAFKA_MAX_MESSAGE_BYTES);
    }
}
