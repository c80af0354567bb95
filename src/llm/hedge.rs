//! Hedged requests (`llm.hedge`, "The Tail at Scale"): when an HTTP attempt
//! is still in flight after its model's observed p95 latency (over the last
//! `llm.hedge_window` calls, never under `llm.hedge_min_delay_ms`), one
//! duplicate is sent, to the same model or the chain's next
//! (`llm.hedge_to`); the first complete answer wins and the other request
//! is dropped (its HTTP request aborted).
//!
//! Bounds:
//! - A token bucket caps duplicates at `llm.hedge_max_share` of requests:
//!   each first attempt earns that share of a token, a duplicate takes a
//!   whole one, and the bucket holds at most `share × window` tokens (at
//!   least one). Over any run, duplicates never exceed the share of first
//!   attempts plus that burst. When the bucket is empty, a duplicate that
//!   is due waits for the next token while its attempt runs (the longest
//!   waiter first): under pressure the tokens go to the attempts still in
//!   flight, the slowest, instead of to whichever came due first.
//! - A duplicate takes a call slot, the rate limits and a budget
//!   reservation like any attempt, without waiting: one that cannot get
//!   them at once is not sent (and its token is given back).
//! - Only the HTTP attempt in flight is hedged, never a retry's backoff or
//!   a `retry-after` wait: those happen between attempts, outside the race.
//! - No hedge before a model has [`MIN_HEDGE_WINDOW`] successful calls in
//!   its window, and none while recording a cassette (which replays one
//!   attempt sequence).
//!
//! A cancelled request's cost is unknown: the budget charges its
//! reservation (the worst case), and the extra-spend metric estimates it as
//! the winning answer's usage at the cancelled model's price.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::Notify;
use tracing::Span;

use super::client::CacheMarks;
use super::client::{Completion, LlmError, Reply};
use super::limits::Admission;
use super::pricing::{cost_usd, price_of};
use super::retry::attempt_span;
use super::routing::Link;
use super::synth::Synthesizer;
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
    to: HedgeTo,
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
    fn delay(&self, model: &str) -> Option<Duration> {
        let p95 = lock(&self.latencies).get(model)?.p95()?;
        Some(p95.max(self.min_delay))
    }

    /// A first attempt was sent: it earns its share of a token, and a
    /// duplicate waiting for one is told when there is.
    fn earn(&self) {
        let mut bucket = lock(&self.bucket);
        bucket.earn();
        if bucket.has_token() {
            self.token.notify_one();
        }
    }

    /// A taken token was not used.
    fn refund(&self) {
        lock(&self.bucket).refund();
        self.token.notify_one();
    }

    /// Takes a token for a duplicate; with the bucket empty (or others
    /// waiting) waits for one while `first` runs, the longest waiter
    /// first. `Err` with `first`'s result when it ends before.
    async fn token_or<F>(&self, first: &mut F) -> Result<(), Result<Reply, LlmError>>
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
    fn record(&self, model: &str, latency: Duration) {
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

/// How a hedged attempt ended.
pub(super) enum Raced {
    /// The first attempt's own result; a duplicate, if one was sent, lost
    /// or failed.
    First(Result<Reply, LlmError>),
    /// The duplicate's answer, from the chain's model at `index`; `first`
    /// is the first attempt's error, or `None` when it was cancelled.
    Hedge {
        reply: Reply,
        index: usize,
        first: Option<LlmError>,
    },
}

impl Synthesizer {
    /// Sends an admitted attempt of `link`'s model and, when hedging is on
    /// and the attempt outlives its model's delay, one duplicate; the first
    /// complete answer wins. The duplicate's span carries the same
    /// `attempt` number and `hedge = true`. `hedge` false (recording a
    /// cassette): the attempt alone.
    pub(super) async fn send_hedged(
        &self,
        link: &Link,
        request: &Completion<'_>,
        admission: Admission<'_>,
        span: &Span,
        deadline: Instant,
        (attempt, hedge, waited): (u32, bool, Duration),
    ) -> Raced {
        let Some(hedger) = self.hedger.as_deref().filter(|_| hedge) else {
            return Raced::First(self.send(link, request, admission, waited, span).await);
        };
        hedger.earn();
        let started = Instant::now();
        // The window's clock is Tokio's: the same as `started`'s in a
        // stage, and the paused clock in tests.
        let clock = tokio::time::Instant::now();
        // Boxed, so that dropping it aborts the request there and then.
        let mut first = Box::pin(self.send(link, request, admission, waited, span));
        let ended = |result: Result<Reply, LlmError>| {
            if result.is_ok() {
                hedger.record(&link.id, clock.elapsed());
            }
            Raced::First(result)
        };
        let Some(delay) = hedger.delay(&link.id) else {
            return ended(first.await);
        };
        tokio::select! {
            // An answer due on the tick the delay ends wins: no duplicate.
            biased;
            result = &mut first => return ended(result),
            _ = tokio::time::sleep(delay) => {}
        }
        let index = self.hedge_target(link, hedger.to);
        // In range: `hedge_target` names a link of the chain, which holds
        // `link`.
        let target = &self.chain[index];
        let hedge_request = retargeted(request, link, target);
        let hedge_admission = match self
            .admit_duplicate(hedger, target, &hedge_request, &mut first, deadline)
            .await
        {
            Ok(admission) => admission,
            Err(Some(result)) => return ended(result),
            Err(None) => return ended(first.await),
        };
        if let Some(o) = &self.observer {
            o.hedge_sent(&target.id);
        }
        let hedge_span = attempt_span(&target.id, attempt);
        hedge_span.record("hedge", true);
        let hedge_started = Instant::now();
        // Admitted without waiting.
        let mut second = Box::pin(self.send(
            target,
            &hedge_request,
            hedge_admission,
            Duration::ZERO,
            &hedge_span,
        ));
        tokio::select! {
            biased;
            result = &mut first => match result {
                Ok(reply) => {
                    hedger.record(&link.id, clock.elapsed());
                    drop(second);
                    self.cancelled(target, &reply, hedge_started, &hedge_span);
                    Raced::First(Ok(reply))
                }
                // The first failed: the duplicate in flight may still answer.
                Err(error) => {
                    let second = second.await;
                    self.report_hedge(target, &second, hedge_started, &hedge_span);
                    match second {
                        Ok(reply) => self.hedge_won(target, index, reply, Some(error)),
                        Err(_) => Raced::First(Err(error)),
                    }
                }
            },
            result = &mut second => {
                self.report_hedge(target, &result, hedge_started, &hedge_span);
                match result {
                    Ok(reply) => {
                        // The first took at least this long.
                        hedger.record(&link.id, clock.elapsed());
                        drop(first);
                        self.cancelled(link, &reply, started, span);
                        self.hedge_won(target, index, reply, None)
                    }
                    Err(_) => ended(first.await),
                }
            }
        }
    }

    /// A token and an admission for a duplicate to `target`, without
    /// waiting for the limits. `Err(Some)`: the first attempt answered
    /// meanwhile (no duplicate is sent: its reservation is freed, its token
    /// returned); `Err(None)`: no token or no admission at once (skipped and
    /// counted).
    async fn admit_duplicate<'s, F>(
        &'s self,
        hedger: &Hedger,
        target: &Link,
        hedge_request: &Completion<'_>,
        first: &mut F,
        deadline: Instant,
    ) -> Result<Admission<'s>, Option<Result<Reply, LlmError>>>
    where
        F: Future<Output = Result<Reply, LlmError>> + Unpin,
    {
        if let Err(result) = hedger.token_or(first).await {
            self.hedge_skipped(target, "share");
            return Err(Some(result));
        }
        let price = price_of(&self.config, target);
        let Some(Ok(admission)) = self
            .limits
            .admit(hedge_request, price.as_ref(), deadline)
            .now_or_never()
        else {
            hedger.refund();
            self.hedge_skipped(target, "limits");
            return Err(None);
        };
        if let Some(result) = first.now_or_never() {
            if let Some(reservation) = admission.reservation {
                reservation.release();
            }
            hedger.refund();
            return Err(Some(result));
        }
        Ok(admission)
    }

    /// The chain index of the model a duplicate of `link`'s goes to: its
    /// own, or with `next` the one after it (its own when it is last).
    fn hedge_target(&self, link: &Link, to: HedgeTo) -> usize {
        let at = self
            .chain
            .iter()
            .position(|l| std::ptr::eq(l, link))
            .unwrap_or_default();
        match to {
            HedgeTo::Next if at + 1 < self.chain.len() => at + 1,
            _ => at,
        }
    }

    /// A duplicate was due but not sent, for `reason`.
    fn hedge_skipped(&self, target: &Link, reason: &str) {
        if let Some(o) = &self.observer {
            o.hedge_skipped(&target.id, reason);
        }
    }

    fn hedge_won(&self, target: &Link, index: usize, reply: Reply, first: Option<LlmError>) -> Raced {
        if let Some(o) = &self.observer {
            o.hedge_won(&target.id);
        }
        Raced::Hedge { reply, index, first }
    }

    /// The duplicate's attempt ended: on its span and to the observer.
    fn report_hedge(&self, target: &Link, result: &Result<Reply, LlmError>, started: Instant, span: &Span) {
        self.report_attempt(target, result, started, span, None);
        self.observe_in_flight();
    }

    /// `link`'s attempt was dropped for the other's `answer`: reported as
    /// `cancelled`, its spend estimated at the answer's usage.
    fn cancelled(&self, link: &Link, answer: &Reply, started: Instant, span: &Span) {
        span.record("status", "cancelled");
        self.observe_in_flight();
        if let Some(o) = &self.observer {
            o.attempt(&link.id, "cancelled", started.elapsed());
            o.hedge_extra_usd(
                &link.id,
                cost_usd(price_of(&self.config, link).as_ref(), &answer.usage),
            );
        }
    }
}

/// `request` to `target`'s model: cache marks are per provider, so they
/// go only to a target of `link`'s.
fn retargeted<'a>(request: &Completion<'a>, link: &Link, target: &'a Link) -> Completion<'a> {
    Completion {
        model: &target.api_model,
        cache: if target.client.provider() == link.client.provider() {
            request.cache.clone()
        } else {
            CacheMarks::default()
        },
        ..request.clone()
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
