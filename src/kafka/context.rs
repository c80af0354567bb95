//! The consumer's context: keeps the offset tracker in step with the
//! group's assignment, drains a revoked partition's in-flight work before
//! letting it go (and under exactly_once commits the open transaction
//! first), reports commit failures, exports the consumer lag and keeps
//! "in its group" (readiness) current from rebalances and statistics.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;

use super::guarantee::Guarantee;
use super::membership::{GroupView, Membership, Standing};
use super::partition::{describe, describe_partitions, partitions_of, Partition};
use super::tracker::{lock, OffsetTracker};
use crate::health::Lifecycle;
use crate::health::Signal;
use crate::metrics::StageMetrics;

/// Called when partitions are revoked, before their drain: a stage releases
/// work it parks outside handler tasks (stage 2's incomplete steps), which
/// could never finish on this member.
pub type RevokeHook = Box<dyn Fn(&[Partition]) + Send + Sync>;

/// Called after every rebalance (partitions assigned or revoked) with the
/// consumer's whole assignment then: stage 1 re-splits the group's rate
/// limits by the share of partitions it holds.
pub type AssignmentHook = Box<dyn Fn(&[Partition]) + Send + Sync>;

/// Consumer context: keeps the offset tracker in step with the group's
/// assignment, drains revoked partitions, reports commit failures and
/// exports the consumer lag.
pub struct StageContext {
    pub(crate) tracker: Arc<Mutex<OffsetTracker>>,
    pub(crate) metrics: Arc<StageMetrics>,
    pub(crate) lifecycle: Lifecycle,
    /// How long a revoked partition's in-flight work may take to finish.
    drain_timeout: Duration,
    revoke_hooks: Mutex<Vec<RevokeHook>>,
    assignment_hooks: Mutex<Vec<AssignmentHook>>,
    /// Whether the consumer is in its group (readiness): held on an
    /// assignment and while statistics say the group is up and steady.
    group: Arc<Signal>,
    /// Since when statistics have said the consumer is without its group's
    /// coordinator; past its bound the stage fails.
    membership: Mutex<Membership>,
    /// How outputs and offsets reach the broker: under exactly_once the
    /// worker's transactions, committed for the revoked partitions before
    /// they go, and told of every reset.
    guarantee: Guarantee,
}

impl StageContext {
    /// A context over `tracker` (shared with the commit point and, under
    /// exactly_once, the transactions) and `guarantee`.
    pub fn new(
        tracker: Arc<Mutex<OffsetTracker>>,
        guarantee: Guarantee,
        metrics: Arc<StageMetrics>,
        lifecycle: Lifecycle,
        drain_timeout: Duration,
        out_of_group_limit: Duration,
    ) -> Self {
        StageContext {
            membership: Mutex::new(Membership::new(out_of_group_limit)),
            tracker,
            metrics,
            lifecycle,
            drain_timeout,
            revoke_hooks: Mutex::new(Vec::new()),
            assignment_hooks: Mutex::new(Vec::new()),
            group: Arc::new(Signal::new("the consumer has not joined its group yet")),
            guarantee,
        }
    }

    /// Whether the consumer is in its group, for the stage's readiness.
    pub fn group_signal(&self) -> Arc<Signal> {
        self.group.clone()
    }

    /// Registers a hook called when partitions are revoked.
    pub fn on_revoke(&self, hook: RevokeHook) {
        self.revoke_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    /// Registers a hook called after every rebalance with the whole
    /// assignment.
    pub fn on_assignment(&self, hook: AssignmentHook) {
        self.assignment_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    pub(crate) fn reset(&self, partitions: &[Partition]) {
        {
            let mut tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.reset(topic, *partition);
            }
        }
        // After the tracker: what registers meanwhile is stale already.
        self.guarantee.forget(partitions);
    }

    /// Calls the revoke hooks: the stage releases what it parks for
    /// `partitions`.
    pub(crate) fn release_parked(&self, partitions: &[Partition]) {
        for hook in self.revoke_hooks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            hook(partitions);
        }
    }

    /// Under exactly_once, commits the open transaction (what the revoked
    /// partitions finished goes with it), so that their next owner starts
    /// after it. Blocking, until the drain's `deadline` at most: a commit
    /// still in progress then is resumed by the next cycle, and the next
    /// owner's offset fetch waits for it.
    fn commit_before_revoke(&self, consumer: &BaseConsumer<Self>, deadline: Instant) {
        let Some(transactions) = self.guarantee.transactions() else {
            return;
        };
        let group = consumer.group_metadata();
        let commit = || transactions.cycle(group.as_ref(), Some(deadline));
        let cycle = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(commit),
            _ => commit(),
        };
        tracing::info!(?cycle, "transaction committed before the revoke");
    }

    /// Drain on revoke: the revoked partitions' in-flight work gets until
    /// `deadline` (the drain timeout) to finish and store its offsets (librdkafka commits
    /// a removed partition's stored offsets itself on unassign); what has not
    /// finished by then is cancelled, uncommitted, and its new owner redoes
    /// it. A lost assignment (the group moved on without us) is not drained:
    /// its partitions belong to others already. Shutdown beginning meanwhile
    /// ends the wait, and so does the stage failing: the loop, whose thread
    /// this wait holds, is what stops on a failure. The revoked partitions'
    /// work is then cut off at once, not at the deadline, and redone by
    /// their next owner (under at_least_once an output sent and not yet
    /// acknowledged goes out again); the partitions the stage keeps get the
    /// whole drain at its shutdown.
    fn drain(&self, consumer: &BaseConsumer<Self>, partitions: &[Partition], deadline: Instant) {
        {
            let mut tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.mark_revoking(topic, *partition);
            }
        }
        self.release_parked(partitions);
        let started = Instant::now();
        let live = || {
            let tracker = lock(&self.tracker);
            partitions
                .iter()
                .map(|(t, p)| tracker.live_on(t, *p))
                .sum::<usize>()
        };
        let before = live();
        let lost = consumer.assignment_lost();
        let wait = || {
            while !lost && live() > 0 && Instant::now() < deadline && !self.lifecycle.is_over() {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        // The callback runs inside the consume loop's poll, on a runtime
        // worker: hand the worker's other tasks off while waiting, so the
        // handlers being waited for keep running.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            Ok(_) => {} // a current-thread runtime cannot run them meanwhile
            Err(_) => wait(),
        }
        let abandoned = live();
        {
            let tracker = lock(&self.tracker);
            for (topic, partition) in partitions {
                tracker.cancel(topic, *partition);
            }
        }
        self.metrics.revoke_drained(before.saturating_sub(abandoned));
        tracing::info!(
            partitions = %describe_partitions(partitions),
            finished = before.saturating_sub(abandoned),
            abandoned,
            assignment_lost = lost,
            drain_ms = started.elapsed().as_millis() as u64,
            "revoked partitions drained"
        );
    }

    fn commit_failed(&self, e: &KafkaError, what: &str) {
        match e {
            KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset) => {}
            // A member left or joined meanwhile; the offsets stay stored and
            // the next commit after the rebalance carries them (librdkafka
            // #4059). Expected when a worker of the group stops.
            KafkaError::ConsumerCommit(
                RDKafkaErrorCode::RebalanceInProgress | RDKafkaErrorCode::IllegalGeneration,
            ) => tracing::info!(error = %e, "offset commit deferred: group rebalancing"),
            _ => {
                self.metrics.commit_failed();
                tracing::warn!(error = %e, "{what}");
            }
        }
    }
}

impl ClientContext for StageContext {
    fn stats(&self, statistics: Statistics) {
        let standing = self
            .membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(&GroupView::of(&statistics), Instant::now());
        match standing {
            Standing::In => self.group.hold(),
            Standing::Out(why) => self.group.fail(why),
            Standing::Lost(why) => {
                self.group.fail(why.clone());
                // A report that comes while the stage stops (closing the
                // consumer polls its queue) does not turn the stop into a
                // failure.
                if !self.lifecycle.is_stopping() {
                    self.lifecycle.fail(why);
                }
            }
        }
        // librdkafka reports -1 for partitions without a known lag.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.metrics.set_consumer_lag(lag);
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = partitions_of(tpl);
            tracing::info!(partitions = %describe_partitions(&partitions), "partitions revoked");
            self.metrics.rebalanced("revoke");
            // At shutdown the stage drained already; the close revokes all.
            if !self.lifecycle.is_stopping() {
                // The drain and the commit after it end by one deadline.
                let deadline = Instant::now() + self.drain_timeout;
                self.drain(consumer, &partitions, deadline);
                self.commit_before_revoke(consumer, deadline);
            }
            self.reset(&partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = partitions_of(tpl);
                tracing::info!(partitions = %describe_partitions(&partitions), "partitions assigned");
                self.metrics.rebalanced("assign");
                self.reset(&partitions);
                self.membership
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .assigned();
                self.group.hold();
            }
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                self.group.fail(format!("the last rebalance failed: {e}"));
            }
            Rebalance::Revoke(_) => {}
        }
        let assignment = consumer
            .assignment()
            .map(|a| partitions_of(&a))
            .unwrap_or_default();
        self.metrics.set_assigned(assignment.len());
        if !matches!(rebalance, Rebalance::Error(_)) {
            for hook in self
                .assignment_hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                hook(&assignment);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!(offsets = %describe(offsets), "offsets committed"),
            Err(e) => self.commit_failed(&e, "offset commit failed"),
        }
    }
}
