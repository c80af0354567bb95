//! The prompt of one model's call fitted to its context window (see `fit`):
//! the window from `[llm.context_tokens]`, the built-in table, or the
//! server (asked once, in the background, so that no hint waits on it);
//! then the call, and on a context-length error one refit to half the
//! budget and one more call. A second context-length error fails the model
//! with `failure_reason = "context_length"`, and the chain goes on.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::client::LlmError;
use super::fit::{estimate_tokens, fit, user_budget, Fitted};
use super::link::Link;
use super::synth::Synthesizer;
use super::tally::Tally;
use crate::config::context_tokens_of;
use crate::messages::FailedTrajectory;

/// How long a server is given to say its context window.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

impl Synthesizer {
    /// The context window of `link`'s model: configured, built in, or
    /// reported by its server; `None` while unknown (the prompt is then
    /// sent unfitted, and a context-length error refits it).
    pub(super) fn window_of(&self, link: &Link) -> Option<u32> {
        let configured = &self.config.context_tokens;
        if let Some(tokens) =
            context_tokens_of(configured, &link.id).or_else(|| context_tokens_of(configured, &link.api_model))
        {
            return Some(tokens);
        }
        // A cassette's run must fit its prompts the same way when replayed.
        if !self.config.discover_context || self.cassette.is_some() {
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

    /// One model's call with the prompt fitted to its window, refitted once
    /// to half the budget after a context-length error. `None` as
    /// `call_model` returns it.
    pub(super) async fn call_fitted(
        &self,
        link: &Link,
        t: &FailedTrajectory,
        extra: Option<&str>,
        first: bool,
        deadline: Instant,
        tally: &mut Tally,
    ) -> Option<Result<String, LlmError>> {
        // The system prompt as sent: with the system context files.
        let system_prompt = self.prompt_text(t, String::new()).system;
        let system = system_prompt.as_str();
        let window = self.window_of(link);
        let budget = window.map_or(u64::MAX, |w| user_budget(w, self.config.max_tokens, system));
        let fitted = fit(self.prompt, t, extra, budget);
        self.observe_fit(link, &fitted);
        let sent_tokens = estimate_tokens(&fitted.user);
        let error = match self
            .call_model(link, &self.prompt_text(t, fitted.user), first, deadline, tally)
            .await?
        {
            Err(e) if e.is_context_length() && Instant::now() < deadline => e,
            other => return Some(other),
        };
        // The window the server names, else the one we had, else the prompt
        // sent: half of what the user message could take in it.
        let half = match error.context_limit().or(window) {
            Some(w) => user_budget(w, self.config.max_tokens, system).min(budget) / 2,
            None => sent_tokens / 2,
        };
        let refitted = fit(self.prompt, t, extra, half);
        self.observe_fit(link, &refitted);
        tracing::info!(model = %link.id, error = %error, budget_tokens = half, "the prompt was over the model's context window; refitted to half the budget");
        self.call_model(link, &self.prompt_text(t, refitted.user), first, deadline, tally)
            .await
    }

    fn observe_fit(&self, link: &Link, fitted: &Fitted) {
        if fitted.fitted {
            if let Some(o) = &self.observer {
                o.prompt_fitted(&link.id, fitted.chars_dropped);
            }
        }
    }
}
