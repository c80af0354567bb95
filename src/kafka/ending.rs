//! How a worker's transaction ends under exactly_once: committed, or
//! aborted after an abortable error, every call bounded, and a call that
//! timed out called again within its bound rather than followed by an
//! abort.
//!
//! librdkafka sorts each error of a transaction call (its INTRODUCTION.md,
//! "Transactional Producer", and `rd_kafka_commit_transaction`'s docs):
//! *retriable* (timed out: the call may be made again, and a commit or an
//! abort then resumes what goes on in the background), *abortable* (the
//! transaction failed: abort it, rewind the input, begin again) and *fatal*
//! (the producer is done: fenced by a newer instance). An error that is none
//! of these is treated as fatal, as it advises. After a commit timed out,
//! librdkafka refuses an abort ("Conflicting commit_transaction API call is
//! already in progress"): the commit can only be called again.
//!
//! Bounds. Each call of a commit or an abort waits at most
//! `kafka.transaction_timeout_ms`; one that times out is said and counted
//! (`transaction_retries_total{call}`) and called again, up to
//! [`CALLS_PER_END`] calls' time from its first call. A caller with a nearer
//! bound (a revoke's drain, shutdown's final commit) caps every call by it;
//! what is still in progress then is resumed by the next cycle (a consumer
//! that takes over a revoked partition meanwhile waits for it: its offset
//! fetch is refused while a transaction holds offsets of that partition).
//! A commit or abort not acknowledged within its own bound stops the stage
//! (exit 1) saying why: nothing else is safe (a commit in progress cannot
//! be aborted, and no transaction can begin), and the restart under the
//! same worker id settles it at `init_transactions` (the broker has
//! committed it, or aborts it) and resumes from the committed offsets.

use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, Producer};

use super::partition::Partition;
use super::produce::is_permanent;
use super::producers::StageProducer;
use crate::metrics::StageMetrics;

/// A commit or an abort is called again after a timeout until this many
/// calls' time (`kafka.transaction_timeout_ms` each) passed since its first
/// call; then the stage stops. Three: a transaction coordinator that moved
/// (its leader failed over) answers within a second call's time.
pub const CALLS_PER_END: u32 = 3;

/// The pause before calling again a call that failed retriably without
/// waiting its time.
const RETRY_GRACE: Duration = Duration::from_millis(50);

/// A commit or an abort begun and not acknowledged yet.
pub(crate) struct Ending {
    pub(crate) end: End,
    /// Its first call: its bound runs from here.
    pub(crate) since: Instant,
    /// Calls that timed out so far.
    pub(crate) retries: u32,
}

/// Which end.
pub(crate) enum End {
    Commit {
        /// Outputs in it.
        outputs: usize,
        /// The offsets it commits (the next offset to consume), by
        /// partition.
        offsets: Vec<(Partition, i64)>,
        /// The worker's count of partition resets when it began: one reset
        /// meanwhile makes the offsets it commits unknown to the worker.
        resets: u64,
        /// Its records' deliveries, by topic: one refused for good explains
        /// an abortable commit error.
        deliveries: Vec<(String, DeliveryFuture)>,
    },
    Abort {
        /// Why the transaction is aborted.
        reason: String,
    },
}

impl Ending {
    pub(crate) fn commit(
        outputs: usize,
        offsets: Vec<(Partition, i64)>,
        resets: u64,
        deliveries: Vec<(String, DeliveryFuture)>,
    ) -> Self {
        Ending {
            end: End::Commit {
                outputs,
                offsets,
                resets,
                deliveries,
            },
            since: Instant::now(),
            retries: 0,
        }
    }

    pub(crate) fn abort(reason: String) -> Self {
        Ending {
            end: End::Abort { reason },
            since: Instant::now(),
            retries: 0,
        }
    }

    pub(crate) fn is_commit(&self) -> bool {
        matches!(self.end, End::Commit { .. })
    }

    /// The call's name, as the metric's label and the logs say it.
    pub(crate) fn call(&self) -> &'static str {
        if self.is_commit() {
            "commit"
        } else {
            "abort"
        }
    }

    /// A record of the commit that the broker refused for good, if one was:
    /// its topic and the error.
    pub(crate) fn refused(&mut self) -> Option<(String, KafkaError)> {
        let End::Commit { deliveries, .. } = &mut self.end else {
            return None;
        };
        deliveries
            .drain(..)
            .find_map(|(topic, delivery)| match delivery.now_or_never() {
                Some(Ok(Err((e, _)))) if is_permanent(&e) => Some((topic, e)),
                _ => None,
            })
    }
}

/// How an error of a transaction call is handled.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sorted {
    /// Call it again (within the bound).
    Retry,
    /// The transaction failed: abort it and rewind.
    Abort,
    /// The producer is done: the stage stops.
    Fatal { fenced: bool },
}

/// Sorts an error of a transaction call as librdkafka says to. rdkafka's
/// `commit_transaction` flushes first, and a flush that timed out never
/// reached librdkafka's commit: retriable too.
pub(crate) fn sort(e: &KafkaError) -> Sorted {
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => Sorted::Fatal {
            fenced: matches!(
                t.code(),
                RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch
            ),
        },
        KafkaError::Transaction(t) if t.txn_requires_abort() => Sorted::Abort,
        KafkaError::Transaction(t) if t.is_retriable() => Sorted::Retry,
        // Neither retriable, abortable nor fatal: fatal, as librdkafka advises.
        KafkaError::Transaction(_) => Sorted::Fatal { fenced: false },
        KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut) => Sorted::Retry,
        _ => Sorted::Abort,
    }
}

/// What one turn at ending a transaction came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// Committed (a commit) or aborted (an abort).
    Done,
    /// Still in progress at the caller's bound: a later cycle resumes it.
    Pending,
    /// The commit failed for the transaction: abort it (why).
    Abort(String),
    /// Nothing safe is left: the stage stops (why, for the user).
    Fatal(String),
}

/// The transaction calls of one worker's producer, with their bound.
pub(crate) struct Calls<'a> {
    pub(crate) producer: &'a StageProducer,
    pub(crate) transactional_id: &'a str,
    /// `kafka.transaction_timeout_ms`: the longest one call waits.
    pub(crate) per_call: Duration,
    pub(crate) metrics: &'a StageMetrics,
}

impl Calls<'_> {
    /// An ending's own bound: [`CALLS_PER_END`] calls' time.
    pub(crate) fn bound(&self) -> Duration {
        self.per_call * CALLS_PER_END
    }

    /// Calls commit or abort (as `ending` says) until it is acknowledged,
    /// fails, or the turn's time is up: `within` for a caller with a bound,
    /// and never past the ending's own bound, after which the stage stops.
    pub(crate) fn end(&self, ending: &mut Ending, within: Option<Instant>) -> Step {
        let own = ending.since + self.bound();
        let turn = within.map_or(own, |w| w.min(own));
        loop {
            let now = Instant::now();
            if now >= own {
                return Step::Fatal(self.gave_up(ending));
            }
            if now >= turn {
                return Step::Pending;
            }
            let wait = (turn - now).min(self.per_call);
            let called = if ending.is_commit() {
                self.producer.commit_transaction(wait)
            } else {
                self.producer.abort_transaction(wait)
            };
            let Err(e) = called else {
                return Step::Done;
            };
            match sort(&e) {
                Sorted::Retry => {
                    self.retried(ending, wait, own, &e);
                    // A grace period when it failed without waiting, as
                    // librdkafka advises, rather than a busy loop.
                    if now.elapsed() < wait {
                        std::thread::sleep(RETRY_GRACE.min(turn.saturating_duration_since(Instant::now())));
                    }
                }
                Sorted::Abort if ending.is_commit() => {
                    return match ending.refused() {
                        Some((topic, refusal)) => {
                            Step::Fatal(refused_for_good(&topic, self.transactional_id, &refusal))
                        }
                        None => Step::Abort(format!(
                            "could not commit the transaction of {}: {e}",
                            self.transactional_id
                        )),
                    }
                }
                Sorted::Abort => {
                    return Step::Fatal(format!(
                        "the transaction of {} could not be aborted: {e}",
                        self.transactional_id
                    ))
                }
                Sorted::Fatal { fenced } => return Step::Fatal(self.fatal(ending.call(), &e, fenced)),
            }
        }
    }

    /// A call of `ending` that timed out (or failed retriably): counted,
    /// said, and called again.
    fn retried(&self, ending: &mut Ending, waited: Duration, own: Instant, e: &KafkaError) {
        ending.retries += 1;
        self.metrics.transaction_retried(ending.call());
        tracing::info!(
            transactional_id = %self.transactional_id,
            call = ending.call(),
            waited_ms = waited.as_millis() as u64,
            retries = ending.retries,
            left_ms = own.saturating_duration_since(Instant::now()).as_millis() as u64,
            error = %e,
            "transaction {} not acknowledged yet; calling it again (librdkafka resumes it)",
            ending.call()
        );
    }

    /// Why the stage stops when `ending`'s bound passed.
    fn gave_up(&self, ending: &Ending) -> String {
        let (id, ms, timed_out) = (self.transactional_id, self.bound().as_millis(), ending.retries);
        match &ending.end {
            End::Commit { .. } => format!(
                "the commit of the transaction of {id} was not acknowledged within {CALLS_PER_END} × \
                 kafka.transaction_timeout_ms ({ms} ms; {timed_out} calls timed out): its transaction coordinator or an output partition's \
                 leader did not answer. A commit in progress cannot be aborted, so this worker stops; its \
                 restart under the same worker id finds the transaction committed or aborted by the broker and \
                 resumes from the committed offsets"
            ),
            End::Abort { reason } => format!(
                "the abort of the transaction of {id} was not acknowledged within {CALLS_PER_END} × \
                 kafka.transaction_timeout_ms ({ms} ms; {timed_out} calls timed out) after: {reason}. This worker stops; its restart under \
                 the same worker id aborts what is left open and resumes from the committed offsets"
            ),
        }
    }

    /// Why the stage stops after a fatal error of `call`.
    pub(crate) fn fatal(&self, call: &str, e: &KafkaError, fenced: bool) -> String {
        let id = self.transactional_id;
        if fenced {
            format!(
                "fenced: a newer instance with transactional.id {id} started (another worker runs with the \
                 same --worker-id, or this one was restarted), or the broker aborted a transaction of this one \
                 that outlived kafka.transaction_timeout_ms; this one stops ({e})"
            )
        } else {
            format!("could not {call} the transaction of {id}: {e}")
        }
    }
}

/// Why the stage stops when the broker refused a record of a transaction
/// for good.
pub(crate) fn refused_for_good(topic: &str, id: &str, e: &KafkaError) -> String {
    format!(
        "{topic} refused a record of the transaction of {id} ({e}); under exactly_once such a record stops \
         the stage: grant this client write access to {topic} or raise its max.message.bytes"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_that_timed_out_is_called_again_and_other_plain_errors_abort() {
        assert_eq!(
            sort(&KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)),
            Sorted::Retry
        );
        assert_eq!(
            sort(&KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)),
            Sorted::Abort
        );
    }
}
