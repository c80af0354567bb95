//! What the synthesizer reports as its calls go: the observer that stage 1
//! turns into metrics.

use std::time::Duration;

use super::limits::budget::Remaining;

/// What happened to one attempt, for metrics.
pub trait SynthObserver: Send + Sync {
    /// One HTTP attempt ended: `status` is `ok` or a failure reason.
    fn attempt(&self, model: &str, status: &str, latency: Duration);
    fn retry(&self, model: &str, reason: &str);
    fn calls_in_flight(&self, n: usize);
    /// What is left of the spend budgets, after each change.
    fn budget(&self, _remaining: Remaining) {}
    /// A hedged request's duplicate was sent to `model`.
    fn hedge_sent(&self, _model: &str) {}
    /// A duplicate for `model` was due but not sent: `share` (the
    /// `llm.hedge_max_share` bucket was empty) or `limits` (no call slot,
    /// rate-limit permit or budget reservation at once).
    fn hedge_skipped(&self, _model: &str, _reason: &str) {}
    /// A duplicate sent to `model` answered first; its answer is the hint's.
    fn hedge_won(&self, _model: &str) {}
    /// `model`'s attempt was cancelled for the other's answer: its cost,
    /// estimated as that answer's usage at `model`'s price.
    fn hedge_extra_usd(&self, _model: &str, _usd: f64) {}
    /// A prompt for `model` was fitted to its context window, taking
    /// `chars_dropped` characters out.
    fn prompt_fitted(&self, _model: &str, _chars_dropped: usize) {}
    /// An attempt at `model` waited `wait` for a call slot
    /// (`llm.concurrency`) and the rate limits before it was sent.
    fn queued(&self, _model: &str, _wait: Duration) {}
    /// Most attempts at `model` in a window timed out while queued (said
    /// at most once every 10 minutes).
    fn saturated(&self, _model: &str) {}
}
