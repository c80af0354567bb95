//! The spend guard: an hourly budget of dollars and/or tokens over a rolling
//! window. Each LLM attempt reserves its worst-case cost before it is sent
//! (so concurrent calls cannot overshoot together) and settles the real cost
//! from the reply's `usage` afterwards. An attempt whose cost is unknown (no
//! usable reply, a body broken after a success status, a timeout after
//! sending, a cancelled call) is charged its reservation; only one the API
//! provably did not process (an error status, a refused connection) is
//! released. When a reservation does not fit, the
//! attempt is not sent: the hint falls back to the static one with
//! `failure_reason = "budget_exhausted"` until older spend leaves the window.
//!
//! The budgets are the consumer group's: besides its own spend, the window
//! holds the other workers' (their records of the spend ledger, see
//! `hints::ledger`, entered with [`SpendBudget::observe_peer`]), and
//! [`SpendBudget::settled_totals`] is what this worker settled since it
//! started, which its records carry (running totals: a record sent twice or
//! lost changes nothing). A worker alone has no peers: nothing changes.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// The rolling window the budgets are per.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(3600);

/// What is left in the window, for each budget that is set.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Remaining {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
}

/// Spend over the rolling window: (when, dollars, tokens), oldest first,
/// and their sums.
#[derive(Debug, Default)]
struct Rolling {
    entries: VecDeque<(Instant, f64, u64)>,
    usd: f64,
    tokens: u64,
}

impl Rolling {
    /// Adds spend at `at`, in time order (peers' records arrive from several
    /// partitions, not quite in order).
    fn add(&mut self, at: Instant, usd: f64, tokens: u64) {
        let i = self.entries.partition_point(|&(t, _, _)| t <= at);
        self.entries.insert(i, (at, usd, tokens));
        self.usd += usd;
        self.tokens = self.tokens.saturating_add(tokens);
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, usd, tokens)) = self.entries.front() {
            if now.saturating_duration_since(at) < BUDGET_WINDOW {
                break;
            }
            self.entries.pop_front();
            self.usd -= usd;
            self.tokens = self.tokens.saturating_sub(tokens);
        }
        if self.entries.is_empty() {
            // No drift from float subtraction when the window empties.
            self.usd = 0.0;
        }
    }
}

#[derive(Debug, Default)]
struct Window {
    /// This worker's settled spend.
    spent: Rolling,
    /// The other workers' of its group, as their ledger records said.
    peers: Rolling,
    reserved_usd: f64,
    reserved_tokens: u64,
    /// Settled here since the start, for the ledger's records: only grows.
    settled_usd: f64,
    settled_tokens: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        self.spent.expire(now);
        self.peers.expire(now);
    }

    /// Settled and reserved, the group's.
    fn used(&self) -> (f64, u64) {
        (
            self.spent.usd + self.peers.usd + self.reserved_usd,
            self.spent
                .tokens
                .saturating_add(self.peers.tokens)
                .saturating_add(self.reserved_tokens),
        )
    }
}

/// The group's settled spend in the rolling window, and this worker's part.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GroupSpend {
    pub usd: f64,
    pub tokens: u64,
    pub own_usd: f64,
    pub own_tokens: u64,
}

/// The hourly budgets; `None` fields are unset.
#[derive(Debug)]
pub struct SpendBudget {
    usd: Option<f64>,
    tokens: Option<u64>,
    window: Mutex<Window>,
}

/// The budget would be exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted;

impl SpendBudget {
    /// `None` when neither budget is set (0 = unset).
    pub fn new(usd_per_hour: f64, tokens_per_hour: u64) -> Option<Self> {
        let usd = (usd_per_hour > 0.0).then_some(usd_per_hour);
        let tokens = (tokens_per_hour > 0).then_some(tokens_per_hour);
        (usd.is_some() || tokens.is_some()).then(|| SpendBudget {
            usd,
            tokens,
            window: Mutex::new(Window::default()),
        })
    }

    fn window(&self) -> MutexGuard<'_, Window> {
        // Every method leaves the window consistent before it can panic.
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves an attempt's cost (its worst case), or says the budget is
    /// spent.
    pub fn reserve(&self, usd: f64, tokens: u64) -> Result<Reservation<'_>, Exhausted> {
        let mut w = self.window();
        w.expire(Instant::now());
        let (used_usd, used_tokens) = w.used();
        let over_usd = self.usd.is_some_and(|budget| used_usd + usd > budget);
        let over_tokens = self
            .tokens
            .is_some_and(|budget| used_tokens.saturating_add(tokens) > budget);
        if over_usd || over_tokens {
            return Err(Exhausted);
        }
        w.reserved_usd += usd;
        w.reserved_tokens = w.reserved_tokens.saturating_add(tokens);
        Ok(Reservation {
            budget: self,
            usd,
            tokens,
            done: false,
        })
    }

    /// What is left now (reservations in flight count as spent).
    pub fn remaining(&self) -> Remaining {
        let mut w = self.window();
        w.expire(Instant::now());
        let (used_usd, used_tokens) = w.used();
        Remaining {
            usd: self.usd.map(|b| (b - used_usd).max(0.0)),
            tokens: self.tokens.map(|b| b.saturating_sub(used_tokens)),
        }
    }

    /// Counts another worker's spend of `age` ago (from its ledger record)
    /// in the window; spend older than the window counts for nothing.
    pub fn observe_peer(&self, age: Duration, usd: f64, tokens: u64) {
        if age >= BUDGET_WINDOW || !(usd.is_finite() && usd >= 0.0) {
            return;
        }
        let now = Instant::now();
        // A clock younger than `age` (just booted): counted as of now,
        // which keeps it in the window longer, never shorter.
        let at = now.checked_sub(age).unwrap_or(now);
        let mut w = self.window();
        w.peers.add(at, usd, tokens);
        w.expire(now);
    }

    /// What this worker settled since it started (dollars, tokens), the
    /// running totals its ledger records carry: they only grow.
    pub fn settled_totals(&self) -> (f64, u64) {
        let w = self.window();
        (w.settled_usd, w.settled_tokens)
    }

    /// The budgets set: (dollars, tokens) per hour.
    pub fn limits(&self) -> (Option<f64>, Option<u64>) {
        (self.usd, self.tokens)
    }

    /// The group's settled spend in the window now (reservations in flight
    /// not included).
    pub fn group_spend(&self) -> GroupSpend {
        let mut w = self.window();
        w.expire(Instant::now());
        GroupSpend {
            usd: w.spent.usd + w.peers.usd,
            tokens: w.spent.tokens.saturating_add(w.peers.tokens),
            own_usd: w.spent.usd,
            own_tokens: w.spent.tokens,
        }
    }
}

/// An attempt's reserved share of the budget. Settle it with the real cost,
/// or release it when nothing was spent; dropped otherwise (a cancelled
/// call), it is charged what it reserved.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a SpendBudget,
    usd: f64,
    tokens: u64,
    done: bool,
}

impl Reservation<'_> {
    /// Records the attempt's real cost in place of its estimate.
    pub fn settle(mut self, usd: f64, tokens: u64) {
        self.end(Some((usd, tokens)));
    }

    /// Charges what was reserved: the attempt may have been billed, but its
    /// cost is unknown.
    pub fn charge_reserved(mut self) {
        let reserved = (self.usd, self.tokens);
        self.end(Some(reserved));
    }

    /// Frees the reservation: the API did not process the attempt.
    pub fn release(mut self) {
        self.end(None);
    }

    fn end(&mut self, spent: Option<(f64, u64)>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut w = self.budget.window();
        w.reserved_usd = (w.reserved_usd - self.usd).max(0.0);
        w.reserved_tokens = w.reserved_tokens.saturating_sub(self.tokens);
        if let Some((usd, tokens)) = spent {
            w.spent.add(Instant::now(), usd, tokens);
            w.settled_usd += usd;
            w.settled_tokens = w.settled_tokens.saturating_add(tokens);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let reserved = (self.usd, self.tokens);
        self.end(Some(reserved));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_of_unknown_cost_is_charged_its_reservation() {
        let budget = SpendBudget::new(0.0, 1000).unwrap();
        budget.reserve(0.0, 300).unwrap().charge_reserved();
        drop(budget.reserve(0.0, 300).unwrap()); // cancelled mid-call
        assert_eq!(budget.remaining().tokens, Some(400));
    }

    #[test]
    fn no_budget_means_no_guard() {
        assert!(SpendBudget::new(0.0, 0).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_budget_and_refills_as_spend_leaves_the_window() {
        let budget = SpendBudget::new(0.05, 0).unwrap();
        for _ in 0..4 {
            budget.reserve(0.01, 100).unwrap().settle(0.012, 120);
        }
        assert!((budget.remaining().usd.unwrap() - 0.002).abs() < 1e-12);
        assert_eq!(budget.reserve(0.01, 100).unwrap_err(), Exhausted);
        assert_eq!(budget.remaining().tokens, None, "no token budget set");
        tokio::time::advance(BUDGET_WINDOW).await;
        assert_eq!(budget.remaining().usd, Some(0.05));
        assert!(budget.reserve(0.01, 100).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_group_spend_is_the_rolling_hour_of_own_and_peer_records() {
        let budget = SpendBudget::new(1.0, 0).unwrap();
        // A peer's record from 50 minutes ago, and one from just now; one
        // from over an hour ago counts for nothing.
        budget.observe_peer(Duration::from_secs(50 * 60), 0.30, 3000);
        budget.observe_peer(Duration::from_secs(2), 0.20, 2000);
        budget.observe_peer(BUDGET_WINDOW + Duration::from_secs(1), 5.0, 50_000);
        budget.reserve(0.1, 1000).unwrap().settle(0.10, 1000);
        let group = budget.group_spend();
        assert!((group.usd - 0.60).abs() < 1e-12, "{group:?}");
        assert_eq!((group.tokens, group.own_tokens), (6000, 1000));
        assert!((budget.remaining().usd.unwrap() - 0.40).abs() < 1e-12);
        // The group's spend bounds this worker: 0.6 spent + 0.5 > 1.0.
        assert!(budget.reserve(0.5, 0).is_err());
        // Ten minutes on, the 50-minute-old record leaves the hour.
        tokio::time::advance(Duration::from_secs(10 * 60)).await;
        let group = budget.group_spend();
        assert!((group.usd - 0.30).abs() < 1e-12, "{group:?}");
        assert!(budget.reserve(0.5, 0).is_ok());
    }

    #[test]
    fn own_settled_totals_only_grow_and_count_what_was_spent() {
        let budget = SpendBudget::new(1.0, 0).unwrap();
        assert_eq!(budget.settled_totals(), (0.0, 0), "nothing settled yet");
        budget.reserve(0.2, 100).unwrap().settle(0.15, 90);
        budget.reserve(0.2, 100).unwrap().release();
        assert_eq!(budget.settled_totals(), (0.15, 90));
        budget.reserve(0.2, 100).unwrap().settle(0.05, 10);
        let (usd, tokens) = budget.settled_totals();
        assert!((usd - 0.20).abs() < 1e-12 && tokens == 100);
        // Publishing is bookkeeping: the own window holds both.
        assert!((budget.group_spend().own_usd - 0.20).abs() < 1e-12);
    }

    #[test]
    fn concurrent_reservations_cannot_overshoot_together() {
        let budget = SpendBudget::new(0.0, 1000).unwrap();
        let a = budget.reserve(0.0, 600).unwrap();
        assert!(budget.reserve(0.0, 600).is_err(), "600 reserved + 600 > 1000");
        a.release();
        let b = budget.reserve(0.0, 600).unwrap();
        b.settle(0.0, 300);
        assert_eq!(budget.remaining().tokens, Some(700));
    }
}
