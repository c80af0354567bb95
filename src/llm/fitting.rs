//! The prompt of one model's call fitted to its context window (see `fit`):
//! the window from `[llm.context_tokens]`, the built-in table, or the
//! server (asked once, in the background, so that no hint waits on it);
//! then the call, and on a context-length error one refit to half the
//! budget and one more call. A second context-length error fails the model
//! with `failure_reason = "context_length"`, and the chain goes on.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::call::call_model;
use super::client::LlmError;
use super::fit::{estimate_tokens, fit, user_budget, Fitted};
use super::link::{Link, Turn};
use super::prompt::Ask;
use super::prompt_cache::PromptText;
use super::shared::Shared;
use super::tally::Tally;
use crate::config::context_tokens_of;
use crate::messages::FailedTrajectory;

/// How long a server is given to say its context window.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// One model's call with the prompt fitted to its window, refitted once
/// to half the budget after a context-length error. `None` as
/// `call_model` returns it.
pub(super) async fn call_fitted<'a>(
    shared: &Shared,
    turn: Turn<'a>,
    t: &FailedTrajectory,
    ask: Ask<'_>,
    first: bool,
    deadline: Instant,
    tally: &mut Tally<'a>,
) -> Option<Result<String, LlmError>> {
    let link = turn.link;
    let config = &shared.config;
    // A synthesizer made for a level asks at it, whatever else is asked.
    let ask = Ask {
        level: shared.level.or(ask.level),
        ..ask
    };
    // The system prompt as sent: with the system context files.
    let system_prompt = prompt_text(shared, t, String::new()).system;
    let system = system_prompt.as_str();
    let window = window_of(shared, link);
    let budget = window.map_or(u64::MAX, |w| user_budget(w, config.max_tokens, system));
    let fitted = fit(shared.prompt, t, ask, budget);
    observe_fit(shared, link, &fitted);
    let sent_tokens = estimate_tokens(&fitted.user);
    let prompt = prompt_text(shared, t, fitted.user);
    let error = match call_model(shared, turn, &prompt, first, deadline, tally).await? {
        Err(e) if e.is_context_length() && Instant::now() < deadline => e,
        other => return Some(other),
    };
    // The window the server names, else the one we had, else the prompt
    // sent: half of what the user message could take in it.
    let half = match error.context_limit().or(window) {
        Some(w) => user_budget(w, config.max_tokens, system).min(budget) / 2,
        None => sent_tokens / 2,
    };
    let refitted = fit(shared.prompt, t, ask, half);
    observe_fit(shared, link, &refitted);
    tracing::info!(model = %link.id, error = %error, budget_tokens = half, "the prompt was over the model's context window; refitted to half the budget");
    let prompt = prompt_text(shared, t, refitted.user);
    call_model(shared, turn, &prompt, first, deadline, tally).await
}

/// The prompt for `t`: the version's system prompt (at the synthesizer's
/// level, if it has one) with the context files (the common one, then
/// `t`'s `env_class` one), and its user message as fitted.
fn prompt_text(shared: &Shared, t: &FailedTrajectory, user: String) -> PromptText {
    let contexts: Vec<&str> = shared
        .context
        .common
        .as_deref()
        .into_iter()
        .chain(shared.context.for_env_class(t.env_class.as_deref()))
        .collect();
    PromptText::new(&shared.prompt.system_prompt_at(shared.level), &contexts, user)
}

/// The context window of `link`'s model: configured, built in, or
/// reported by its server; `None` while unknown (the prompt is then
/// sent unfitted, and a context-length error refits it).
fn window_of(shared: &Shared, link: &Link) -> Option<u32> {
    let configured = &shared.config.context_tokens;
    if let Some(tokens) =
        context_tokens_of(configured, &link.id).or_else(|| context_tokens_of(configured, &link.api_model))
    {
        return Some(tokens);
    }
    // A cassette's run must fit its prompts the same way when replayed.
    if !shared.config.discover_context || shared.cassette.is_some() {
        return None;
    }
    if !link.discovered.asked.swap(true, Ordering::Relaxed) {
        let client = link.client.clone();
        let (id, model) = (link.id.clone(), link.api_model.clone());
        let cell = link.discovered.window.clone();
        tokio::spawn(async move {
            let window = client.context_window(&model, DISCOVERY_TIMEOUT).await;
            match window {
                Some(tokens) => {
                    tracing::info!(model = %id, context_tokens = tokens, "the model's server reported its context window")
                }
                None => {
                    tracing::info!(model = %id, "the model's server did not say its context window: its prompts are not fitted (set [llm.context_tokens] \"{id}\")")
                }
            }
            let _ = cell.set(window);
        });
    }
    link.discovered.window.get().copied().flatten()
}

fn observe_fit(shared: &Shared, link: &Link, fitted: &Fitted) {
    if fitted.fitted {
        if let Some(o) = &shared.observer {
            o.prompt_fitted(&link.id, fitted.chars_dropped);
        }
    }
}
