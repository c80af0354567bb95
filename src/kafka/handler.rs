//! A message's handler future as the consume loop runs it, wherever it is
//! dispatched from (the loop, a batch's task, a pipeline's ordered task):
//! run until its partition's drain ends ([`until_cancelled`]), polled once
//! in place before it becomes a task ([`poll_once`]), its panics counted
//! ([`Panics`]), within its message's span and trace ([`Begun`]); and a
//! decoded message's work, handled or dead-lettered ([`work_for`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::contract::{Stage, Work};
use super::message::{Rejected, Taken};
use crate::messages::decode::panic_text;
use crate::metrics::StageMetrics;
use crate::telemetry::{self, TraceParent};

/// One message's work as the loop hands it on.
pub(super) type MessageFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A message taken and begun: its ticket taken (on the loop, in message
/// order), its span and trace made.
pub(super) struct Begun {
    pub taken: Taken,
    pub within: Within,
}

/// What a begun message's work runs within.
pub(super) struct Within {
    /// Cancelled when its partition's drain ends.
    pub token: Arc<CancellationToken>,
    pub span: Span,
    /// Its producer's trace, when it says (W3C `traceparent`).
    pub trace: Option<TraceParent>,
}

impl Within {
    /// A handler's future, run within its message's span and trace until it
    /// ends or its partition's drain does ([`until_cancelled`]).
    pub(super) fn handler(self, work: MessageFuture) -> MessageFuture {
        let Within { token, span, trace } = self;
        Box::pin(telemetry::scope(
            trace,
            until_cancelled(work, token).instrument(span),
        ))
    }

    /// Other work for the message (its dead letter, a batch's decode and
    /// handler), run within its span and trace.
    pub(super) fn other(self, work: impl Future<Output = ()> + Send + 'static) -> MessageFuture {
        Box::pin(telemetry::scope(self.trace, work.instrument(self.span)))
    }
}

impl Begun {
    /// The message can never be processed: its dead-lettering, as a future
    /// to run as a task (a slow broker holds up no other message).
    pub(super) fn reject(self, why: Rejected) -> MessageFuture {
        let Begun { taken, within } = self;
        // Boxed: a dead letter's future is about 2.5 KB, and inline it
        // would size every message's.
        within.other(async move { Box::pin(taken.reject(why.kind, &why.reason)).await })
    }
}

/// Handlers that panicked: counted and logged where they are caught (a
/// task joined, a future polled in the loop or in a batch's task); their
/// messages are dead-lettered as their futures are dropped.
#[derive(Clone)]
pub(super) struct Panics {
    count: Arc<AtomicU64>,
    metrics: Arc<StageMetrics>,
}

impl Panics {
    pub(super) fn new(metrics: Arc<StageMetrics>) -> Self {
        Panics {
            count: Arc::default(),
            metrics,
        }
    }

    pub(super) fn count(&self, panic: &(dyn std::any::Any + Send)) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.metrics.handler_panicked();
        let text = panic_text(panic).unwrap_or("a non-text panic payload");
        tracing::error!(panic = %text, "a handler task panicked");
    }

    /// Counts a handler task that panicked, as it is joined. Its message
    /// was rejected as `handler_panic` when the task dropped it.
    pub(super) fn reap(&self, joined: Result<(), JoinError>) {
        if let Err(e) = joined {
            if e.is_panic() {
                self.count(e.into_panic().as_ref());
            }
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// A decoded message's work: its input's handler future ([`Stage::handle`]),
/// run within its span and trace until it ends or its partition drained;
/// or, for a rejected one, its dead-lettering (counted in `rejected`), a
/// future too, so a slow broker never blocks intake or shutdown. The flag
/// says which.
pub(super) fn work_for<S: Stage>(
    stage: &Arc<S>,
    begun: Begun,
    decoded: Result<S::Input, Rejected>,
    rejected: &AtomicU64,
) -> (MessageFuture, bool) {
    match decoded {
        Ok(input) => {
            let Begun { taken, within } = begun;
            // Boxed once, here: a stage's handler future can be large
            // (stage 1's holds its synthesis), and the wrappers would each
            // copy it whole.
            let work = Box::pin(stage.handle(Work {
                input,
                message: taken,
            }));
            (within.handler(work), true)
        }
        Err(why) => {
            rejected.fetch_add(1, Ordering::Relaxed);
            (begun.reject(why), false)
        }
    }
}

/// Where a message's work (see [`work_for`]) goes first: a handler's, for
/// a stage that asks ([`Stage::FIRST_POLL_IN_LOOP`]), is polled once in
/// place ([`poll_once`]). `Some` of it to run as a task.
pub(super) fn first_poll<S: Stage>(
    work: MessageFuture,
    handled: bool,
    panics: &Panics,
) -> Option<MessageFuture> {
    if handled && S::FIRST_POLL_IN_LOOP {
        poll_once(work, panics)
    } else {
        Some(work)
    }
}

/// Polls `task` once in place: `Some` of it when it is not done, to run on
/// as a task. A future polled again registers its task's waker then, so
/// nothing the no-op waker missed is lost. One that panics is counted and
/// dropped, which dead-letters its message, as a task's panic does.
pub(super) fn poll_once(mut task: MessageFuture, panics: &Panics) -> Option<MessageFuture> {
    let mut here = Context::from_waker(Waker::noop());
    match std::panic::catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(&mut here))) {
        Ok(Poll::Ready(())) => None,
        Ok(Poll::Pending) => Some(task),
        Err(panic) => {
            drop(task);
            panics.count(panic.as_ref());
            None
        }
    }
}

/// A message's handler `work`, run until it ends or its partition's drain
/// ends (`token`). A handler of one row mostly ends at its first poll: only
/// one that does not waits on the token (a waiter put in under the token's
/// lock). One that does not is polled again only at the task's next poll,
/// never twice in one: stage 2's messages are polled once in place
/// ([`poll_once`]), and a second poll at once ran past the handler's
/// `yield_now`, a step's publishing, where it was polled.
pub(super) async fn until_cancelled(mut work: MessageFuture, token: Arc<CancellationToken>) {
    if token.is_cancelled() {
        return;
    }
    if futures::poll!(&mut work).is_ready() {
        return;
    }
    // Skipping `work` at the first call below is sound only because it
    // comes in the same poll as the one above: nothing may await between.
    let mut cancelled = std::pin::pin!(token.cancelled());
    let mut polled = true;
    std::future::poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if std::mem::take(&mut polled) {
            return Poll::Pending;
        }
        work.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use tokio_util::sync::CancellationToken;

    use super::{until_cancelled, MessageFuture};

    /// A handler that yields once, then counts its end.
    fn yields_once(ended: &Arc<AtomicUsize>) -> MessageFuture {
        let ended = ended.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            ended.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test]
    async fn a_handler_is_polled_once_a_poll_and_stops_when_its_partition_drained() {
        let ended = Arc::new(AtomicUsize::new(0));
        let token = Arc::new(CancellationToken::new());
        let mut task = Box::pin(until_cancelled(yields_once(&ended), token.clone()));
        let mut here = Context::from_waker(Waker::noop());
        // The loop's own poll: the handler runs to its yield, no further.
        assert!(task.as_mut().poll(&mut here).is_pending());
        assert_eq!(ended.load(Ordering::SeqCst), 0, "past its yield in the same poll");
        // The task's next poll runs it on.
        task.await;
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        // Cancelled before its first poll: never run; after: dropped.
        token.cancel();
        until_cancelled(yields_once(&ended), token.clone()).await;
        let fresh = Arc::new(CancellationToken::new());
        let mut task = Box::pin(until_cancelled(yields_once(&ended), fresh.clone()));
        assert!(task.as_mut().poll(&mut here).is_pending());
        fresh.cancel();
        assert_eq!(task.as_mut().poll(&mut here), Poll::Ready(()));
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    }
}
