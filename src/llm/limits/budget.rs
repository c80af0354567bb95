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

#[derive(Debug, Default)]
struct Window {
    /// (when, dollars, tokens) of settled spend, oldest first.
    spent: VecDeque<(Instant, f64, u64)>,
    spent_usd: f64,
    spent_tokens: u64,
    reserved_usd: f64,
    reserved_tokens: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, usd, tokens)) = self.spent.front() {
            if now.duration_since(at) < BUDGET_WINDOW {
                break;
            }
            self.spent.pop_front();
            self.spent_usd -= usd;
            self.spent_tokens -= tokens;
        }
        if self.spent.is_empty() {
            // No drift from float subtraction when the window empties.
            self.spent_usd = 0.0;
        }
    }
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
        let over_usd = self
            .usd
            .is_some_and(|budget| w.spent_usd + w.reserved_usd + usd > budget);
        let over_tokens = self
            .tokens
            .is_some_and(|budget| w.spent_tokens + w.reserved_tokens + tokens > budget);
        if over_usd || over_tokens {
            return Err(Exhausted);
        }
        w.reserved_usd += usd;
        w.reserved_tokens += tokens;
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
        Remaining {
            usd: self.usd.map(|b| (b - w.spent_usd - w.reserved_usd).max(0.0)),
            tokens: self
                .tokens
                .map(|b| b.saturating_sub(w.spent_tokens + w.reserved_tokens)),
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
            w.spent.push_back((Instant::now(), usd, tokens));
            w.spent_usd += usd;
            w.spent_tokens += tokens;
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
