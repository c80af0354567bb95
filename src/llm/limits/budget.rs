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
//! Besides the rolling hour, the ledger's reads set this worker's
//! allowance (`allowance`): its share of what remained at the last read,
//! or, while the ledger cannot be read, its share of the budget.
//!
//! The window holds spend in one-second buckets (a ring over the hour, for
//! this worker's spend and for its peers'): memory is bounded whatever the
//! number of calls or records, and spend leaves the window up to a second
//! after it is an hour old, never before.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::allowance::{self, Allowance, Own};

/// The rolling window the budgets are per.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(3600);

/// What is left in the window, for each budget that is set.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Remaining {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
}

/// How finely the rolling window places spend: one bucket a second. Spend
/// leaves the window with its bucket's latest spend, up to this much late
/// (never early).
const BUCKET: Duration = Duration::from_secs(1);

/// Buckets in the ring: every second of the window, and one more (a bucket
/// whose latest spend is under a window old can start just over one).
const BUCKETS: usize = (BUDGET_WINDOW.as_secs() / BUCKET.as_secs()) as usize + 2;

/// One second's spend.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which second since the window's base it holds.
    index: i64,
    /// When its latest spend was: it leaves the window a window after.
    /// `None`: empty.
    latest: Option<Instant>,
    usd: f64,
    tokens: u64,
}

/// Spend over the rolling window, in a ring of one-second buckets (bounded
/// memory, O(1) adds in any order), and its sums.
#[derive(Debug)]
struct Rolling {
    /// The instant second 0 starts at.
    base: Instant,
    /// Allocated at the first spend.
    ring: Vec<Bucket>,
    /// No bucket of an earlier second holds spend.
    oldest: i64,
    /// Buckets holding spend.
    live: usize,
    usd: f64,
    tokens: u64,
}

impl Rolling {
    fn new(base: Instant) -> Self {
        Rolling {
            base,
            ring: Vec::new(),
            oldest: 0,
            live: 0,
            usd: 0.0,
            tokens: 0,
        }
    }

    /// The second `at` falls in, counted from `base` (negative before it).
    fn second(&self, at: Instant) -> i64 {
        if at >= self.base {
            i64::try_from((at - self.base).as_secs()).unwrap_or(i64::MAX)
        } else {
            let before = self.base - at;
            -i64::try_from(before.as_secs() + u64::from(before.subsec_nanos() > 0)).unwrap_or(i64::MAX)
        }
    }

    fn slot(index: i64) -> usize {
        // `rem_euclid` of a positive modulus is in 0..BUCKETS.
        index.rem_euclid(BUCKETS as i64) as usize
    }

    /// Adds spend at `at` (peers' records arrive from several partitions,
    /// not quite in order). Spend of a second a ring older than the newest
    /// (over the window: already expired) goes into that bucket's slot as
    /// the newer second's, which keeps it longer, never shorter.
    fn add(&mut self, at: Instant, usd: f64, tokens: u64) {
        if self.ring.is_empty() {
            self.ring = vec![Bucket::default(); BUCKETS];
        }
        let index = self.second(at);
        let slot = Self::slot(index);
        let bucket = &mut self.ring[slot];
        if bucket.latest.is_some() && bucket.index < index {
            // A second a ring ago: long out of the window.
            self.usd -= bucket.usd;
            self.tokens = self.tokens.saturating_sub(bucket.tokens);
            *bucket = Bucket::default();
            self.live -= 1;
        }
        if bucket.latest.is_none() {
            self.live += 1;
        }
        let index = if bucket.latest.is_some() {
            bucket.index.max(index)
        } else {
            index
        };
        bucket.index = index;
        bucket.latest = Some(bucket.latest.map_or(at, |l| l.max(at)));
        bucket.usd += usd;
        bucket.tokens = bucket.tokens.saturating_add(tokens);
        self.usd += usd;
        self.tokens = self.tokens.saturating_add(tokens);
        if index < self.oldest {
            self.oldest = index;
        }
    }

    /// Drops the buckets whose latest spend is a window old.
    fn expire(&mut self, now: Instant) {
        if self.ring.is_empty() {
            return;
        }
        let newest = self.second(now);
        // Every bucket is older than a ring: all expire.
        if newest.saturating_sub(self.oldest) > BUCKETS as i64 {
            self.oldest = newest.saturating_sub(BUCKETS as i64);
            for bucket in &mut self.ring {
                if bucket
                    .latest
                    .is_some_and(|l| now.saturating_duration_since(l) >= BUDGET_WINDOW)
                {
                    *bucket = Bucket::default();
                }
            }
            self.resum();
            return;
        }
        while self.oldest <= newest {
            let bucket = &mut self.ring[Self::slot(self.oldest)];
            match bucket.latest {
                Some(latest) if bucket.index == self.oldest => {
                    if now.saturating_duration_since(latest) < BUDGET_WINDOW {
                        break;
                    }
                    self.usd -= bucket.usd;
                    self.tokens = self.tokens.saturating_sub(bucket.tokens);
                    *bucket = Bucket::default();
                    self.live -= 1;
                }
                // Empty, or another second's (newer: kept).
                _ => {}
            }
            self.oldest += 1;
        }
        if self.live == 0 {
            // No drift from float subtraction when the window empties.
            self.usd = 0.0;
            self.tokens = 0;
        }
    }

    /// Counts and sums the buckets again.
    fn resum(&mut self) {
        self.live = self.ring.iter().filter(|b| b.latest.is_some()).count();
        self.usd = self.ring.iter().map(|b| b.usd).sum();
        self.tokens = self.ring.iter().fold(0, |sum, b| sum.saturating_add(b.tokens));
    }
}

#[derive(Debug)]
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
    /// This worker's share of the group's budget (its input partitions
    /// over all; 1 alone).
    share: f64,
    /// What bounds this worker's spend besides the rolling hour (set by
    /// the spend ledger's reads).
    allowance: Allowance,
}

impl Window {
    fn new(now: Instant) -> Self {
        Window {
            spent: Rolling::new(now),
            peers: Rolling::new(now),
            reserved_usd: 0.0,
            reserved_tokens: 0,
            settled_usd: 0.0,
            settled_tokens: 0,
            share: 1.0,
            allowance: Allowance::Whole,
        }
    }

    /// This worker's settled totals and rolling hour, reservations in
    /// flight included.
    fn own(&self) -> Own {
        Own {
            total: (
                self.settled_usd + self.reserved_usd,
                self.settled_tokens.saturating_add(self.reserved_tokens),
            ),
            hour: (
                self.spent.usd + self.reserved_usd,
                self.spent.tokens.saturating_add(self.reserved_tokens),
            ),
        }
    }

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
            window: Mutex::new(Window::new(Instant::now())),
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
        let allowed = allowance::fits(&w.allowance, w.share, self.limits(), w.own(), (usd, tokens));
        if over_usd || over_tokens || !allowed {
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

    /// Sets this worker's share of the group's budget (see
    /// [`allowance::share_fraction`]), in force at once.
    pub fn set_share(&self, share: f64) {
        self.window().share = share.clamp(0.0, 1.0);
    }

    /// This worker's share of the group's budget.
    pub fn share(&self) -> f64 {
        self.window().share
    }

    /// The spend ledger was just read (the peers' spend is in the window):
    /// until the next read, this worker takes its share of what remains.
    pub fn ledger_read(&self) {
        let mut w = self.window();
        w.expire(Instant::now());
        let own = w.own().total;
        w.allowance = allowance::since_read(self.limits(), w.used(), own);
    }

    /// The spend ledger cannot be read: this worker takes its share of the
    /// budget over its own rolling hour until the next read.
    pub fn ledger_unreadable(&self) {
        self.window().allowance = Allowance::Share;
    }

    /// Whether this worker is held to its share of the budget because the
    /// ledger cannot be read.
    pub fn in_share_mode(&self) -> bool {
        self.window().allowance == Allowance::Share
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

    #[tokio::test(start_paused = true)]
    async fn spend_leaves_the_window_with_its_second_never_early_and_memory_stays_bounded() {
        let budget = SpendBudget::new(1000.0, 0).unwrap();
        // A second's spend, at 0.2 s and 0.9 s of it: both leave when the
        // later one is a window old.
        tokio::time::advance(Duration::from_millis(200)).await;
        budget.reserve(1.0, 0).unwrap().settle(1.0, 10);
        tokio::time::advance(Duration::from_millis(700)).await;
        budget.reserve(1.0, 0).unwrap().settle(2.0, 20);
        tokio::time::advance(BUDGET_WINDOW - Duration::from_millis(1)).await;
        assert!((budget.group_spend().usd - 3.0).abs() < 1e-12);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(budget.group_spend().usd, 0.0);
        // Peers' records in any order, many a second, over hours: the ring
        // holds a bucket a second.
        for i in 0..20_000u64 {
            let age = Duration::from_millis((i * 7919) % 3_500_000);
            budget.observe_peer(age, 0.001, 1);
            if i % 100 == 0 {
                tokio::time::advance(Duration::from_secs(1)).await;
            }
        }
        {
            let w = budget.window();
            assert_eq!(w.peers.ring.len(), BUCKETS);
            let live: f64 = w.peers.ring.iter().map(|b| b.usd).sum();
            assert!((w.peers.usd - live).abs() < 1e-9, "{} vs {live}", w.peers.usd);
            let buckets = w.peers.ring.iter().filter(|b| b.latest.is_some()).count();
            assert_eq!(w.peers.live, buckets);
        }
        // Two hours on, nothing is left.
        tokio::time::advance(2 * BUDGET_WINDOW).await;
        let group = budget.group_spend();
        assert_eq!((group.usd, group.tokens), (0.0, 0));
    }

    #[test]
    fn between_ledger_reads_a_worker_reserves_only_its_share_of_what_remains() {
        let budget = SpendBudget::new(0.50, 0).unwrap();
        budget.set_share(1.0 / 3.0);
        budget.observe_peer(Duration::from_secs(1), 0.20, 0);
        let in_flight = budget.reserve(0.01, 0).unwrap();
        budget.ledger_read();
        // A third of 0.50 - 0.21: 0.0967; the call in flight at the read
        // was counted in the group's use, not in the allowance.
        for _ in 0..9 {
            budget.reserve(0.01, 0).unwrap().settle(0.01, 0);
        }
        assert!(budget.reserve(0.01, 0).is_err(), "0.09 + 0.01 > 0.0967");
        in_flight.settle(0.002, 0);
        assert!(budget.reserve(0.005, 0).is_ok(), "within the allowance");
        // The next read: a third of what remains now.
        budget.ledger_read();
        assert!(budget.reserve(0.01, 0).is_ok());
        assert!(!budget.in_share_mode());
    }

    #[test]
    fn while_the_ledger_cannot_be_read_a_worker_spends_its_share_of_the_budget() {
        let budget = SpendBudget::new(1.0, 0).unwrap();
        budget.set_share(0.25);
        budget.ledger_unreadable();
        assert!(budget.in_share_mode());
        budget.reserve(0.2, 0).unwrap().settle(0.2, 0);
        assert!(budget.reserve(0.06, 0).is_err(), "0.2 + 0.06 > 0.25");
        assert!(budget.reserve(0.05, 0).is_ok());
        // Read again: its share of what remains (0.75 - 0.05 in flight...).
        budget.ledger_read();
        assert!(!budget.in_share_mode());
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
