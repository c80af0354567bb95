//! The spend ledger fails closed: every `llm.ledger_interval_ms` a worker
//! publishes its totals and passes the ledger's read barrier (a round).
//! A passed round sets its allowance until the next: its share of what the
//! group left of the budget. When no round passed for longer than
//! `llm.ledger_stale_secs` (the spend topic's leader stopped, the topic
//! unreachable, this worker's records not acknowledged, so that the
//! others cannot see its spend), or the start-up read failed, the worker
//! enters share mode: its own rolling hour within its share of the budget
//! (the input partitions it holds over all, as the rate limits split). It
//! says so once (a WARN on entering, an INFO on leaving) and shows
//! `hintstream_hints_llm_ledger_share_mode` (1 while in it).

use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

use crate::llm::limits::GroupLimits;

/// Whether the ledger was read lately, and the share mode that follows.
pub struct Freshness {
    topic: String,
    stale_after: Duration,
    limits: GroupLimits,
    gauge: Gauge,
    /// When the last round passed.
    last_passed: Instant,
    sharing: bool,
}

impl Freshness {
    /// After the start-up read of `topic`: passed (`Ok`), or failed with
    /// its reason, when the worker starts in share mode.
    pub fn at_start(
        topic: &str,
        stale_after: Duration,
        limits: GroupLimits,
        gauge: Gauge,
        start_up: Result<(), String>,
    ) -> Self {
        let mut fresh = Freshness {
            topic: topic.to_string(),
            stale_after,
            limits,
            gauge,
            last_passed: Instant::now(),
            sharing: false,
        };
        match start_up {
            Ok(()) => fresh.limits.ledger_read(),
            Err(why) => fresh.enter(&why, Duration::ZERO),
        }
        fresh
    }

    /// A round passed: the record acknowledged (or none due) and the
    /// ledger read up to its end.
    pub fn passed(&mut self) {
        self.last_passed = Instant::now();
        self.limits.ledger_read();
        if std::mem::replace(&mut self.sharing, false) {
            self.gauge.set(0);
            tracing::info!(
                topic = %self.topic,
                "the spend ledger is read again: this worker takes its share of what the group left of the budget"
            );
        }
    }

    /// A round failed (`why`): past the bound, share mode.
    pub fn failed(&mut self, why: &str) {
        let since = self.last_passed.elapsed();
        if !self.sharing && since > self.stale_after {
            self.enter(why, since);
        }
    }

    fn enter(&mut self, why: &str, since: Duration) {
        self.sharing = true;
        self.limits.ledger_unreadable();
        self.gauge.set(1);
        let share = self.limits.budget_share().unwrap_or(1.0);
        tracing::warn!(
            topic = %self.topic, error = why, unread_for = ?since, share,
            "the spend ledger cannot be read: this worker spends only its share of the budget (the input \
             partitions it holds) until it can; check the spend topic's brokers"
        );
    }
}
