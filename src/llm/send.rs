//! One admitted attempt sent: its call slot freed when the reply is in,
//! what it spent settled against its budget reservation, readiness and
//! saturation noted, and a saturated server said (rarely: see
//! `saturation`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{Instrument, Span};

use super::client::{Completion, LlmError, Reply};
use super::limits::{settle, Admission};
use super::link::Link;
use super::pricing::price_of;
use super::saturation::{Saturated, WINDOW};
use super::shared::Shared;

/// Sends one admitted attempt, frees its call slot when the reply is in,
/// and settles what it spent.
pub(super) async fn send(
    shared: &Shared,
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
    shared.observe_in_flight();
    let begun = shared.saturation.begin(&link.id, waited);
    let result = link
        .client
        .complete(request, remaining)
        .instrument(span.clone())
        .await;
    drop(slot);
    shared.observe_in_flight();
    let timed_out = matches!(result, Err(LlmError::Timeout));
    if let Some(s) = shared.saturation.end(&link.id, begun, timed_out) {
        warn_saturated(shared, link, s);
    }
    if result.as_ref().err().is_none_or(LlmError::is_answer) {
        shared.answered.store(true, Ordering::Relaxed);
    }
    if let Some(reservation) = reservation {
        settle(reservation, &result, price_of(&shared.config, link).as_ref());
        shared.observe_budget();
    }
    result
}

/// Says (rarely: see `saturation`) that `link`'s server is saturated,
/// and what to change.
fn warn_saturated(shared: &Shared, link: &Link, s: Saturated) {
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
        shared.config.concurrency,
        shared.config.timeout_secs,
    );
    if let Some(o) = &shared.observer {
        o.saturated(&link.id);
    }
}
