//! One model, attempt after attempt, until it answers, fails for good, runs
//! out of retries (`llm.max_retries`) or the deadline nears: exponential
//! backoff with jitter (250 ms to 8 s), never shorter than the server's
//! `retry-after`, and no wait that would end past the deadline. Each HTTP
//! attempt is an `llm_attempt` span (model, attempt, status, retry wait).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::cassette::{Attempt, AttemptOutcome};
use super::client::{Completion, LlmError, Reply};
use super::hedge::Raced;
use super::limits::{settle, Admission};
use super::link::Link;
use super::pricing::price_of;
use super::saturation::{Saturated, WINDOW};
use super::synth::Synthesizer;
use super::tally::Tally;

/// The span of one HTTP attempt; `status` and `retry_wait_ms` are filled
/// in as it ends, `hedge` set on a hedged request's duplicate.
pub(super) fn attempt_span(model: &str, attempt: u32) -> Span {
    tracing::info_span!(
        "llm_attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        model,
        attempt = i64::from(attempt),
        status = Empty,
        retry_wait_ms = Empty,
        hedge = Empty,
    )
}

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

impl Synthesizer {
    /// Calls `link`'s model until it answers, fails for good, runs out of
    /// retries or the deadline nears; the reply's tokens are added to
    /// `tally`, and the model whose duplicate answered (hedging) noted
    /// there. When recording, every attempt is pushed onto `attempts` (and
    /// none is hedged).
    pub(super) async fn call_with_retries(
        &self,
        link: &Link,
        request: &Completion<'_>,
        deadline: Instant,
        tally: &mut Tally,
        mut attempts: Option<&mut Vec<Attempt>>,
    ) -> Result<String, LlmError> {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(8))
            .with_jitter()
            .with_max_times(self.config.max_retries as usize)
            .build();
        let mut attempt = 0u32;
        loop {
            let asked = Instant::now();
            let admission = self.admit(link, request, deadline).await?;
            let waited = asked.elapsed();
            if let Some(o) = &self.observer {
                o.queued(&link.id, waited);
            }
            let started = Instant::now();
            attempt += 1;
            let span = attempt_span(&link.id, attempt);
            let hedge = attempts.is_none();
            let raced = self
                .send_hedged(
                    link,
                    request,
                    admission,
                    &span,
                    deadline,
                    (attempt, hedge, waited),
                )
                .await;
            let result = match raced {
                Raced::First(result) => {
                    self.report_attempt(link, &result, started, &span, attempts.as_deref_mut());
                    result
                }
                Raced::Hedge { reply, index, first } => {
                    // A cancelled first attempt was reported as such.
                    if let Some(error) = first {
                        self.report_attempt(link, &Err(error), started, &span, None);
                    }
                    tally.hedged_by = Some(index);
                    Ok(reply)
                }
            };
            let error = match result {
                Ok(reply) => {
                    tally.usage.add(&reply.usage);
                    self.limits.charge_overrun(&reply.usage, request);
                    return Ok(reply.text);
                }
                Err(e) => e,
            };
            let Some(delay) = retry_delay(&error, &mut backoff, deadline, started.elapsed()) else {
                return Err(error);
            };
            self.report_retry(link, &error, delay, &span, attempts.as_deref_mut());
            // The attempt ends here; the wait is not part of it.
            drop(span);
            tokio::time::sleep(delay).await;
        }
    }

    /// Waits for the limits; a spent budget is reported to the observer.
    async fn admit(
        &self,
        link: &Link,
        request: &Completion<'_>,
        deadline: Instant,
    ) -> Result<Admission<'_>, LlmError> {
        let price = price_of(&self.config, link);
        let admitted = self.limits.admit(request, price.as_ref(), deadline).await;
        if let Err(LlmError::BudgetExhausted) = admitted {
            self.observe_budget();
        }
        admitted
    }

    /// Sends one admitted attempt, frees its call slot when the reply is in,
    /// and settles what it spent.
    pub(super) async fn send(
        &self,
        link: &Link,
        request: &Completion<'_>,
        admission: Admission<'_>,
        waited: Duration,
        span: &Span,
    ) -> Result<Reply, LlmError> {
        let Admission {
            slot,
            reservation,
            remaining,
        } = admission;
        self.observe_in_flight();
        let begun = self.saturation.begin(&link.id, waited);
        let result = link
            .client
            .complete(request, remaining)
            .instrument(span.clone())
            .await;
        drop(slot);
        self.observe_in_flight();
        let timed_out = matches!(result, Err(LlmError::Timeout));
        if let Some(s) = self.saturation.end(&link.id, begun, timed_out) {
            self.warn_saturated(link, s);
        }
        if result.as_ref().err().is_none_or(LlmError::is_answer) {
            self.answered.store(true, Ordering::Relaxed);
        }
        if let Some(reservation) = reservation {
            settle(reservation, &result, price_of(&self.config, link).as_ref());
            self.observe_budget();
        }
        result
    }

    /// Says (rarely: see `saturation`) that `link`'s server is saturated,
    /// and what to change.
    fn warn_saturated(&self, link: &Link, s: Saturated) {
        tracing::warn!(
            model = %link.id,
            attempts = s.attempts,
            timeouts = s.timeouts,
            queued = s.queued,
            "the model's server looks saturated: {} of {} attempts in the last {} s timed out, {} of them \
             sent while others waited at it. It serves fewer requests at once than llm.concurrency = {} \
             sends: lower llm.concurrency to the server's parallel slots, give the server more slots \
             (vLLM --max-num-seqs, llama.cpp --parallel, Ollama OLLAMA_NUM_PARALLEL), or raise \
             llm.timeout_secs = {}",
            s.timeouts,
            s.attempts,
            WINDOW.as_secs(),
            s.queued,
            self.config.concurrency,
            self.config.timeout_secs,
        );
        if let Some(o) = &self.observer {
            o.saturated(&link.id);
        }
    }

    /// Records how an attempt ended: on its span, to the observer, and in
    /// the call being recorded.
    pub(super) fn report_attempt(
        &self,
        link: &Link,
        result: &Result<Reply, LlmError>,
        started: Instant,
        span: &Span,
        attempts: Option<&mut Vec<Attempt>>,
    ) {
        let status = result
            .as_ref()
            .map_or_else(LlmError::failure_reason, |_| "ok".to_string());
        span.record("status", status.as_str());
        if result.is_err() {
            span.record("otel.status_code", "error");
        }
        if let Some(o) = &self.observer {
            o.attempt(&link.id, &status, started.elapsed());
        }
        if let Some(attempts) = attempts {
            attempts.push(Attempt {
                outcome: AttemptOutcome::from_result(result),
                latency_ms: started.elapsed().as_millis() as u64,
                retry_in_ms: None,
            });
        }
    }

    /// Records a retry after `error`, `delay` from now: to the observer, on
    /// the attempt's span, and on the recorded attempt.
    fn report_retry(
        &self,
        link: &Link,
        error: &LlmError,
        delay: Duration,
        span: &Span,
        attempts: Option<&mut Vec<Attempt>>,
    ) {
        let model = link.id.as_str();
        if let Some(o) = &self.observer {
            o.retry(model, &error.failure_reason());
        }
        if let Some(last) = attempts.and_then(|a| a.last_mut()) {
            last.retry_in_ms = Some(delay.as_millis() as u64);
        }
        span.record("retry_wait_ms", delay.as_millis() as i64);
        tracing::debug!(parent: span, model, reason = %error.failure_reason(), delay_ms = delay.as_millis() as u64, "retrying LLM call");
    }
}
