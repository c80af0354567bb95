//! The per-minute rate limits of `llm.requests_per_minute` and
//! `llm.tokens_per_minute`. An attempt waits for a request and for its
//! estimated tokens before it is sent; a reply that used more than the
//! estimate leaves the excess as a debt the next attempts wait for.
//!
//! The limits are the consumer group's (a provider's limit is per API key,
//! not per worker): each worker takes the share of the input topic's
//! partitions it is assigned ([`share_of`]), re-split on every rebalance
//! ([`RateLimits::set_share`]). A worker alone holds every partition and
//! the whole rate. A new share starts its limiters afresh (a full minute's
//! burst), so a rebalance can let one extra minute's worth through.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

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
    /// (assigned, total) they were made for.
    share: (usize, usize),
    requests: Option<Arc<DefaultDirectRateLimiter>>,
    /// Shared with the tasks that pay a reply's token debt.
    tokens: Option<Arc<DefaultDirectRateLimiter>>,
    tokens_per_minute: u32,
}

impl Limiters {
    fn new(requests_per_minute: u32, tokens_per_minute: u32, share: (usize, usize)) -> Self {
        let per_minute =
            |n: u32| NonZeroU32::new(n).map(|n| Arc::new(RateLimiter::direct(Quota::per_minute(n))));
        let tokens_per_minute = share_of(tokens_per_minute, share.0, share.1);
        Limiters {
            share,
            requests: per_minute(share_of(requests_per_minute, share.0, share.1)),
            tokens: per_minute(tokens_per_minute),
            tokens_per_minute,
        }
    }
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
            current: Mutex::new(Limiters::new(requests_per_minute, tokens_per_minute, (1, 1))),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Limiters> {
        // Replaced whole under the lock: never half-changed.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the share of `assigned` of `total` input partitions (after a
    /// rebalance); the same share keeps its limiters.
    pub(super) fn set_share(&self, assigned: usize, total: usize) {
        let mut current = self.current();
        if current.share != (assigned, total) {
            *current = Limiters::new(
                self.requests_per_minute,
                self.tokens_per_minute,
                (assigned, total),
            );
        }
    }

    /// This worker's (requests, tokens) per minute now; 0 = unlimited.
    pub(super) fn per_minute(&self) -> (u32, u32) {
        let current = self.current();
        (
            share_of(self.requests_per_minute, current.share.0, current.share.1),
            current.tokens_per_minute,
        )
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
async fn take_tokens(limiter: &DefaultDirectRateLimiter, burst: u32, n: u32) {
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
}
