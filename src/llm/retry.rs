//! One model, attempt after attempt, until it answers, fails for good, runs
//! out of retries (`llm.max_retries`) or the deadline nears: exponential
//! backoff with jitter (250 ms to 8 s), never shorter than the server's
//! `retry-after`, and no wait that would end past the deadline. Each HTTP
//! attempt is an `llm_attempt` span (model, attempt, status, retry wait).

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tracing::Span;

use super::attempt::{attempt_span, report_attempt};
use super::cassette::Attempt;
use super::client::{Completion, LlmError};
use super::hedge::{send_hedged, Raced};
use super::limits::Admission;
use super::link::{Link, Turn};
use super::pricing::price_of;
use super::shared::Shared;
use super::tally::Tally;

/// The wait before retrying after `error`, or `None` when it is not
/// retried: a failure for good, no retries left, or a wait and another
/// attempt as long as the last (`attempt_took`) that would not end before
/// `deadline` (that attempt would end as `timeout`, hiding the failure's own
/// reason).
fn retry_delay(
    error: &LlmError,
    backoff: &mut impl Iterator<Item = Duration>,
    deadline: Instant,
    attempt_took: Duration,
) -> Option<Duration> {
    if !error.retryable() {
        return None;
    }
    let delay = backoff.next()?;
    // Never retry sooner than the server asked. (Compared with what is
    // left, not added to now: a server's wait may be huge.)
    let delay = error.retry_after().map_or(delay, |after| after.max(delay));
    (delay + attempt_took < deadline.saturating_duration_since(Instant::now())).then_some(delay)
}

/// Calls `turn`'s model until it answers, fails for good, runs out of
/// retries or the deadline nears; the reply's tokens are added to `tally`,
/// and the model whose duplicate answered (hedging) noted there. When
/// recording, every attempt is pushed onto `attempts` (and none is hedged).
pub(super) async fn call_with_retries<'a>(
    shared: &Shared,
    turn: Turn<'a>,
    request: &Completion<'_>,
    deadline: Instant,
    tally: &mut Tally<'a>,
    mut attempts: Option<&mut Vec<Attempt>>,
) -> Result<String, LlmError> {
    let link = turn.link;
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(8))
        .with_jitter()
        .with_max_times(shared.config.max_retries as usize)
        .build();
    let mut attempt = 0u32;
    loop {
        let asked = Instant::now();
        let admission = admit(shared, link, request, deadline).await?;
        let waited = asked.elapsed();
        if let Some(o) = &shared.observer {
            o.queued(&link.id, waited);
        }
        let started = Instant::now();
        attempt += 1;
        let span = attempt_span(&link.id, attempt);
        let hedge = attempts.is_none();
        let raced = send_hedged(
            shared,
            turn,
            request,
            admission,
            &span,
            deadline,
            (attempt, hedge, waited),
        )
        .await;
        let result = match raced {
            Raced::First(result) => {
                report_attempt(shared, link, &result, started, &span, attempts.as_deref_mut());
                result
            }
            Raced::Hedge { reply, by, first } => {
                // A cancelled first attempt was reported as such.
                if let Some(error) = first {
                    report_attempt(shared, link, &Err(error), started, &span, None);
                }
                tally.hedged_by = Some(by);
                Ok(reply)
            }
        };
        let error = match result {
            Ok(reply) => {
                tally.usage.add(&reply.usage);
                shared.limits.charge_overrun(&reply.usage, request);
                return Ok(reply.text);
            }
            Err(e) => e,
        };
        let Some(delay) = retry_delay(&error, &mut backoff, deadline, started.elapsed()) else {
            return Err(error);
        };
        report_retry(shared, link, &error, delay, &span, attempts.as_deref_mut());
        // The attempt ends here; the wait is not part of it.
        drop(span);
        tokio::time::sleep(delay).await;
    }
}

/// Waits for the limits; a spent budget is reported to the observer.
async fn admit<'s>(
    shared: &'s Shared,
    link: &Link,
    request: &Completion<'_>,
    deadline: Instant,
) -> Result<Admission<'s>, LlmError> {
    let price = price_of(&shared.config, link);
    let admitted = shared.limits.admit(request, price.as_ref(), deadline).await;
    if let Err(LlmError::BudgetExhausted) = admitted {
        shared.observe_budget();
    }
    admitted
}

/// Records a retry after `error`, `delay` from now: to the observer, on
/// the attempt's span, and on the recorded attempt.
fn report_retry(
    shared: &Shared,
    link: &Link,
    error: &LlmError,
    delay: Duration,
    span: &Span,
    attempts: Option<&mut Vec<Attempt>>,
) {
    let model = link.id.as_str();
    if let Some(o) = &shared.observer {
        o.retry(model, &error.failure_reason());
    }
    if let Some(last) = attempts.and_then(|a| a.last_mut()) {
        last.retry_in_ms = Some(delay.as_millis() as u64);
    }
    span.record("retry_wait_ms", delay.as_millis() as i64);
    tracing::debug!(parent: span, model, reason = %error.failure_reason(), delay_ms = delay.as_millis() as u64, "retrying LLM call");
}
