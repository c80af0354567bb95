//! What one worker may spend of its group's budget besides what the
//! group's rolling hour leaves: the spend ledger tells each worker the
//! others' spend only at its reads, so between two reads a worker takes
//! only its share of what remained at the last one, and while the ledger
//! cannot be read, only its share of the budget.
//!
//! - [`Allowance::Whole`]: no ledger (a synthesizer outside stage 1): the
//!   rolling hour alone bounds it.
//! - [`Allowance::SinceRead`]: the ledger was read: until the next read,
//!   this worker's reservations and settled spend since then stay within
//!   `share` × (budget − the group's spend and reservations at the read).
//!   The workers' shares sum to 1 (each holds its input partitions), so
//!   between reads the group takes at most what remained, not one
//!   remainder a worker.
//! - [`Allowance::Share`]: the ledger could not be read for longer than
//!   `llm.ledger_stale_secs` (or at start-up): this worker's own rolling
//!   hour, reservations included, stays within `share` × budget. Peers
//!   in share mode too keep the group within the budget without reading
//!   each other.
//!
//! `share` is the fraction of the input topic's partitions this worker
//! holds ([`share_fraction`]), re-set at every rebalance as the rate
//! limits' share is.

/// Dollars and tokens; a `None` budget is unset.
pub type Budgets = (Option<f64>, Option<u64>);

/// What bounds this worker's spend besides the group's rolling hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allowance {
    /// No ledger: the group's rolling hour alone.
    Whole,
    /// At most the share of `usd` and `tokens` (what the group left at
    /// the read) beyond `base_usd` and `base_tokens` (this worker's settled
    /// totals plus its reservations at the read). The share is the one in
    /// force at each reservation: a rebalance applies at once.
    SinceRead {
        usd: Option<f64>,
        tokens: Option<u64>,
        base_usd: f64,
        base_tokens: u64,
    },
    /// The ledger cannot be read: this worker's own rolling hour within
    /// its share of the budget.
    Share,
}

/// The fraction of a group's budget a worker holding `held` of the input
/// topic's `total` partitions takes: `held / total`, at most 1; 1 when
/// `total` is unknown (0).
pub fn share_fraction(held: usize, total: usize) -> f64 {
    if total == 0 {
        return 1.0;
    }
    held.min(total) as f64 / total as f64
}

/// The allowance until the next read of the ledger: the share of what the
/// group's spend and reservations, `used`, leave of `budgets`, from this
/// worker's settled totals plus reservations now, `own`.
pub fn since_read(budgets: Budgets, used: (f64, u64), own: (f64, u64)) -> Allowance {
    let (usd_budget, tokens_budget) = budgets;
    Allowance::SinceRead {
        usd: usd_budget.map(|b| (b - used.0).max(0.0)),
        tokens: tokens_budget.map(|b| b.saturating_sub(used.1)),
        base_usd: own.0,
        base_tokens: own.1,
    }
}

/// `share` of dollars and tokens (tokens rounded down).
fn part(share: f64, usd: Option<f64>, tokens: Option<u64>) -> (Option<f64>, Option<u64>) {
    (
        usd.map(|u| share * u),
        tokens.map(|t| (share * t as f64).floor() as u64),
    )
}

/// What this worker has spent and reserved, for the allowance's check.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Own {
    /// Settled since the start plus reserved now.
    pub total: (f64, u64),
    /// Settled in the rolling hour plus reserved now.
    pub hour: (f64, u64),
}

/// Whether a reservation of `cost` (dollars, tokens) fits `allowance`,
/// with this worker's share `share` of `budgets` and its spend `own`.
pub fn fits(allowance: &Allowance, share: f64, budgets: Budgets, own: Own, cost: (f64, u64)) -> bool {
    let within = |spent: (f64, u64), usd: Option<f64>, tokens: Option<u64>| {
        usd.is_none_or(|cap| spent.0 + cost.0 <= cap + 1e-12)
            && tokens.is_none_or(|cap| spent.1.saturating_add(cost.1) <= cap)
    };
    match *allowance {
        Allowance::Whole => true,
        Allowance::SinceRead {
            usd,
            tokens,
            base_usd,
            base_tokens,
        } => {
            let since = (
                (own.total.0 - base_usd).max(0.0),
                own.total.1.saturating_sub(base_tokens),
            );
            let (usd, tokens) = part(share, usd, tokens);
            within(since, usd, tokens)
        }
        Allowance::Share => {
            let (usd, tokens) = part(share, budgets.0, budgets.1);
            within(own.hour, usd, tokens)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USD: Budgets = (Some(0.50), None);

    fn own(total: f64, hour: f64) -> Own {
        Own {
            total: (total, 0),
            hour: (hour, 0),
        }
    }

    #[test]
    fn the_share_is_the_partitions_held_over_all() {
        assert_eq!(share_fraction(2, 6), 2.0 / 6.0);
        assert_eq!(share_fraction(0, 6), 0.0);
        assert_eq!(share_fraction(7, 6), 1.0);
        assert_eq!(share_fraction(0, 0), 1.0, "unknown total: the whole");
    }

    #[test]
    fn between_reads_a_worker_takes_its_share_of_what_remained() {
        // A third of the partitions; the group had used $0.20 of $0.50 at
        // the read, this worker $0.05 since its start.
        let a = since_read(USD, (0.20, 0), (0.05, 0));
        let Allowance::SinceRead { usd: Some(left), .. } = a else {
            panic!("{a:?}")
        };
        let cap = left / 3.0;
        assert!((cap - 0.10).abs() < 1e-12, "{cap}");
        // $0.09 since the read, plus $0.01: fits; plus $0.02: does not.
        let spent = own(0.05 + 0.09, 0.0);
        assert!(fits(&a, 1.0 / 3.0, USD, spent, (0.01, 0)));
        assert!(!fits(&a, 1.0 / 3.0, USD, spent, (0.02, 0)));
        // Three workers of a third each take at most what remained.
        assert!((3.0 * cap - (0.50 - 0.20)).abs() < 1e-12);
        // A rebalance to a sixth applies at once: $0.05 since the read.
        assert!(!fits(&a, 1.0 / 6.0, USD, spent, (0.0, 0)));
        assert!(fits(&a, 1.0 / 6.0, USD, own(0.05 + 0.04, 0.0), (0.01, 0)));
    }

    #[test]
    fn a_worker_alone_takes_all_that_remains() {
        let a = since_read(USD, (0.30, 0), (0.30, 0));
        assert!(fits(&a, 1.0, USD, own(0.30, 0.30), (0.20, 0)));
        assert!(!fits(&a, 1.0, USD, own(0.30, 0.30), (0.21, 0)));
    }

    #[test]
    fn a_token_budget_is_shared_the_same_way() {
        let budgets = (None, Some(1000));
        let a = since_read(budgets, (0.0, 400), (0.0, 100));
        assert_eq!(
            a,
            Allowance::SinceRead {
                usd: None,
                tokens: Some(600),
                base_usd: 0.0,
                base_tokens: 100
            }
        );
        let spent = Own {
            total: (0.0, 300),
            hour: (0.0, 300),
        };
        assert!(fits(&a, 0.5, budgets, spent, (0.0, 100)));
        assert!(!fits(&a, 0.5, budgets, spent, (0.0, 101)));
        // Used over the budget: nothing remains, nothing is taken.
        let none = since_read(budgets, (0.0, 2000), (0.0, 0));
        assert!(!fits(&none, 0.5, budgets, Own::default(), (0.0, 1)));
    }

    #[test]
    fn in_share_mode_a_worker_takes_its_share_of_the_budget_in_its_own_hour() {
        // Half the partitions: $0.25 of its own rolling hour.
        assert!(fits(&Allowance::Share, 0.5, USD, own(9.0, 0.20), (0.05, 0)));
        assert!(!fits(&Allowance::Share, 0.5, USD, own(9.0, 0.20), (0.06, 0)));
        // No partitions held: nothing.
        assert!(!fits(&Allowance::Share, 0.0, USD, Own::default(), (0.001, 0)));
        // Without a ledger: no bound here.
        assert!(fits(&Allowance::Whole, 0.0, USD, own(9.0, 9.0), (1.0, 0)));
    }
}
