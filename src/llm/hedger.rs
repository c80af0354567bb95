//! The hedging state one synthesizer's calls share (every arm's): each
//! model's latest latencies, whose p95 says when an attempt is slow enough
//! to duplicate, and the token bucket that caps duplicates at
//! `llm.hedge_max_share` of requests (see `hedge` for the hedged send).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::client::{LlmError, Reply};
use crate::config::{HedgeTo, LlmConfig, MIN_HEDGE_WINDOW};

/// The latest latencies of one model's calls, at most `cap` of them.
#[derive(Debug)]
struct LatencyWindow {
    samples: VecDeque<Duration>,
    cap: usize,
}

impl LatencyWindow {
    fn push(&mut self, latency: Duration) {
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back(latency);
    }

    /// The 95th percentile (nearest rank), once [`MIN_HEDGE_WINDOW`]
    /// samples are in.
    fn p95(&self) -> Option<Duration> {
        if self.samples.len() < MIN_HEDGE_WINDOW {
            return None;
        }
        let mut sorted: Vec<Duration> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        let rank = (sorted.len() as f64 * 0.95).ceil() as usize;
        sorted.get(rank.saturating_sub(1)).copied()
    }
}

/// Tokens for duplicates: `share` earned per first attempt, one spent per
/// duplicate, at most `capacity` held. It starts empty.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    share: f64,
    capacity: f64,
    /// Duplicates due and waiting for a token: one due later does not
    /// take a token before them.
    waiting: usize,
}

/// A duplicate's place among the waiting ones; dropped, it leaves.
struct Queued<'a>(&'a Hedger);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut bucket = lock(&self.0.bucket);
        bucket.waiting = bucket.waiting.saturating_sub(1);
    }
}

impl Bucket {
    fn earn(&mut self) {
        self.tokens = (self.tokens + self.share).min(self.capacity);
    }

    fn has_token(&self) -> bool {
        // A hair under 1 still counts: `share` added 20 times may fall
        // short of 1.0 by rounding.
        self.tokens >= 1.0 - 1e-9
    }

    fn take(&mut self) -> bool {
        let whole = self.has_token();
        if whole {
            self.tokens = (self.tokens - 1.0).max(0.0);
        }
        whole
    }

    fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.capacity);
    }
}

/// The hedging state one synthesizer's calls share (every arm's).
#[derive(Debug)]
pub(super) struct Hedger {
    /// Where a duplicate goes (`llm.hedge_to`).
    pub(super) to: HedgeTo,
    window: usize,
    min_delay: Duration,
    latencies: Mutex<HashMap<String, LatencyWindow>>,
    bucket: Mutex<Bucket>,
    /// Told when the bucket holds a whole token.
    token: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every method leaves its state consistent before it can panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hedger {
    /// `None` when `llm.hedge` is off (or its share is 0: no duplicate
    /// could ever be sent).
    pub(super) fn new(config: &LlmConfig) -> Option<Arc<Hedger>> {
        (config.hedge && config.hedge_max_share > 0.0).then(|| {
            Arc::new(Hedger {
                to: config.hedge_to,
                window: config.hedge_window,
                min_delay: Duration::from_millis(config.hedge_min_delay_ms),
                latencies: Mutex::new(HashMap::new()),
                bucket: Mutex::new(Bucket {
                    tokens: 0.0,
                    share: config.hedge_max_share,
                    capacity: (config.hedge_max_share * config.hedge_window as f64).max(1.0),
                    waiting: 0,
                }),
                token: Notify::new(),
            })
        })
    }

    /// How long `model`'s attempt runs before a duplicate is sent: its p95,
    /// at least the minimum delay; `None` while its window is too short.
    pub(super) fn delay(&self, model: &str) -> Option<Duration> {
        let p95 = lock(&self.latencies).get(model)?.p95()?;
        Some(p95.max(self.min_delay))
    }

    /// A first attempt was sent: it earns its share of a token, and a
    /// duplicate waiting for one is told when there is.
    pub(super) fn earn(&self) {
        let mut bucket = lock(&self.bucket);
        bucket.earn();
        if bucket.has_token() {
            self.token.notify_one();
        }
    }

    /// A taken token was not used.
    pub(super) fn refund(&self) {
        lock(&self.bucket).refund();
        self.token.notify_one();
    }

    /// Takes a token for a duplicate; with the bucket empty (or others
    /// waiting) waits for one while `first` runs, the longest waiter
    /// first. `Err` with `first`'s result when it ends before.
    pub(super) async fn token_or<F>(&self, first: &mut F) -> Result<(), Result<Reply, LlmError>>
    where
        F: Future<Output = Result<Reply, LlmError>> + Unpin,
    {
        let mut queued: Option<Queued<'_>> = None;
        loop {
            let token = self.token.notified();
            {
                let mut bucket = lock(&self.bucket);
                if (queued.is_some() || bucket.waiting == 0) && bucket.take() {
                    return Ok(());
                }
                if queued.is_none() {
                    bucket.waiting += 1;
                    queued = Some(Queued(self));
                }
            }
            tokio::select! {
                result = &mut *first => return Err(result),
                _ = token => {}
            }
        }
    }

    /// A call of `model` took `latency` (or at least that long, when a
    /// duplicate's answer won first).
    pub(super) fn record(&self, model: &str, latency: Duration) {
        let cap = self.window;
        lock(&self.latencies)
            .entry(model.to_string())
            .or_insert_with(|| LatencyWindow {
                samples: VecDeque::with_capacity(cap),
                cap,
            })
            .push(latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hedger(share: f64, window: usize, min_delay_ms: u64) -> Arc<Hedger> {
        Hedger::new(&LlmConfig {
            hedge: true,
            hedge_max_share: share,
            hedge_window: window,
            hedge_min_delay_ms: min_delay_ms,
            ..LlmConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn no_hedger_when_hedging_is_off() {
        assert!(Hedger::new(&LlmConfig::default()).is_none());
    }

    #[test]
    fn the_delay_is_the_p95_of_the_window_never_under_the_minimum() {
        let h = hedger(0.05, 100, 10);
        for ms in 1..MIN_HEDGE_WINDOW as u64 {
            h.record("m", Duration::from_millis(ms));
        }
        assert_eq!(h.delay("m"), None, "too few calls to say");
        // 1..=200 ms: the window keeps the last 100 (101..=200).
        for ms in MIN_HEDGE_WINDOW as u64..=200 {
            h.record("m", Duration::from_millis(ms));
        }
        assert_eq!(h.delay("m"), Some(Duration::from_millis(195)));
        assert_eq!(h.delay("other"), None, "per model");
        let slow_floor = hedger(0.05, 100, 1_000);
        for ms in 1..=100 {
            slow_floor.record("m", Duration::from_millis(ms));
        }
        assert_eq!(slow_floor.delay("m"), Some(Duration::from_secs(1)));
    }

    #[test]
    fn the_bucket_caps_hedges_at_the_share_of_requests() {
        let h = hedger(0.05, 200, 10);
        let mut bucket = lock(&h.bucket);
        assert!(!bucket.take(), "it starts empty");
        let mut hedges = 0;
        for _ in 0..10_000 {
            bucket.earn();
            // Every request wants a duplicate.
            if bucket.take() {
                hedges += 1;
            }
        }
        assert_eq!(hedges, 500, "5% of 10,000 requests");
        // Idle requests fill it up to its burst of share x window.
        for _ in 0..10_000 {
            bucket.earn();
        }
        let burst = std::iter::from_fn(|| bucket.take().then_some(())).count();
        assert_eq!(burst, 10);
        bucket.refund();
        assert!(bucket.take());
    }

    #[test]
    fn a_zero_share_never_hedges() {
        let zero = LlmConfig {
            hedge: true,
            hedge_max_share: 0.0,
            ..LlmConfig::default()
        };
        assert!(Hedger::new(&zero).is_none());
    }

    #[test]
    fn a_small_share_earns_a_burst_of_one() {
        let h = hedger(0.001, 200, 10);
        let mut bucket = lock(&h.bucket);
        for _ in 0..5_000 {
            bucket.earn();
        }
        assert!(bucket.take(), "0.001 x 5,000 requests");
        assert!(!bucket.take(), "at most one held");
    }
}
