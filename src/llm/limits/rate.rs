//! The per-minute rate limits of `llm.requests_per_minute` and
//! `llm.tokens_per_minute`. An attempt waits for a request and for its
//! estimated tokens before it is sent; a reply that used more than the
//! estimate leaves the excess as a debt the next attempts wait for.
//!
//! The limits are the consumer group's (a provider's limit is per API key,
//! not per worker): each worker takes the share of the input topic's
//! partitions it is assigned ([`share_of`]), re-split on every rebalance
//! ([`RateLimits::set_share`]). A worker alone holds every partition and
//! the whole rate. A new share's limiters start as used as the old ones
//! were (the same fraction of their burst), so a rebalance hands out no
//! fresh minute's burst; a rebalance that leaves the share's rates as they
//! were (a cooperative rebalance calls the hook after the revoke and after
//! the assignment) keeps the limiters. Attempts already waiting on the old
//! limiters are let through by them.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::middleware::StateInformationMiddleware;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// A per-minute limiter that can tell how much of its burst is left.
type Limiter = DefaultDirectRateLimiter<StateInformationMiddleware>;

/// This worker's part of a group's per-minute `limit` when it holds
/// `assigned` of the input topic's `total` partitions: rounded down, at
/// least 1 (a worker never gets an unlimited or zero rate; the group's sum
/// can exceed its limit by one a worker). 0 (unset) stays 0; an unknown
/// `total` (0) gives the whole limit.
pub fn share_of(limit: u32, assigned: usize, total: usize) -> u32 {
    if limit == 0 || total == 0 || assigned >= total {
        return limit;
    }
    let part = u64::from(limit) * assigned as u64 / total as u64;
    (part as u32).max(1)
}

/// The limiters of one share; `None` where the limit is unset (0).
struct Limiters {
    requests_per_minute: u32,
    requests: Option<Arc<Limiter>>,
    /// Shared with the tasks that pay a reply's token debt.
    tokens: Option<Arc<Limiter>>,
    tokens_per_minute: u32,
}

impl Limiters {
    /// Limiters of `requests_per_minute` and `tokens_per_minute` (this
    /// worker's share), each as used as the one of `previous` it replaces.
    fn new(requests_per_minute: u32, tokens_per_minute: u32, previous: Option<&Limiters>) -> Self {
        Limiters {
            requests_per_minute,
            requests: limiter(requests_per_minute, previous.and_then(|p| p.requests.as_deref())),
            tokens: limiter(tokens_per_minute, previous.and_then(|p| p.tokens.as_deref())),
            tokens_per_minute,
        }
    }
}

/// A limiter of `per_minute` (`None` when 0, unset) that starts with the
/// fraction of its burst `previous` had used (none used without one).
fn limiter(per_minute: u32, previous: Option<&Limiter>) -> Option<Arc<Limiter>> {
    let burst = NonZeroU32::new(per_minute)?;
    let fresh = RateLimiter::direct(Quota::per_minute(burst)).with_middleware::<StateInformationMiddleware>();
    let free = previous.map_or(1.0, free_fraction);
    let used = burst.get() - (f64::from(burst.get()) * free).floor() as u32;
    if let Some(used) = NonZeroU32::new(used.min(burst.get())) {
        // A fresh limiter holds its whole burst: this always fits.
        let _ = fresh.check_n(used);
    }
    Some(Arc::new(fresh))
}

/// The fraction of its burst `limiter` has free now, 0 to 1 (learned by
/// taking one cell: the limiter is being replaced).
fn free_fraction(limiter: &Limiter) -> f64 {
    match limiter.check() {
        Ok(state) => {
            let burst = state.quota().burst_size().get();
            (f64::from(state.remaining_burst_capacity()) + 1.0) / f64::from(burst)
        }
        Err(_) => 0.0,
    }
    .clamp(0.0, 1.0)
}

/// The group's limits and this worker's limiters for its share.
pub(super) struct RateLimits {
    requests_per_minute: u32,
    tokens_per_minute: u32,
    current: Mutex<Limiters>,
}

impl RateLimits {
    pub(super) fn new(requests_per_minute: u32, tokens_per_minute: u32) -> Self {
        RateLimits {
            requests_per_minute,
            tokens_per_minute,
            current: Mutex::new(Limiters::new(requests_per_minute, tokens_per_minute, None)),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Limiters> {
        // Replaced whole under the lock: never half-changed.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the share of `assigned` (at most `total`) of `total` input
    /// partitions (after a rebalance). Rates that did not change keep their
    /// limiters; new ones start as used as the old were. Whether the rates
    /// changed.
    pub(super) fn set_share(&self, assigned: usize, total: usize) -> bool {
        let assigned = if total == 0 { assigned } else { assigned.min(total) };
        let requests = share_of(self.requests_per_minute, assigned, total);
        let tokens = share_of(self.tokens_per_minute, assigned, total);
        let mut current = self.current();
        if (current.requests_per_minute, current.tokens_per_minute) == (requests, tokens) {
            return false;
        }
        let next = Limiters::new(requests, tokens, Some(&current));
        *current = next;
        true
    }

    /// This worker's (requests, tokens) per minute now; 0 = unlimited.
    pub(super) fn per_minute(&self) -> (u32, u32) {
        let current = self.current();
        (current.requests_per_minute, current.tokens_per_minute)
    }

    /// Waits for the request limit, and for the token limit with the
    /// attempt's `estimate` of tokens.
    pub(super) async fn wait(&self, estimate: u64) {
        let (requests, tokens, burst) = {
            let current = self.current();
            (
                current.requests.clone(),
                current.tokens.clone(),
                current.tokens_per_minute,
            )
        };
        if let Some(limiter) = &requests {
            limiter.until_ready().await;
        }
        if let Some(limiter) = &tokens {
            let estimate = estimate.min(u64::from(u32::MAX)) as u32;
            take_tokens(limiter, burst, estimate).await;
        }
    }

    /// After a reply, charges what its `real` tokens exceeded the attempt's
    /// `estimate` by, as a debt later requests wait for: the reply that ran
    /// over is not held back (its hint has a deadline), the next calls are.
    pub(super) fn charge_overrun(&self, real: u64, estimate: u64) {
        let (tokens, burst) = {
            let current = self.current();
            (current.tokens.clone(), current.tokens_per_minute)
        };
        if let Some(limiter) = tokens {
            if real > estimate {
                let over = (real - estimate).min(u64::from(u32::MAX)) as u32;
                tokio::spawn(async move { take_tokens(&limiter, burst, over).await });
            }
        }
    }
}

/// Waits until `n` tokens of a tokens-per-minute limiter with `burst` are
/// free and takes them (at most one minute's worth at once).
async fn take_tokens(limiter: &Limiter, burst: u32, n: u32) {
    let Some(n) = NonZeroU32::new(n.clamp(1, burst.max(1))) else {
        return;
    };
    // `n` is clamped to the quota's burst, so it always fits.
    let _ = limiter.until_n_ready(n).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_takes_its_share_of_the_partitions_of_the_group_rate() {
        // 600 a minute over 6 partitions held 2, 2, 2: 200 each.
        assert_eq!(share_of(600, 2, 6), 200);
        // Held 3, 2, 1 after a rebalance: 300, 200, 100.
        let shares: Vec<u32> = [3, 2, 1].iter().map(|&a| share_of(600, a, 6)).collect();
        assert_eq!(shares, [300, 200, 100]);
        // Rounded down: 100 over 3 workers of 1 partition each, 33 each.
        assert_eq!(share_of(100, 1, 3), 33);
        // A worker alone, or before any assignment is known: the whole rate.
        assert_eq!(share_of(600, 6, 6), 600);
        assert_eq!(share_of(600, 0, 0), 600);
        // No partition, or a tiny share: 1 a minute, never unlimited.
        assert_eq!(share_of(600, 0, 6), 1);
        assert_eq!(share_of(5, 1, 12), 1);
        // Unset stays unset.
        assert_eq!(share_of(0, 1, 6), 0);
    }

    #[test]
    fn a_rebalance_resplits_the_limiters() {
        let limits = RateLimits::new(600, 90_000);
        assert_eq!(limits.per_minute(), (600, 90_000));
        limits.set_share(2, 6);
        assert_eq!(limits.per_minute(), (200, 30_000));
        limits.set_share(6, 6);
        assert_eq!(limits.per_minute(), (600, 90_000));
        let unset = RateLimits::new(0, 0);
        unset.set_share(1, 6);
        assert_eq!(unset.per_minute(), (0, 0));
    }

    /// Takes cells of `limiter` until it refuses; how many it gave.
    fn drain(limiter: &Limiter) -> u32 {
        let mut n = 0;
        while limiter.check().is_ok() {
            n += 1;
        }
        n
    }

    fn requests(limits: &RateLimits) -> Arc<Limiter> {
        limits.current().requests.clone().unwrap()
    }

    /// Cells a limiter of `per_minute` may have refilled since `since`
    /// (the tests below run on the real clock; a loaded machine is slow).
    fn refilled(per_minute: u32, since: std::time::Instant) -> u32 {
        (since.elapsed().as_secs_f64() * f64::from(per_minute) / 60.0).ceil() as u32 + 1
    }

    #[test]
    fn a_new_share_starts_as_used_as_the_old_one_was() {
        // 60 a minute: a cell a second (30 a minute, one in two, once split).
        let started = std::time::Instant::now();
        // Unused: the new share's whole burst.
        let limits = RateLimits::new(60, 0);
        assert!(limits.set_share(1, 2));
        let burst = drain(&requests(&limits));
        assert!((30..=30 + refilled(30, started)).contains(&burst), "{burst}");
        // The burst spent: a re-split hands out nothing fresh, either way.
        let started = std::time::Instant::now();
        assert!(limits.set_share(2, 2));
        let fresh = drain(&requests(&limits));
        assert!(fresh <= refilled(60, started), "{fresh}");
        let started = std::time::Instant::now();
        assert!(limits.set_share(1, 3));
        let fresh = drain(&requests(&limits));
        assert!(fresh <= refilled(20, started), "{fresh}");
        // Half used: half the new burst.
        let started = std::time::Instant::now();
        let limits = RateLimits::new(60, 0);
        for _ in 0..30 {
            requests(&limits).check().unwrap();
        }
        limits.set_share(1, 2);
        let left = drain(&requests(&limits));
        let slack = refilled(60, started);
        assert!((15..=15 + slack).contains(&left), "{left}");
    }

    #[test]
    fn a_rebalance_that_keeps_the_rates_keeps_the_limiters() {
        let limits = RateLimits::new(600, 90_000);
        // Alone from the start: every partition is the whole rate already.
        let before = requests(&limits);
        assert!(!limits.set_share(6, 6));
        assert!(Arc::ptr_eq(&before, &requests(&limits)));
        // A cooperative rebalance's two calls with the same share: one change.
        assert!(limits.set_share(3, 6));
        let split = requests(&limits);
        assert!(!limits.set_share(3, 6));
        assert!(Arc::ptr_eq(&split, &requests(&limits)));
        // More partitions held than the count measured at start-up: the
        // whole rate, never more.
        limits.set_share(8, 6);
        assert_eq!(limits.per_minute(), (600, 90_000));
    }
}
