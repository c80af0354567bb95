//! What bounds an attempt before it is sent, and what it spent after: the
//! request and token rate limits, a slot among `llm.concurrency` calls in
//! flight, and the hourly spend budget. Waiting for any of them counts
//! against the hint's time budget. (Hedged requests, when they come, are
//! bounded here too.)
//!
//! The budget reserves each attempt's worst case ([`worst_case`], priced by
//! `pricing::worst_case_cost_usd`) and settles it to the real usage, so
//! concurrent attempts cannot spend more than the budget together while
//! each reply's usage stays within its reservation (tested: 200 concurrent
//! calls billed at that worst case stay within the budget plus one call).
//! A reply that reports more (framing beyond [`FRAMING_TOKENS`]) is
//! recorded as it is: the budget is then overshot by that excess alone.
//!
//! Every limit is the consumer group's ([`GroupLimits`], which stage 1
//! feeds): the budget counts the other workers' spend from the spend
//! ledger, the rates are split by the share of partitions each worker holds.

pub mod allowance;
pub mod budget;
mod rate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};

use self::budget::{GroupSpend, Remaining, Reservation, SpendBudget};
pub use self::rate::share_of;
use self::rate::RateLimits;
use super::client::{Completion, LlmError, Reply};
use super::pricing::{cost_usd, worst_case_cost_usd};
use crate::config::{LlmConfig, ModelPrice};
use crate::messages::Usage;

/// The limits one synthesizer's calls share.
pub(super) struct CallLimits {
    /// `llm.concurrency`: the slots of `calls`.
    concurrency: usize,
    /// One permit per HTTP attempt in flight.
    calls: Semaphore,
    rate: RateLimits,
    /// `None` when no budget is set.
    budget: Option<SpendBudget>,
}

/// An attempt let through: its call slot (free it when the reply is in),
/// its share of the budget, and the time left for it.
pub(super) struct Admission<'a> {
    pub(super) slot: SemaphorePermit<'a>,
    pub(super) reservation: Option<Reservation<'a>>,
    pub(super) remaining: Duration,
}

/// Input tokens a request may be billed beyond one per byte of its prompt
/// text: the API's framing of the system prompt and the user message.
pub const FRAMING_TOKENS: u64 = 64;

/// An attempt's typical tokens, for the token rate limit: the prompt at 3
/// bytes a token (English prose is nearer 4; code, JSON and non-Latin text
/// can be far denser), and the whole output allowance. A reply that used
/// more leaves the excess as a debt (`charge_overrun`).
pub(super) fn estimate(request: &Completion<'_>) -> Usage {
    Usage::new(
        ((request.user.len() + request.system.len()) / 3) as u64,
        u64::from(request.max_tokens),
    )
}

/// An attempt's worst-case tokens, for the spend budget: one input token
/// per byte of the prompt text (no tokenizer makes more tokens than the
/// bytes it reads) plus [`FRAMING_TOKENS`], and the whole output allowance
/// (`max_tokens`, which the API never exceeds).
pub fn worst_case(system: &str, user: &str, max_tokens: u32) -> Usage {
    Usage::new(
        (system.len() + user.len()) as u64 + FRAMING_TOKENS,
        u64::from(max_tokens),
    )
}

/// Every token of `usage`, the cached input included.
fn total(usage: &Usage) -> u64 {
    usage.total_tokens()
}

impl CallLimits {
    pub(super) fn new(config: &LlmConfig) -> Self {
        CallLimits {
            concurrency: config.concurrency,
            calls: Semaphore::new(config.concurrency),
            rate: RateLimits::new(config.requests_per_minute, config.tokens_per_minute),
            budget: SpendBudget::new(config.budget_usd_per_hour, config.budget_tokens_per_hour),
        }
    }

    /// Waits for the rate limits and a call slot, then reserves the
    /// attempt's worst-case cost at `price`. `Timeout` when `deadline`
    /// passes first; `BudgetExhausted` when the reservation does not fit.
    pub(super) async fn admit(
        &self,
        request: &Completion<'_>,
        price: Option<&ModelPrice>,
        deadline: Instant,
    ) -> Result<Admission<'_>, LlmError> {
        let estimate = estimate(request);
        if tokio::time::timeout_at(deadline.into(), self.rate.wait(total(&estimate)))
            .await
            .is_err()
        {
            return Err(LlmError::Timeout);
        }
        let slot = match tokio::time::timeout_at(deadline.into(), self.calls.acquire()).await {
            Ok(Ok(slot)) => slot,
            // The semaphore is never closed.
            Ok(Err(_)) => return Err(LlmError::Connect("shutting down".into())),
            Err(_) => return Err(LlmError::Timeout),
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(LlmError::Timeout);
        }
        let reservation = match &self.budget {
            None => None,
            Some(budget) => {
                let worst = worst_case(request.system, request.user, request.max_tokens);
                Some(
                    budget
                        .reserve(
                            worst_case_cost_usd(price, &worst, request.cache.writes_cache()),
                            total(&worst),
                        )
                        .map_err(|_| LlmError::BudgetExhausted)?,
                )
            }
        };
        Ok(Admission {
            slot,
            reservation,
            remaining,
        })
    }

    /// Charges a reply's tokens beyond the attempt's estimate to the token
    /// rate limit.
    pub(super) fn charge_overrun(&self, real: &Usage, request: &Completion<'_>) {
        self.rate.charge_overrun(total(real), total(&estimate(request)));
    }

    /// HTTP attempts in flight now.
    pub(super) fn in_flight(&self) -> usize {
        self.concurrency - self.calls.available_permits()
    }

    /// What is left of the spend budgets; `None` when none is set.
    pub(super) fn remaining(&self) -> Option<Remaining> {
        self.budget.as_ref().map(SpendBudget::remaining)
    }

    pub(super) fn has_budget(&self) -> bool {
        self.budget.is_some()
    }
}

/// What stage 1 uses to make a synthesizer's limits the group's: the
/// rebalance sets the rate share, the spend ledger brings the other
/// workers' spend in and takes this worker's out.
#[derive(Clone)]
pub struct GroupLimits {
    limits: Arc<CallLimits>,
}

impl GroupLimits {
    pub(super) fn new(limits: Arc<CallLimits>) -> Self {
        GroupLimits { limits }
    }

    /// Takes the rate share of `assigned` of the input topic's `total`
    /// partitions (see [`share_of`]); whether this worker's rates changed.
    pub fn set_rate_share(&self, assigned: usize, total: usize) -> bool {
        self.limits.rate.set_share(assigned, total)
    }

    /// This worker's (requests, tokens) per minute now; 0 = unlimited.
    pub fn rate_per_minute(&self) -> (u32, u32) {
        self.limits.rate.per_minute()
    }

    /// Whether a spend budget is set (without one there is no ledger).
    pub fn has_budget(&self) -> bool {
        self.limits.budget.is_some()
    }

    /// Takes the budget share of `held` of the input topic's `total`
    /// partitions (see [`allowance::share_fraction`]).
    pub fn set_budget_share(&self, held: usize, total: usize) {
        if let Some(budget) = &self.limits.budget {
            budget.set_share(allowance::share_fraction(held, total));
        }
    }

    /// This worker's share of the budget; `None` without a budget.
    pub fn budget_share(&self) -> Option<f64> {
        self.limits.budget.as_ref().map(SpendBudget::share)
    }

    /// The spend ledger was just read (see [`SpendBudget::ledger_read`]).
    pub fn ledger_read(&self) {
        if let Some(budget) = &self.limits.budget {
            budget.ledger_read();
        }
    }

    /// The spend ledger cannot be read (see
    /// [`SpendBudget::ledger_unreadable`]).
    pub fn ledger_unreadable(&self) {
        if let Some(budget) = &self.limits.budget {
            budget.ledger_unreadable();
        }
    }

    /// Counts another worker's spend of `age` ago.
    pub fn observe_peer_spend(&self, age: Duration, usd: f64, tokens: u64) {
        if let Some(budget) = &self.limits.budget {
            budget.observe_peer(age, usd, tokens);
        }
    }

    /// What this worker settled since it started (see
    /// [`SpendBudget::settled_totals`]); `None` without a budget.
    pub fn settled_totals(&self) -> Option<(f64, u64)> {
        self.limits.budget.as_ref().map(SpendBudget::settled_totals)
    }

    /// The budgets set, (dollars, tokens) per hour; both `None` without a
    /// budget.
    pub fn budgets(&self) -> (Option<f64>, Option<u64>) {
        self.limits
            .budget
            .as_ref()
            .map_or((None, None), SpendBudget::limits)
    }

    /// The group's settled spend in the rolling hour; `None` without a
    /// budget.
    pub fn group_spend(&self) -> Option<GroupSpend> {
        self.limits.budget.as_ref().map(SpendBudget::group_spend)
    }
}

/// Settles an attempt's reservation from how it ended: the real cost of a
/// reply, nothing for a request the API refused or never got, the
/// reservation (the worst case) otherwise.
pub(super) fn settle(
    reservation: Reservation<'_>,
    result: &Result<Reply, LlmError>,
    price: Option<&ModelPrice>,
) {
    match result {
        Ok(reply) => reservation.settle(cost_usd(price, &reply.usage), total(&reply.usage)),
        // The API refused it (an error status), or the connection failed
        // before a status came: nothing was processed.
        Err(LlmError::Status { .. } | LlmError::Connect(_)) => reservation.release(),
        // Processed, maybe billed, cost unknown: a body broken after a
        // success status (`BodyBroken`), an empty or malformed reply, a
        // timeout after sending.
        Err(_) => reservation.charge_reserved(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICE: ModelPrice = ModelPrice::new(3.0, 15.0);

    #[test]
    fn the_reservation_is_the_worst_case_of_the_prompt_and_output() {
        let worst = worst_case("sys", "\u{4e2d}\u{6587} code {}", 300);
        // 3 + 14 bytes, each a token at most, plus framing.
        assert_eq!(worst.input_tokens, 17 + FRAMING_TOKENS);
        assert_eq!(worst.output_tokens, 300);
        let usd = worst_case_cost_usd(Some(&PRICE), &worst, false);
        assert!((usd - ((17 + FRAMING_TOKENS) as f64 * 3.0 + 300.0 * 15.0) / 1e6).abs() < 1e-15);
    }

    #[test]
    fn a_body_broken_after_a_success_is_charged_its_reservation() {
        let budget = SpendBudget::new(1.0, 0).unwrap();
        let broken: Result<Reply, LlmError> = Err(LlmError::BodyBroken("reset".into()));
        settle(budget.reserve(0.25, 100).unwrap(), &broken, Some(&PRICE));
        assert_eq!(budget.remaining().usd, Some(0.75));
        // A refused connection never reached the API: nothing is charged.
        let refused: Result<Reply, LlmError> = Err(LlmError::Connect("refused".into()));
        settle(budget.reserve(0.25, 100).unwrap(), &refused, Some(&PRICE));
        assert_eq!(budget.remaining().usd, Some(0.75));
    }
}
