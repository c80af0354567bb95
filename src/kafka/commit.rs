//! The delivery contract, in one place: at-least-once. An offset is stored
//! only after every message below it on its partition was finished, which for
//! a stage means its output (hint, advantages or dead letter) was produced and
//! the broker acknowledged it. Automatic offset storing is off
//! (`enable.auto.offset.store=false`); librdkafka commits the stored offsets on
//! its timer and on close. No other module stores offsets.

use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::tracker::OffsetTracker;
pub use super::tracker::Ticket;
use super::StageConsumer;

/// Hands out tickets for taken messages and stores offsets as they finish.
#[derive(Clone)]
pub struct Committer {
    consumer: Arc<StageConsumer>,
    tracker: Arc<Mutex<OffsetTracker>>,
}

impl Committer {
    pub fn new(consumer: Arc<StageConsumer>) -> Self {
        let tracker = consumer.context().tracker.clone();
        Committer { consumer, tracker }
    }

    /// Records a message as taken (in flight).
    pub fn begin(&self, topic: &str, partition: i32, offset: i64) -> Ticket {
        lock(&self.tracker).begin(topic, partition, offset)
    }

    /// Marks a message finished and stores the partition's committable offset
    /// when it advanced. The store happens under the tracker's lock, so stored
    /// offsets never go backwards.
    pub fn finish(&self, ticket: Ticket) {
        let mut tracker = lock(&self.tracker);
        let Some(next) = tracker.finish(&ticket) else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&ticket.topic, ticket.partition, Offset::Offset(next)) {
            tracing::warn!(topic = %ticket.topic, partition = ticket.partition, error = %e, "cannot build offset list");
            return;
        }
        // `store_offsets` maps to rd_kafka_offsets_store, which stores the
        // offset as given: `next` is already the next offset to consume.
        match self.consumer.store_offsets(&tpl) {
            Ok(()) => {}
            // The partition was revoked meanwhile: its new owner resumes from
            // the last commit, which is the safe side.
            Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => tracing::debug!(
                topic = %ticket.topic, partition = ticket.partition, offset = next,
                "offset not stored: partition no longer assigned"
            ),
            Err(e) => tracing::warn!(
                topic = %ticket.topic, partition = ticket.partition, offset = next, error = %e,
                "offset store failed"
            ),
        }
    }

    /// Messages taken and not yet finished.
    pub fn in_flight(&self) -> usize {
        lock(&self.tracker).in_flight()
    }

    /// Commits the stored offsets now and waits for the broker (shutdown).
    /// Blocking: runs on the blocking pool.
    pub async fn commit_sync(&self) -> Result<(), KafkaError> {
        let consumer = self.consumer.clone();
        let result = tokio::task::spawn_blocking(move || consumer.commit_consumer_state(CommitMode::Sync))
            .await
            .map_err(|_| KafkaError::Canceled)?;
        match result {
            // Nothing was stored since the last commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
            other => other,
        }
    }
}

/// Locks the tracker. A panic while holding it cannot leave the tracker
/// half-updated in a way that commits too far (every method either completes
/// or changes nothing committable), so a poisoned lock is taken over.
pub(crate) fn lock(tracker: &Mutex<OffsetTracker>) -> MutexGuard<'_, OffsetTracker> {
    tracker.lock().unwrap_or_else(|p| p.into_inner())
}
