//! The delivery contract, in one place: at-least-once. An offset is stored
//! only after every message below it on its partition was finished, which for
//! a stage means its output (hint, advantages or dead letter) was produced and
//! the broker acknowledged it. Automatic offset storing is off
//! (`enable.auto.offset.store=false`); librdkafka commits the stored offsets on
//! its timer, on revoke and on close. No other module stores offsets.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::consumer::StageConsumer;
pub use super::tracker::Ticket;
use super::tracker::{lock, OffsetTracker};
use crate::metrics::StageMetrics;

/// Hands out tickets for taken messages and stores offsets as they finish.
/// It holds the consumer weakly: messages that outlive their stage's loop
/// (parked in a stage's state) cannot keep the consumer open, so the loop
/// closes it at a place and time of its choosing.
#[derive(Clone)]
pub struct Committer {
    consumer: Weak<StageConsumer>,
    tracker: Arc<Mutex<OffsetTracker>>,
    metrics: Arc<StageMetrics>,
}

impl Committer {
    pub fn new(consumer: &Arc<StageConsumer>) -> Self {
        let tracker = consumer.context().tracker.clone();
        let metrics = consumer.context().metrics.clone();
        Committer {
            consumer: Arc::downgrade(consumer),
            tracker,
            metrics,
        }
    }

    /// Records a message as taken (in flight). The token is cancelled when
    /// its partition is revoked and the drain ends.
    pub fn begin(&self, topic: &str, partition: i32, offset: i64) -> (Ticket, Arc<CancellationToken>) {
        let mut tracker = lock(&self.tracker);
        let taken = tracker.begin(topic, partition, offset);
        self.metrics.set_in_flight(tracker.in_flight());
        taken
    }

    /// Messages taken and not finished, those already abandoned left out.
    pub fn live(&self) -> usize {
        lock(&self.tracker).live()
    }

    /// Whether dropping `ticket` unfinished abandons it: its partition was
    /// revoked (the new owner redoes the message).
    pub fn abandons(&self, ticket: &Ticket) -> bool {
        lock(&self.tracker).abandons(ticket)
    }

    /// A handle was dropped unfinished: its offset stays uncommitted, and a
    /// revoke drain no longer waits for it.
    pub fn abandon(&self, ticket: &Ticket) {
        lock(&self.tracker).abandon(ticket);
    }

    /// Marks a message finished and stores the partition's committable offset
    /// when it advanced. The store happens under the tracker's lock, so stored
    /// offsets never go backwards.
    pub fn finish(&self, ticket: Ticket) {
        let mut tracker = lock(&self.tracker);
        let next = tracker.finish(&ticket);
        self.store_advanced(tracker, next.map(|next| (ticket, next)));
    }

    /// [`Committer::finish`] for messages that finish together (a step's):
    /// the tracker locked once, and each partition's offset stored once, at
    /// the furthest it advanced. A step of 100,000 JSON rows stored it
    /// 100,000 times (a list built and librdkafka's partition looked up
    /// each time: about 11% of the worker's CPU).
    pub fn finish_all(&self, tickets: impl IntoIterator<Item = Ticket>) {
        let mut tracker = lock(&self.tracker);
        let advanced = tracker.finish_all(tickets);
        self.store_advanced(tracker, advanced);
    }

    /// After finishing: the in-flight gauge, then each partition's offset
    /// that `advanced`, stored while `tracker` is still locked (one message
    /// finished alone builds no list for it).
    fn store_advanced(
        &self,
        tracker: MutexGuard<'_, OffsetTracker>,
        advanced: impl IntoIterator<Item = (Ticket, i64)>,
    ) {
        self.metrics.set_in_flight(tracker.in_flight());
        let mut advanced = advanced.into_iter().peekable();
        if advanced.peek().is_none() {
            return;
        }
        // The loop closed the consumer: nothing can be stored any more, and
        // the messages are redelivered to the next owner.
        let Some(consumer) = self.consumer.upgrade() else {
            return;
        };
        for (ticket, next) in advanced {
            self.store(&consumer, &ticket, next);
        }
        drop(tracker);
    }

    /// Stores `next` as `ticket`'s partition's offset to commit.
    fn store(&self, consumer: &StageConsumer, ticket: &Ticket, next: i64) {
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&ticket.topic, ticket.partition, Offset::Offset(next)) {
            self.metrics.store_failed();
            tracing::warn!(topic = %ticket.topic, partition = ticket.partition, error = %e, "cannot build offset list");
            return;
        }
        // `store_offsets` maps to rd_kafka_offsets_store, which stores the
        // offset as given: `next` is already the next offset to consume.
        match consumer.store_offsets(&tpl) {
            Ok(()) => {}
            // The partition was revoked meanwhile: its new owner resumes from
            // the last commit, which is the safe side.
            Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => tracing::debug!(
                topic = %ticket.topic, partition = ticket.partition, offset = next,
                "offset not stored: partition no longer assigned"
            ),
            Err(e) => {
                self.metrics.store_failed();
                tracing::warn!(
                    topic = %ticket.topic, partition = ticket.partition, offset = next, error = %e,
                    "offset store failed"
                )
            }
        }
    }

    /// Messages taken and not yet finished.
    pub fn in_flight(&self) -> usize {
        lock(&self.tracker).in_flight()
    }

    /// Commits the stored offsets now and waits for the broker, at most
    /// `within` (shutdown; the broker may be gone). Blocking: runs on the
    /// blocking pool, which is left behind when the bound passes.
    pub async fn commit_sync(&self, within: Duration) -> Result<(), KafkaError> {
        let Some(consumer) = self.consumer.upgrade() else {
            return Ok(());
        };
        let commit = tokio::task::spawn_blocking(move || consumer.commit_consumer_state(CommitMode::Sync));
        let result = match tokio::time::timeout(within, commit).await {
            Ok(joined) => joined.map_err(|_| KafkaError::Canceled)?,
            Err(_) => Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::RequestTimedOut)),
        };
        match result {
            // Nothing was stored since the last commit; or the group is
            // rebalancing, and the stored offsets go with the next commit.
            Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::NoOffset
                | RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration,
            )) => Ok(()),
            Err(e) => {
                self.metrics.commit_failed();
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }
}
