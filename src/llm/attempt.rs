//! One HTTP attempt's trace and report: its `llm_attempt` span (model,
//! attempt, status, retry wait, hedge), and how it ended, told to the span,
//! the observer and the call being recorded.

use std::time::Instant;

use tracing::field::Empty;
use tracing::Span;

use super::cassette::{Attempt, AttemptOutcome};
use super::client::{LlmError, Reply};
use super::link::Link;
use super::shared::Shared;

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

/// Records how an attempt ended: on its span, to the observer, and in
/// the call being recorded.
pub(super) fn report_attempt(
    shared: &Shared,
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
    if let Some(o) = &shared.observer {
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
