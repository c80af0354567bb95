//! A stage's lifecycle, as every part of it sees it: running; stopping
//! (shutdown began: intake has stopped and in-flight work has until a
//! deadline); or failed (something the stage cannot work around, such as a
//! dead-letter topic that rejects every message, so it stops and exits 1).
//!
//! Every wait that could otherwise last forever (a produce retrying a
//! transient error, a dead letter, the drain) races the deadline from here.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Shared by every part of one stage; cloning shares it.
#[derive(Clone)]
pub struct Lifecycle(Arc<Inner>);

struct Inner {
    /// Set when shutdown begins: the instant in-flight work must be done by.
    deadline: watch::Sender<Option<Instant>>,
    /// Set once, by the first fatal error.
    failure: watch::Sender<Option<String>>,
    /// Set once either of the two above is: read for each message taken,
    /// where each watch's read takes its lock.
    over: AtomicBool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle(Arc::new(Inner {
            deadline: watch::Sender::new(None),
            failure: watch::Sender::new(None),
            over: AtomicBool::new(false),
        }))
    }
}

impl Lifecycle {
    pub fn new() -> Self {
        Self::default()
    }

    /// Shutdown began: in-flight work has `drain` to finish. A second call
    /// keeps the first deadline.
    pub fn begin_shutdown(&self, drain: Duration) {
        self.0.deadline.send_if_modified(|deadline| {
            if deadline.is_some() {
                return false;
            }
            *deadline = Some(Instant::now() + drain);
            true
        });
        self.0.over.store(true, Ordering::Release);
    }

    /// Whether shutdown began. Work dropped unfinished from now on is
    /// abandoned (redelivered after a restart), not a handler failure.
    pub fn is_stopping(&self) -> bool {
        self.0.deadline.borrow().is_some()
    }

    /// Whether shutdown began and its drain deadline passed already.
    pub fn deadline_has_passed(&self) -> bool {
        self.0.deadline.borrow().is_some_and(|d| Instant::now() >= d)
    }

    /// Resolves once shutdown began.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.deadline.subscribe();
        async move {
            if rx.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once shutdown began and its deadline passed; never before.
    pub fn deadline_passed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.deadline.subscribe();
        async move {
            loop {
                let deadline = *rx.borrow_and_update();
                if let Some(deadline) = deadline {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Records a fatal error; the stage stops and exits 1 with `reason`. The
    /// first reason is kept.
    pub fn fail(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.0.failure.send_if_modified(|failure| {
            if failure.is_some() {
                return false;
            }
            tracing::error!(reason = %reason, "stage failed; stopping");
            *failure = Some(reason);
            true
        });
        self.0.over.store(true, Ordering::Release);
    }

    /// Whether shutdown began or the stage failed: [`Lifecycle::is_stopping`]
    /// or a [`Lifecycle::failure`], read without a lock.
    pub fn is_over(&self) -> bool {
        self.0.over.load(Ordering::Acquire)
    }

    /// The fatal error, once there is one.
    pub fn failure(&self) -> Option<String> {
        self.0.failure.borrow().clone()
    }

    /// Resolves with the fatal error's reason when there is one.
    pub fn failed(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.0.failure.subscribe();
        async move {
            loop {
                if let Some(reason) = rx.borrow_and_update().clone() {
                    return reason;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_passes_only_after_shutdown_began() {
        let lifecycle = Lifecycle::new();
        let passed = lifecycle.deadline_passed();
        tokio::pin!(passed);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), &mut passed)
                .await
                .is_err(),
            "no deadline before shutdown"
        );
        assert!(!lifecycle.is_stopping());
        assert!(!lifecycle.is_over());
        lifecycle.begin_shutdown(Duration::from_secs(5));
        assert!(lifecycle.is_over());
        lifecycle.begin_shutdown(Duration::from_secs(500));
        let started = Instant::now();
        passed.await;
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(5),
            "the first deadline holds"
        );
        assert!(lifecycle.is_stopping());
    }

    #[tokio::test]
    async fn the_first_failure_is_kept() {
        let lifecycle = Lifecycle::new();
        let failed = lifecycle.failed();
        assert!(!lifecycle.is_over());
        lifecycle.fail("dlq gone");
        assert!(lifecycle.is_over() && !lifecycle.is_stopping());
        lifecycle.fail("later");
        assert_eq!(failed.await, "dlq gone");
        assert_eq!(lifecycle.failure().as_deref(), Some("dlq gone"));
    }
}
