//! A stream that notes when it last moved a byte, and the wait that ends
//! once it has moved none for a while: the endpoint's idle timeout, and the
//! order in which its slots are taken back.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When a stream last moved a byte, as time since it was wrapped.
#[derive(Clone)]
pub(super) struct Activity {
    since: Instant,
    /// Nanoseconds after `since`.
    last: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            since: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::Relaxed);
    }

    /// When the stream last moved a byte (when it was wrapped, before its
    /// first).
    pub(super) fn last_active(&self) -> Instant {
        self.since + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Resolves once the stream has moved no byte for `idle`.
    pub(super) async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last_active() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// `inner`, noting each read or write that moves a byte in its [`Activity`].
pub(super) struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S) -> (Self, Activity) {
        let activity = Activity::new();
        (
            Tracked {
                inner,
                activity: activity.clone(),
            },
            activity,
        )
    }

    /// The wrapped stream, to ask it something that moves no byte.
    pub(super) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, bytes);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn the_idle_wait_restarts_with_every_byte_moved() {
        let (client, server) = tokio::io::duplex(64);
        let (mut tracked, activity) = Tracked::new(server);
        let mut client = client;
        let started = Instant::now();
        let idle = activity.clone();
        let waited = tokio::spawn(async move {
            idle.idle_for(Duration::from_secs(10)).await;
            started.elapsed()
        });
        tokio::time::sleep(Duration::from_secs(6)).await;
        client.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        tracked.read_exact(&mut byte).await.unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        tracked.write_all(b"y").await.unwrap();
        assert_eq!(waited.await.unwrap(), Duration::from_secs(22), "6 + 6 + 10 s");
    }
}
