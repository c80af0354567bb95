//! The per-minute rate limits of `llm.requests_per_minute` and
//! `llm.tokens_per_minute`. An attempt waits for a request and for its
//! estimated tokens before it is sent; a reply that used more than the
//! estimate leaves the excess as a debt the next attempts wait for.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// The request and token limiters; `None` where the limit is unset (0).
pub(super) struct RateLimits {
    requests: Option<DefaultDirectRateLimiter>,
    /// Shared with the tasks that pay a reply's token debt.
    tokens: Option<Arc<DefaultDirectRateLimiter>>,
    tokens_per_minute: u32,
}

impl RateLimits {
    pub(super) fn new(requests_per_minute: u32, tokens_per_minute: u32) -> Self {
        let per_minute = |n: u32| NonZeroU32::new(n).map(|n| RateLimiter::direct(Quota::per_minute(n)));
        RateLimits {
            requests: per_minute(requests_per_minute),
            tokens: per_minute(tokens_per_minute).map(Arc::new),
            tokens_per_minute,
        }
    }

    /// Waits for the request limit, and for the token limit with the
    /// attempt's `estimate` of tokens.
    pub(super) async fn wait(&self, estimate: u64) {
        if let Some(limiter) = &self.requests {
            limiter.until_ready().await;
        }
        if let Some(limiter) = &self.tokens {
            let estimate = estimate.min(u64::from(u32::MAX)) as u32;
            take_tokens(limiter, self.tokens_per_minute, estimate).await;
        }
    }

    /// After a reply, charges what its `real` tokens exceeded the attempt's
    /// `estimate` by, as a debt later requests wait for: the reply that ran
    /// over is not held back (its hint has a deadline), the next calls are.
    pub(super) fn charge_overrun(&self, real: u64, estimate: u64) {
        if let Some(limiter) = &self.tokens {
            if real > estimate {
                let over = (real - estimate).min(u64::from(u32::MAX)) as u32;
                let (limiter, burst) = (limiter.clone(), self.tokens_per_minute);
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
