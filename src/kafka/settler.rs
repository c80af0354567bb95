//! Outputs whose acknowledgement no handler waits for
//! ([`Settlement::publish_detached`](super::Settlement::publish_detached)):
//! each output's settlement (its delivery awaited, then its inputs
//! acknowledged or dead-lettered) runs in one task of the worker's, the
//! settler, beside every other, instead of in its message's handler
//! future. A handler of stage 1's static or cached hints then ends once
//! its hint is queued, and a delivery report wakes one small future, not
//! the whole handler (which took about a sixth of the worker's CPU:
//! docs/BENCHMARKS.md, round thirty-nine).
//!
//! The worker starts it with its loop (`Settler::start`) and, at
//! shutdown, waits for it after its handler tasks, within the drain's
//! deadline; at the deadline it is aborted, and the inputs it held are
//! abandoned (uncommitted, redelivered), as a cut-off handler's are. A
//! settlement handed to it when it is not running (before the loop starts,
//! after it ended) is given back, for the caller to run itself. Its loop,
//! `side_by_side`, also runs a batch stage's messages taken together.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::OnceLock;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// One output's settlement, as the settler runs it.
pub type Settling = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The worker's settler: where settlements go while it runs. One per
/// worker, shared by its [`Delivery`](super::Delivery).
#[derive(Default)]
pub struct Settler {
    /// Set when the worker starts it; its receiver is the settler's task's.
    queue: OnceLock<mpsc::UnboundedSender<Settling>>,
    /// Cancelled at shutdown once no handler can hand it more: the task
    /// ends when what it holds has settled.
    closed: CancellationToken,
}

impl Settler {
    /// Starts its task, which tells `panicked` of a settlement that
    /// panics (the worker counts it as a handler's panic; its inputs are
    /// dropped with it, dead-lettered as a handler's panic drops them).
    /// `None` when it was started before.
    pub(super) fn start(
        &self,
        panicked: impl Fn(&(dyn Any + Send)) + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        let (queue, settlements) = mpsc::unbounded_channel();
        self.queue.set(queue).ok()?;
        let closed = self.closed.clone();
        Some(tokio::spawn(
            side_by_side(settlements, Some(closed), panicked).in_current_span(),
        ))
    }

    /// Hands `settling` to the settler's task; given back when the task is
    /// not running. Unbounded: each holds its inputs, which the worker's
    /// message bounds count.
    pub(crate) fn hand(&self, settling: Settling) -> Result<(), Settling> {
        let Some(queue) = self.queue.get() else {
            return Err(settling);
        };
        queue.send(settling).map_err(|refused| refused.0)
    }

    /// No handler hands it more: its task ends once what it holds settled.
    pub(super) fn close(&self) {
        self.closed.cancel();
    }
}

/// Runs every future `received` brings, side by side, until no more can
/// come and none is left: once the channel is closed or, with `closed`,
/// once that is cancelled and the channel empty. One that panics is
/// dropped and `panicked` told; the others go on. The settler's task, and
/// the task of a batch stage's messages taken together (the worker's).
pub(super) async fn side_by_side(
    mut received: mpsc::UnboundedReceiver<Settling>,
    closed: Option<CancellationToken>,
    panicked: impl Fn(&(dyn Any + Send)),
) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(ended) = running.next(), if !running.is_empty() => {
                if let Err(panic) = ended {
                    let panic: Box<dyn Any + Send> = panic;
                    panicked(panic.as_ref());
                }
            }
            next = received.recv(), if open => match next {
                Some(next) => running.push(AssertUnwindSafe(next).catch_unwind()),
                None => open = false,
            },
            // A sender that stays (the settler's, shared by every message)
            // no longer sends once `closed` is cancelled.
            _ = cancelled(closed.as_ref()), if open && running.is_empty() && closed.is_some() => {
                match received.try_recv() {
                    Ok(next) => running.push(AssertUnwindSafe(next).catch_unwind()),
                    Err(_) => return,
                }
            }
            else => return,
        }
    }
}

/// Once `token` is cancelled; never without one.
async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn counting(done: &Arc<AtomicUsize>) -> Settling {
        let done = done.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            done.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test]
    async fn a_settler_gives_back_what_it_cannot_run_and_ends_once_closed_and_settled() {
        let panics = Arc::new(AtomicUsize::new(0));
        let panicked = {
            let panics = panics.clone();
            move |_: &(dyn Any + Send)| {
                panics.fetch_add(1, Ordering::SeqCst);
            }
        };
        let settler = Settler::default();
        let done = Arc::new(AtomicUsize::new(0));
        // Not started: given back.
        assert!(settler.hand(counting(&done)).is_err());
        let task = settler.start(panicked.clone()).expect("started once");
        assert!(settler.start(panicked).is_none(), "one task a settler");
        for _ in 0..3 {
            assert!(settler.hand(counting(&done)).is_ok());
        }
        // A settlement that panics is counted; the others go on.
        assert!(settler
            .hand(Box::pin(async { panic!("a settlement panicked") }))
            .is_ok());
        settler.close();
        task.await.expect("the settler's task ends");
        assert_eq!(done.load(Ordering::SeqCst), 3);
        assert_eq!(panics.load(Ordering::SeqCst), 1);
        // Ended: given back.
        assert!(settler.hand(counting(&done)).is_err());
    }

    #[tokio::test]
    async fn without_a_token_the_futures_run_until_their_sender_is_dropped() {
        let (sender, received) = mpsc::unbounded_channel();
        let panics = Arc::new(AtomicUsize::new(0));
        let counted = panics.clone();
        let task = tokio::spawn(side_by_side(received, None, move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            sender.send(counting(&done)).expect("the task runs");
        }
        sender
            .send(Box::pin(async { panic!("a message's future panicked") }))
            .expect("the task runs");
        drop(sender);
        task.await.expect("the task ends once its sender is gone");
        assert_eq!(done.load(Ordering::SeqCst), 3);
        assert_eq!(panics.load(Ordering::SeqCst), 1);
    }
}
