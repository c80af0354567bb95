//! Models' context windows: `[llm.context_tokens]` (tokens by model id),
//! the built-in windows of the default models, and their bounds.

use std::collections::BTreeMap;

use super::error::{invalid, ConfigError};

/// The smallest `llm.context_tokens` value accepted: below it not even the
/// system prompt, the task and `max_tokens` fit.
pub const MIN_CONTEXT_TOKENS: u32 = 512;

/// The largest accepted: beyond it the value is a typo.
pub const MAX_CONTEXT_TOKENS: u32 = 100_000_000;

/// The context windows of the default models and the reference trainer's,
/// in tokens, as their providers document them. A model of the chain that
/// is neither here nor in `[llm.context_tokens]` has its window asked of its
/// server (`llm.discover_context`), else its prompt is not fitted.
pub const BUILT_IN_CONTEXT_TOKENS: &[(&str, u32)] = &[
    ("claude-sonnet-4-20250514", 200_000),
    ("claude-3-5-haiku-20241022", 200_000),
    ("gpt-4o-mini", 128_000),
    ("openrouter/anthropic/claude-sonnet-4", 200_000),
    ("anthropic/claude-sonnet-4", 200_000),
];

/// The window of `model`: `[llm.context_tokens]` first, then the built-in
/// table; `None` when neither knows it.
pub fn context_tokens_of(configured: &BTreeMap<String, u32>, model: &str) -> Option<u32> {
    configured.get(model).copied().or_else(|| {
        BUILT_IN_CONTEXT_TOKENS
            .iter()
            .find(|(id, _)| *id == model)
            .map(|(_, tokens)| *tokens)
    })
}

/// Every configured window within [`MIN_CONTEXT_TOKENS`]..=[`MAX_CONTEXT_TOKENS`]
/// and above `max_tokens` (the reply must fit beside the prompt).
pub fn validate_context_tokens(
    configured: &BTreeMap<String, u32>,
    max_tokens: u32,
) -> Result<(), ConfigError> {
    for (model, &tokens) in configured {
        if !(MIN_CONTEXT_TOKENS..=MAX_CONTEXT_TOKENS).contains(&tokens) {
            return invalid(format!(
                "llm.context_tokens.\"{model}\" = {tokens} must be within \
                 {MIN_CONTEXT_TOKENS}..={MAX_CONTEXT_TOKENS}"
            ));
        }
        if tokens <= max_tokens.saturating_mul(2) {
            return invalid(format!(
                "llm.context_tokens.\"{model}\" = {tokens} leaves no room for a prompt beside \
                 llm.max_tokens = {max_tokens}: the window must be over twice max_tokens"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_window_wins_over_the_built_in_one() {
        let mut configured = BTreeMap::new();
        assert_eq!(context_tokens_of(&configured, "gpt-4o-mini"), Some(128_000));
        assert_eq!(context_tokens_of(&configured, "my-local-model"), None);
        configured.insert("gpt-4o-mini".to_string(), 8_192);
        assert_eq!(context_tokens_of(&configured, "gpt-4o-mini"), Some(8_192));
    }

    #[test]
    fn windows_out_of_bounds_or_without_room_for_the_reply_are_refused() {
        let one = |tokens| BTreeMap::from([("m".to_string(), tokens)]);
        assert!(validate_context_tokens(&one(2_048), 300).is_ok());
        assert!(validate_context_tokens(&one(100), 300).is_err());
        assert!(validate_context_tokens(&one(u32::MAX), 300).is_err());
        assert!(validate_context_tokens(&one(1_000), 600).is_err());
    }
}
