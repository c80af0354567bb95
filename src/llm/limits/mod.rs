//! What bounds an attempt before it is sent, and what it spent after: the
//! request and token rate limits, a slot among `llm.concurrency` calls in
//! flight, and the hourly spend budget. Waiting for any of them counts
//! against the hint's time budget. (Hedged requests, when they come, are
//! bounded here too.)

pub mod budget;
mod rate;

use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};

use self::budget::{Remaining, Reservation, SpendBudget};
use self::rate::RateLimits;
use super::client::{Completion, LlmError, Reply};
use super::pricing::cost_usd;
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

/// An attempt's estimated tokens: the prompt at 3 bytes a token, on the
/// high side for code, JSON and non-Latin text (English prose is nearer 4),
/// so that concurrent reservations do not overshoot a budget; and the whole
/// output allowance.
pub(super) fn estimate(request: &Completion<'_>) -> Usage {
    Usage {
        input_tokens: ((request.user.len() + request.system.len()) / 3) as u64,
        output_tokens: u64::from(request.max_tokens),
    }
}

fn total(usage: &Usage) -> u64 {
    usage.input_tokens + usage.output_tokens
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
    /// attempt's estimated cost at `price`. `Timeout` when `deadline`
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
            Some(budget) => Some(
                budget
                    .reserve(cost_usd(price, &estimate), total(&estimate))
                    .map_err(|_| LlmError::BudgetExhausted)?,
            ),
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

/// Settles an attempt's reservation from how it ended: the real cost of a
/// reply, nothing for a request the API refused, the estimate otherwise.
pub(super) fn settle(
    reservation: Reservation<'_>,
    result: &Result<Reply, LlmError>,
    price: Option<&ModelPrice>,
) {
    match result {
        Ok(reply) => reservation.settle(cost_usd(price, &reply.usage), total(&reply.usage)),
        // The API refused it: nothing was processed.
        Err(LlmError::Status { .. } | LlmError::Connect(_)) => reservation.release(),
        // Processed, maybe billed, cost unknown (an empty or malformed
        // reply, a timeout after sending).
        Err(_) => reservation.charge_estimate(),
    }
}
