//! The consume loop's pipeline, for a stage that asks ([`Stage::PIPELINED`]):
//! the loop only takes messages and begins them; the messages it took
//! together are decoded in a task of their own on tokio's workers
//! (`decode`), such tasks side by side; and one task beside the loop
//! (`hand_on`) takes their inputs in the order the loop took them and
//! hands each to [`Stage::handle`], so a stage's bookkeeping still sees its
//! messages in partition order.
//!
//! Between the loop and that task are at most `depth()` batches: when the
//! ordered task falls behind, the loop waits for it, as it waits for a
//! message slot. Every message is begun (its ticket taken, in order) on the
//! loop before it enters, so a drain or a shutdown waits for it as for any
//! other; one whose partition is revoked meanwhile is dropped before it is
//! handed on, or by the stage when the revoke comes while it is (see
//! [`Stage::PIPELINED`]). A revoke's drain can also come while the loop
//! still gathers a batch: it runs inside the poll that takes the next
//! message, on the loop's own thread, and the messages gathered so far
//! could not go on before it ends. They wait where a revoke finds them
//! (`Gathering`), and those of the revoked partitions are dropped then,
//! abandoned as on their way, instead of holding the drain until its
//! timeout.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::contract::Stage;
use super::handler::{first_poll, work_for, Begun, Panics};
use super::message::Rejected;
use super::partition::Partition;

/// Messages decoded together, in the order they were taken: each with its
/// input, or why it was rejected.
pub(super) type Decoded<I> = Vec<(Begun, Result<I, Rejected>)>;

/// A batch on its way to the ordered task: its decode's result, when done.
pub(super) type Batch<I> = oneshot::Receiver<Decoded<I>>;

/// The payload bytes after which the loop takes no more messages into a
/// batch: one-row JSON messages share a task by the dozen, and Arrow
/// messages of thousands of rows each get one, decoded side by side.
pub const BATCH_BYTES: usize = 256 * 1024;

/// The payload bytes under which the loop decodes a batch itself (or,
/// with no batch on its way, handles it too): one-row JSON messages, which
/// handed off took longer than on the loop (docs/BENCHMARKS.md, round
/// thirty).
pub const TASK_BYTES: usize = 64 * 1024;

/// The messages the loop has begun for the batch it gathers, not yet sent
/// on: shared with a revoke hook ([`Gathering::release`]), since a revoke's
/// drain may run inside the poll that takes the next one.
#[derive(Default)]
pub(super) struct Gathering(Mutex<Vec<Begun>>);

impl Gathering {
    /// Locked for a moment, never across a poll of the consumer (the drain
    /// that poll may run locks it too, on the same thread).
    fn lock(&self) -> MutexGuard<'_, Vec<Begun>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a message begun.
    pub(super) fn push(&self, begun: Begun) {
        self.lock().push(begun);
    }

    /// The batch gathered, in the order taken; empty when a revoke released
    /// all of it.
    pub(super) fn take(&self) -> Vec<Begun> {
        std::mem::take(&mut *self.lock())
    }

    /// A revoke hook's part: drops the gathered messages of `partitions`
    /// (marked revoking, or reset, before the hooks run), which abandons
    /// them, so that the drain does not wait for them. Held weakly: the
    /// consumer's hooks outlive the loop.
    pub(super) fn release(gathering: &Weak<Gathering>, partitions: &[Partition]) {
        let Some(gathering) = gathering.upgrade() else {
            return;
        };
        let released: Vec<Begun> = {
            let mut gathered = gathering.lock();
            let (go, stay) = std::mem::take(&mut *gathered).into_iter().partition(|begun| {
                let meta = begun.taken.meta();
                partitions
                    .iter()
                    .any(|(topic, partition)| *partition == meta.partition && **topic == *meta.topic)
            });
            *gathered = stay;
            go
        };
        // Dropped outside the lock: each abandons its ticket.
        drop(released);
    }
}

/// How many batches may wait between the loop and the ordered task: enough
/// to keep every worker decoding, few enough that decoded inputs not yet
/// handed on (outside a stage's own byte bound) stay a handful of messages.
pub(super) fn depth() -> usize {
    let workers = tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers());
    (2 * workers).max(4)
}

/// Decodes `batch` in order, each message within its span. A decoder that
/// panics is counted, and its message dropped unfinished, which
/// dead-letters it (`handler_panic`); the others go on.
pub(super) fn decode<S: Stage>(stage: &S, batch: Vec<Begun>, panics: &Panics) -> Decoded<S::Input> {
    let mut decoded = Vec::with_capacity(batch.len());
    for begun in batch {
        let input = std::panic::catch_unwind(AssertUnwindSafe(|| {
            begun
                .within
                .span
                .in_scope(|| stage.decode(begun.taken.shared_payload(), begun.taken.meta()))
        }));
        match input {
            Ok(input) => decoded.push((begun, input)),
            Err(panic) => {
                drop(begun);
                panics.count(panic.as_ref());
            }
        }
    }
    decoded
}

/// The ordered task: takes the loop's batches in the order it sent them,
/// waits for each one's decode, and hands its messages to the stage in
/// order (polled once in place, as the loop does: [`first_poll`]). Their
/// handler futures that are not done at once, and dead letters, run as
/// tasks of its own, which it waits for
/// once the loop stops sending. A message whose partition was revoked (or
/// reset) since it was taken is dropped instead, abandoned: its
/// partition's next owner redoes it, and the revoke's drain, which waits
/// for it, ends. One revoked while the stage handles it is the stage's to
/// drop (see [`Stage::PIPELINED`]).
///
/// `on_the_way` counts the batches sent and not yet handed on: it drops
/// once a batch's last message was, and the loop, which sees it at 0, may
/// hand messages on itself.
///
/// `cut_off` (the drain's deadline) ends it at once: its handler tasks are
/// aborted and waited for, and nothing more is handed on. The loop's tasks,
/// a batch's decode among them, are aborted only after it is cut off. A
/// batch whose decode task panicked otherwise (outside the decoder, which
/// is caught) lost its messages with it, dead-lettered as a handler's
/// panic drops them, and the next batch goes on.
pub(super) async fn hand_on<S: Stage>(
    stage: Arc<S>,
    mut batches: mpsc::Receiver<Batch<S::Input>>,
    on_the_way: Arc<AtomicUsize>,
    cut_off: CancellationToken,
    panics: Panics,
    rejected: Arc<AtomicU64>,
) {
    let mut tasks = JoinSet::new();
    loop {
        let mut batch = tokio::select! {
            biased;
            _ = cut_off.cancelled() => break,
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                panics.reap(joined);
                continue;
            }
            batch = batches.recv() => match batch {
                Some(batch) => batch,
                None => break,
            },
        };
        let decoded = loop {
            tokio::select! {
                biased;
                _ = cut_off.cancelled() => break None,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => panics.reap(joined),
                decoded = &mut batch => break Some(decoded.unwrap_or_default()),
            }
        };
        let Some(decoded) = decoded else {
            break;
        };
        for (begun, input) in decoded {
            // A rejected one too: its next owner dead-letters it.
            if begun.taken.partition_revoked() {
                continue;
            }
            // A handler that panics as it is called drops its message
            // unfinished, which dead-letters it; it is counted, and the
            // next goes on.
            let called =
                std::panic::catch_unwind(AssertUnwindSafe(|| work_for(&stage, begun, input, &rejected)));
            let task = match called {
                Ok((work, handled)) => first_poll::<S>(work, handled, &panics),
                Err(panic) => {
                    panics.count(panic.as_ref());
                    None
                }
            };
            if let Some(task) = task {
                tasks.spawn(task);
            }
        }
        on_the_way.fetch_sub(1, Ordering::AcqRel);
    }
    // The loop stopped sending: its handler tasks end on their own, unless
    // the drain's deadline comes first.
    while !cut_off.is_cancelled() {
        tokio::select! {
            biased;
            _ = cut_off.cancelled() => {}
            joined = tasks.join_next() => match joined {
                Some(joined) => panics.reap(joined),
                None => return,
            },
        }
    }
    tasks.abort_all();
    while let Some(joined) = tasks.join_next().await {
        panics.reap(joined);
    }
}
