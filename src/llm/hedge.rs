//! Hedged requests (`llm.hedge`, "The Tail at Scale"): when an HTTP attempt
//! is still in flight after its model's observed p95 latency (over the last
//! `llm.hedge_window` calls, never under `llm.hedge_min_delay_ms`), one
//! duplicate is sent, to the same model or the chain's next
//! (`llm.hedge_to`); the first complete answer wins and the other request
//! is dropped (its HTTP request aborted). The state this needs (latencies,
//! the token bucket) is `hedger`'s; one attempt's send is `send`'s.
//!
//! Bounds:
//! - A token bucket caps duplicates at `llm.hedge_max_share` of requests:
//!   each first attempt earns that share of a token, a duplicate takes a
//!   whole one, and the bucket holds at most `share × window` tokens (at
//!   least one). Over any run, duplicates never exceed the share of first
//!   attempts plus that burst. When the bucket is empty, a duplicate that
//!   is due waits for the next token while its attempt runs (the longest
//!   waiter first): under pressure the tokens go to the attempts still in
//!   flight, the slowest, instead of to whichever came due first.
//! - A duplicate takes a call slot, the rate limits and a budget
//!   reservation like any attempt, without waiting: one that cannot get
//!   them at once is not sent (and its token is given back).
//! - Only the HTTP attempt in flight is hedged, never a retry's backoff or
//!   a `retry-after` wait: those happen between attempts, outside the race.
//! - No hedge before a model has
//!   [`MIN_HEDGE_WINDOW`](crate::config::MIN_HEDGE_WINDOW) successful calls
//!   in its window, and none while recording a cassette (which replays one
//!   attempt sequence).
//!
//! A cancelled request's cost is unknown: the budget charges its
//! reservation (the worst case), and the extra-spend metric estimates it as
//! the winning answer's usage at the cancelled model's price.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::Span;

use super::attempt::{attempt_span, report_attempt};
use super::client::{CacheMarks, Completion, LlmError, Reply};
use super::hedger::Hedger;
use super::limits::Admission;
use super::link::{Link, Turn};
use super::pricing::{cost_usd, price_of};
use super::send::send;
use super::shared::Shared;
use crate::config::HedgeTo;

/// How a hedged attempt ended.
pub(super) enum Raced<'a> {
    /// The first attempt's own result; a duplicate, if one was sent, lost
    /// or failed.
    First(Result<Reply, LlmError>),
    /// The duplicate's answer, from the model `by`; `first` is the first
    /// attempt's error, or `None` when it was cancelled.
    Hedge {
        reply: Reply,
        by: &'a Link,
        first: Option<LlmError>,
    },
}

/// Sends an admitted attempt of `turn`'s model and, when hedging is on
/// and the attempt outlives its model's delay, one duplicate; the first
/// complete answer wins. The duplicate's span carries the same `attempt`
/// number and `hedge = true`. `hedge` false (recording a cassette): the
/// attempt alone.
pub(super) async fn send_hedged<'a>(
    shared: &Shared,
    turn: Turn<'a>,
    request: &Completion<'_>,
    admission: Admission<'_>,
    span: &Span,
    deadline: Instant,
    (attempt, hedge, waited): (u32, bool, Duration),
) -> Raced<'a> {
    let link = turn.link;
    let Some(hedger) = shared.hedger.as_deref().filter(|_| hedge) else {
        return Raced::First(send(shared, link, request, admission, waited, span).await);
    };
    hedger.earn();
    let started = Instant::now();
    // The window's clock is Tokio's: the same as `started`'s in a
    // stage, and the paused clock in tests.
    let clock = tokio::time::Instant::now();
    // Boxed, so that dropping it aborts the request there and then.
    let mut first = Box::pin(send(shared, link, request, admission, waited, span));
    let ended = |result: Result<Reply, LlmError>| {
        if result.is_ok() {
            hedger.record(&link.id, clock.elapsed());
        }
        Raced::First(result)
    };
    let Some(delay) = hedger.delay(&link.id) else {
        return ended(first.await);
    };
    tokio::select! {
        // An answer due on the tick the delay ends wins: no duplicate.
        biased;
        result = &mut first => return ended(result),
        _ = tokio::time::sleep(delay) => {}
    }
    let target = hedge_target(turn, hedger.to);
    let hedge_request = retargeted(request, link, target);
    let hedge_admission =
        match admit_duplicate(shared, hedger, target, &hedge_request, &mut first, deadline).await {
            Ok(admission) => admission,
            Err(Some(result)) => return ended(result),
            Err(None) => return ended(first.await),
        };
    if let Some(o) = &shared.observer {
        o.hedge_sent(&target.id);
    }
    let hedge_span = attempt_span(&target.id, attempt);
    hedge_span.record("hedge", true);
    let hedge_started = Instant::now();
    // Admitted without waiting.
    let mut second = Box::pin(send(
        shared,
        target,
        &hedge_request,
        hedge_admission,
        Duration::ZERO,
        &hedge_span,
    ));
    tokio::select! {
        biased;
        result = &mut first => match result {
            Ok(reply) => {
                hedger.record(&link.id, clock.elapsed());
                drop(second);
                cancelled(shared, target, &reply, hedge_started, &hedge_span);
                Raced::First(Ok(reply))
            }
            // The first failed: the duplicate in flight may still answer.
            Err(error) => {
                let second = second.await;
                report_hedge(shared, target, &second, hedge_started, &hedge_span);
                match second {
                    Ok(reply) => hedge_won(shared, target, reply, Some(error)),
                    Err(_) => Raced::First(Err(error)),
                }
            }
        },
        result = &mut second => {
            report_hedge(shared, target, &result, hedge_started, &hedge_span);
            match result {
                Ok(reply) => {
                    // The first took at least this long.
                    hedger.record(&link.id, clock.elapsed());
                    drop(first);
                    cancelled(shared, link, &reply, started, span);
                    hedge_won(shared, target, reply, None)
                }
                Err(_) => ended(first.await),
            }
        }
    }
}

/// A token and an admission for a duplicate to `target`, without
/// waiting for the limits. `Err(Some)`: the first attempt answered
/// meanwhile (no duplicate is sent: its reservation is freed, its token
/// returned); `Err(None)`: no token or no admission at once (skipped and
/// counted).
async fn admit_duplicate<'s, F>(
    shared: &'s Shared,
    hedger: &Hedger,
    target: &Link,
    hedge_request: &Completion<'_>,
    first: &mut F,
    deadline: Instant,
) -> Result<Admission<'s>, Option<Result<Reply, LlmError>>>
where
    F: Future<Output = Result<Reply, LlmError>> + Unpin,
{
    if let Err(result) = hedger.token_or(first).await {
        hedge_skipped(shared, target, "share");
        return Err(Some(result));
    }
    let price = price_of(&shared.config, target);
    let Some(Ok(admission)) = shared
        .limits
        .admit(hedge_request, price.as_ref(), deadline)
        .now_or_never()
    else {
        hedger.refund();
        hedge_skipped(shared, target, "limits");
        return Err(None);
    };
    if let Some(result) = first.now_or_never() {
        if let Some(reservation) = admission.reservation {
            reservation.release();
        }
        hedger.refund();
        return Err(Some(result));
    }
    Ok(admission)
}

/// The model a duplicate of `turn`'s goes to: its own, or with `next` the
/// one after it (its own when it is last).
fn hedge_target(turn: Turn<'_>, to: HedgeTo) -> &Link {
    match (to, turn.next) {
        (HedgeTo::Next, Some(next)) => next,
        _ => turn.link,
    }
}

/// A duplicate was due but not sent, for `reason`.
fn hedge_skipped(shared: &Shared, target: &Link, reason: &str) {
    if let Some(o) = &shared.observer {
        o.hedge_skipped(&target.id, reason);
    }
}

fn hedge_won<'a>(shared: &Shared, target: &'a Link, reply: Reply, first: Option<LlmError>) -> Raced<'a> {
    if let Some(o) = &shared.observer {
        o.hedge_won(&target.id);
    }
    Raced::Hedge {
        reply,
        by: target,
        first,
    }
}

/// The duplicate's attempt ended: on its span and to the observer.
fn report_hedge(
    shared: &Shared,
    target: &Link,
    result: &Result<Reply, LlmError>,
    started: Instant,
    span: &Span,
) {
    report_attempt(shared, target, result, started, span, None);
    shared.observe_in_flight();
}

/// `link`'s attempt was dropped for the other's `answer`: reported as
/// `cancelled`, its spend estimated at the answer's usage.
fn cancelled(shared: &Shared, link: &Link, answer: &Reply, started: Instant, span: &Span) {
    span.record("status", "cancelled");
    shared.observe_in_flight();
    if let Some(o) = &shared.observer {
        o.attempt(&link.id, "cancelled", started.elapsed());
        o.hedge_extra_usd(
            &link.id,
            cost_usd(price_of(&shared.config, link).as_ref(), &answer.usage),
        );
    }
}

/// `request` to `target`'s model: cache marks are per provider, so they
/// go only to a target of `link`'s.
fn retargeted<'a>(request: &Completion<'a>, link: &Link, target: &'a Link) -> Completion<'a> {
    Completion {
        model: &target.api_model,
        cache: if target.client.provider() == link.client.provider() {
            request.cache.clone()
        } else {
            CacheMarks::default()
        },
        ..request.clone()
    }
}
