//! One model's call for one hint: played from the cassette when it plays
//! and holds the request (the recorded attempts, outcomes and time, without
//! HTTP or sleeping), else sent to the API with retries, and appended to the
//! cassette when one is attached.

use std::time::{Duration, Instant};

use super::cassette::{request_key, AttemptOutcome, Call, Cassette, CassetteMode};
use super::client::{Completion, LlmError};
use super::link::{Link, Turn};
use super::prompt_cache::PromptText;
use super::retry::call_with_retries;
use super::shared::Shared;
use super::tally::Tally;

/// The request for `prompt` to `link`'s model, with its cache marks.
fn request<'a>(shared: &'a Shared, link: &'a Link, prompt: &'a PromptText) -> Completion<'a> {
    Completion {
        model: &link.api_model,
        system: &prompt.system,
        user: &prompt.user,
        max_tokens: shared.config.max_tokens,
        temperature: shared.config.temperature,
        cache: shared.prompt_cache.marks(
            link.client.provider(),
            &link.api_model,
            shared.prompt.as_str(),
            prompt,
        ),
    }
}

/// One model of the chain: from the cassette when it plays and holds the
/// request, else from the API (recorded when a cassette is attached).
/// `None` in playback when the cassette never saw a later model of the
/// chain: the recorded run stopped there (its time budget ran out).
pub(super) async fn call_model<'a>(
    shared: &Shared,
    turn: Turn<'a>,
    prompt: &PromptText,
    first: bool,
    deadline: Instant,
    tally: &mut Tally<'a>,
) -> Option<Result<String, LlmError>> {
    let link = turn.link;
    let request = request(shared, link, prompt);
    let Some(cassette) = &shared.cassette else {
        tally.live = true;
        return Some(call_with_retries(shared, turn, &request, deadline, tally, None).await);
    };
    let key = request_key(link.client.provider(), &request);
    if cassette.plays() {
        if let Some(call) = cassette.play(&key) {
            return Some(replay(shared, &call, tally));
        }
        if !first {
            return None;
        }
        if cassette.mode() == CassetteMode::Strict {
            return Some(Err(LlmError::NotInCassette {
                model: link.id.clone(),
            }));
        }
    }
    Some(record(shared, cassette, turn, &request, key, deadline, tally).await)
}

/// Calls the API and appends the call, every attempt of it, to
/// `cassette` (a failed append is logged: the hint does not wait on it).
async fn record<'a>(
    shared: &Shared,
    cassette: &Cassette,
    turn: Turn<'a>,
    request: &Completion<'_>,
    key: String,
    deadline: Instant,
    tally: &mut Tally<'a>,
) -> Result<String, LlmError> {
    tally.live = true;
    let started = Instant::now();
    let mut attempts = Vec::new();
    let result = call_with_retries(shared, turn, request, deadline, tally, Some(&mut attempts)).await;
    let call = Call {
        key,
        provider: turn.link.client.provider(),
        model: turn.link.id.clone(),
        attempts,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    if let Err(e) = cassette.append(call) {
        tracing::warn!(cassette = %cassette.path().display(), error = %e, "cannot append to the cassette");
    }
    result
}

/// Replays a recorded call attempt by attempt: the same outcomes and
/// retry decisions, the recorded time, no sleeping.
fn replay(shared: &Shared, call: &Call, tally: &mut Tally<'_>) -> Result<String, LlmError> {
    tally.played_ms += call.elapsed_ms;
    let mut last_error = LlmError::Timeout;
    for attempt in &call.attempts {
        let status = attempt.outcome.status();
        if let Some(o) = &shared.observer {
            o.attempt(&call.model, &status, Duration::from_millis(attempt.latency_ms));
        }
        match &attempt.outcome {
            AttemptOutcome::Reply { text, usage, .. } => {
                tally.usage.add(usage);
                return Ok(text.clone());
            }
            AttemptOutcome::Error(e) => {
                if attempt.retry_in_ms.is_some() {
                    if let Some(o) = &shared.observer {
                        o.retry(&call.model, &status);
                    }
                }
                last_error = e.clone();
            }
        }
    }
    Err(last_error)
}
