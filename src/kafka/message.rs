//! One handle per taken message. A message taken off the input topic is a
//! [`Taken`]: its bytes, where it came from, and the obligation to finish it.
//! It ends in exactly one of three ways:
//!
//! - [`Taken::ack`]: its output was acknowledged; its offset may commit.
//! - [`Taken::reject`]: it can never be processed; it is dead-lettered with
//!   a typed kind and reason, then its offset may commit.
//! - dropped unfinished: when its partition was revoked or shutdown began,
//!   that is abandonment (uncommitted; redelivered to whoever owns the
//!   partition next). Otherwise the handler lost it (it panicked or returned
//!   early): it is rejected as `handler_panic`, so no offset can stick
//!   behind it.

use std::sync::Arc;

use bytes::Bytes;

use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_util::sync::CancellationToken;

use super::commit::{Committer, Ticket};
use super::dlq::{DeadLetter, DeadLetters};
use super::guarantee::Guarantee;
use super::hold::Holds;
use super::produce::SendError;
use super::settler::Settler;
use crate::health::Lifecycle;
use crate::messages::DecodeError;
use crate::metrics::StageMetrics;

/// The kind of a message dropped unfinished by its handler.
pub const HANDLER_PANIC: &str = "handler_panic";

/// The name of the topic the last message came from, shared by the
/// messages after it from the same topic: a message's metadata holds its
/// topic without a copy of its own (a worker reads one topic).
#[derive(Debug, Default)]
pub(crate) struct TopicNames {
    last: Option<Arc<str>>,
}

impl TopicNames {
    pub(crate) fn name(&mut self, topic: &str) -> Arc<str> {
        match &self.last {
            Some(last) if **last == *topic => last.clone(),
            _ => self.last.insert(Arc::from(topic)).clone(),
        }
    }
}

/// Where a record came from, detached from the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    /// Shared by the messages of its topic (the intake's `TopicNames`).
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RecordMeta {
    /// `message`'s metadata, its topic's name taken from `topics`.
    pub(crate) fn of(message: &BorrowedMessage<'_>, topics: &mut TopicNames) -> Self {
        Self::copied(message, topics.name(message.topic()))
    }

    /// `message`'s metadata copied out of librdkafka, under `topic` (its
    /// topic's shared name).
    pub fn copied(message: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        RecordMeta {
            topic,
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The key as text (lossy), for logs.
    pub fn key_text(&self) -> String {
        super::produce::key_text(self.key.as_deref())
    }

    /// A header's value, if present.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Bytes this metadata holds, for the in-flight byte bounds.
    pub fn footprint(&self) -> usize {
        self.topic.len()
            + self.key.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>()
            + 96
    }
}

/// Why an input can never be processed: it goes to the dead-letter topic
/// with this kind and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub kind: &'static str,
    pub reason: String,
}

impl From<DecodeError> for Rejected {
    fn from(e: DecodeError) -> Self {
        Rejected {
            kind: e.kind(),
            reason: e.to_string(),
        }
    }
}

/// What finishing a taken message needs: the commit point, the dead-letter
/// topic, the stage's lifecycle and its counters, the guarantee its
/// outputs and dead letters are delivered under, and the worker's settler
/// (outputs acknowledged off their handlers).
#[derive(Clone)]
pub struct Delivery {
    pub(crate) committer: Committer,
    pub(crate) dlq: DeadLetters,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) metrics: Arc<StageMetrics>,
    pub(crate) guarantee: Guarantee,
    pub(crate) settler: Arc<Settler>,
}

impl Delivery {
    pub fn new(
        committer: Committer,
        dlq: DeadLetters,
        lifecycle: Lifecycle,
        metrics: Arc<StageMetrics>,
        guarantee: Guarantee,
    ) -> Self {
        Delivery {
            committer,
            dlq,
            lifecycle,
            metrics,
            guarantee,
            settler: Arc::default(),
        }
    }

    /// The guarantee outputs and dead letters are delivered under.
    pub fn guarantee(&self) -> &Guarantee {
        &self.guarantee
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    pub fn dead_letters(&self) -> &DeadLetters {
        &self.dlq
    }
}

/// The unfinished part of a taken message.
struct Pending {
    ticket: Ticket,
    /// Shared by every message the loop took: one count a message, not a
    /// clone of each handle in it.
    delivery: Arc<Delivery>,
    /// Intake bounds (messages, bytes), released when the message ends.
    _holds: Holds,
    /// Cancelled when its partition's drain ends (its handler's is the
    /// same): what settles it off its handler stops then too.
    work: Arc<CancellationToken>,
    /// Set while a reject is being sent: when the send is dropped midway,
    /// the handle is rejected again with the same kind and reason (or
    /// abandoned, on a revoke or at shutdown), so its offset never sticks.
    rejecting: Option<(&'static str, String)>,
    /// Set on the copy made to reject a message its handler dropped: a
    /// second drop abandons it instead of rejecting it again.
    reported: bool,
}

impl Pending {
    /// Finishes the message: under exactly_once its intake holds stay with
    /// the worker's transactions until a commit passes its offset.
    fn finish(self) {
        let (delivery, ticket) = self.keep();
        delivery.committer.finish(ticket);
    }

    /// Hands its intake holds to its guarantee ([`Pending::finish`] before
    /// the offset): its delivery and ticket, to finish.
    fn keep(self) -> (Arc<Delivery>, Ticket) {
        let Pending {
            ticket,
            delivery,
            _holds,
            ..
        } = self;
        delivery.guarantee.keep(&ticket, _holds);
        (delivery, ticket)
    }
}

/// One message taken off the input topic. See the module docs.
pub struct Taken {
    payload: Bytes,
    meta: RecordMeta,
    pending: Option<Pending>,
}

impl Taken {
    pub(crate) fn new(
        payload: Bytes,
        meta: RecordMeta,
        (ticket, work): (Ticket, Arc<CancellationToken>),
        delivery: Arc<Delivery>,
        holds: Holds,
    ) -> Self {
        Taken {
            payload,
            meta,
            pending: Some(Pending {
                ticket,
                delivery,
                _holds: holds,
                work,
                rejecting: None,
                reported: false,
            }),
        }
    }

    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload's one shared copy, as [`Stage::decode`](super::Stage::decode) takes it.
    pub(crate) fn shared_payload(&self) -> &Bytes {
        &self.payload
    }

    pub fn meta(&self) -> &RecordMeta {
        &self.meta
    }

    pub fn offset(&self) -> i64 {
        self.meta.offset
    }

    /// Bytes this message holds, for the in-flight byte bounds.
    pub fn footprint(&self) -> usize {
        self.payload.len() + self.meta.footprint()
    }

    /// Its output was acknowledged (under exactly_once: registered, see
    /// [`Settlement`](super::Settlement)): the offset may commit.
    pub fn ack(mut self) {
        if let Some(pending) = self.pending.take() {
            pending.finish();
        }
    }

    /// [`Taken::ack`] for messages that finish together (a step's inputs):
    /// their offsets finished at once ([`Committer::finish_all`]).
    ///
    /// [`Committer::finish_all`]: super::commit::Committer::finish_all
    pub(crate) fn ack_all(inputs: Vec<Taken>) {
        let mut tickets = Vec::with_capacity(inputs.len());
        let mut pending = inputs
            .into_iter()
            .filter_map(|mut taken| taken.pending.take())
            .peekable();
        let Some(delivery) = pending.peek().map(|first| first.delivery.clone()) else {
            return;
        };
        for (own, ticket) in pending.map(Pending::keep) {
            // One worker's messages share its delivery.
            if Arc::ptr_eq(&own, &delivery) {
                tickets.push(ticket);
            } else {
                own.committer.finish(ticket);
            }
        }
        delivery.committer.finish_all(tickets);
    }

    /// The guarantee it is delivered under, while unfinished.
    pub(crate) fn guarantee(&self) -> Option<&Guarantee> {
        Some(&self.pending.as_ref()?.delivery.guarantee)
    }

    /// While unfinished: its worker's settler, and what is cancelled when
    /// its partition's drain ends.
    pub(crate) fn settler(&self) -> Option<(&Arc<Settler>, &Arc<CancellationToken>)> {
        let pending = self.pending.as_ref()?;
        Some((&pending.delivery.settler, &pending.work))
    }

    /// Whether its partition is draining after a revoke (or was reset since
    /// it was taken): its partition's next owner redoes it, and dropped now
    /// it is abandoned, not dead-lettered.
    pub fn partition_revoked(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.delivery.committer.abandons(&p.ticket))
    }

    /// Its ticket, while unfinished.
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        self.pending.as_ref().map(|p| p.ticket.clone())
    }

    /// It can never be processed: dead-letters it with `kind` and `reason`,
    /// then the offset may commit. When the drain deadline passes first, it
    /// stays unfinished (redelivered after a restart); when the dead-letter
    /// topic itself rejects it, the stage fails. Cancel-safe: dropped midway,
    /// the handle is rejected again (or abandoned) by its `Drop`.
    pub async fn reject(mut self, kind: &'static str, reason: &str) {
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        pending.rejecting = Some((kind, reason.to_string()));
        let delivery = pending.delivery.clone();
        let letter = DeadLetter {
            key: self.meta.key.as_deref(),
            payload: Some(&self.payload),
            source_topic: &self.meta.topic,
            partition: self.meta.partition,
            offset: self.meta.offset,
            kind,
            reason,
        };
        let sent = delivery
            .guarantee
            .send_dead_letter(&delivery.dlq, &letter, &pending.ticket, &delivery.lifecycle)
            .await;
        let Some(pending) = self.pending.take() else {
            return;
        };
        match sent {
            Ok(()) => pending.finish(),
            Err(SendError::Stopped) => {
                delivery.committer.abandon(&pending.ticket);
                delivery.metrics.abandoned();
                tracing::info!(
                    topic = %self.meta.topic, partition = self.meta.partition, offset = self.meta.offset, kind,
                    "drain deadline passed before the dead letter was acknowledged; the message stays uncommitted"
                );
            }
            Err(SendError::Permanent(e)) => delivery.lifecycle.fail(format!(
                "the dead-letter topic {} rejects messages ({e}); the input at {}[{}]@{} stays uncommitted. \
                 Create the topic (`hintstream topics create`) or grant this client write access",
                delivery.dlq.topic(),
                self.meta.topic,
                self.meta.partition,
                self.meta.offset
            )),
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let Some(mut pending) = self.pending.take() else {
            return;
        };
        let delivery = pending.delivery.clone();
        if pending.reported
            || delivery.lifecycle.is_stopping()
            || delivery.committer.abandons(&pending.ticket)
        {
            delivery.committer.abandon(&pending.ticket);
            delivery.metrics.abandoned();
            return;
        }
        // Not finished on a live partition: reject it, so the partition's
        // offsets move on. A reject dropped midway is sent again as it was;
        // anything else the handler lost.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            delivery.committer.abandon(&pending.ticket);
            delivery.metrics.abandoned();
            return;
        };
        let (kind, reason) = pending.rejecting.take().unwrap_or_else(|| {
            tracing::error!(
                topic = %self.meta.topic, partition = self.meta.partition, offset = self.meta.offset,
                "the handler dropped a message without finishing it; dead-lettering it as {HANDLER_PANIC}"
            );
            (
                HANDLER_PANIC,
                "the stage's handler dropped this message without finishing it (it panicked or returned early)"
                    .to_string(),
            )
        });
        pending.reported = true;
        let copy = Taken {
            payload: std::mem::take(&mut self.payload),
            meta: self.meta.clone(),
            pending: Some(pending),
        };
        runtime.spawn(tracing::Instrument::in_current_span(async move {
            copy.reject(kind, &reason).await
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_one_topic_share_its_name() {
        let mut topics = TopicNames::default();
        let first = topics.name("in");
        assert!(Arc::ptr_eq(&first, &topics.name("in")), "no copy a message");
        let other = topics.name("other");
        assert_eq!(&*other, "other");
        assert_eq!(&*topics.name("in"), "in");
        assert!(!Arc::ptr_eq(&first, &topics.name("in")), "the last topic only");
    }
}
