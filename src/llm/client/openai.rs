//! The OpenAI-compatible chat completions wire format (OpenAI,
//! OpenRouter, vLLM, LiteLLM, Ollama, llama.cpp): the request body with its
//! `prompt_cache_key`, the reply with its usage, and the context window a
//! server reports in its model list or its `/props`.

use serde_json::{json, Value};

use super::completion::{reported, usage_field, Completion, Reply};
use super::error::LlmError;
use crate::messages::Usage;

/// The path of a completion, under the base URL as given.
pub(super) const PATH: &str = "/chat/completions";

/// The JSON body of `request`.
pub(super) fn body(request: &Completion<'_>) -> Value {
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
    });
    if let Some(key) = &request.cache.key {
        body["prompt_cache_key"] = json!(key);
    }
    body
}

/// The text, usage and stop reason of a chat completion.
pub(super) fn reply(v: &Value) -> Result<Reply, LlmError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| LlmError::Malformed("no `choices[0]`".into()))?;
    let text = choice
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(Reply {
        text: text.trim().to_string(),
        usage: usage(v),
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// OpenAI's usage: `prompt_tokens` includes the cached
/// `prompt_tokens_details.cached_tokens`, which is taken out as a read.
/// OpenAI bills no cache write.
fn usage(v: &Value) -> Usage {
    let prompt = usage_field(v, &["usage", "prompt_tokens"]);
    let cached = reported(v, &["usage", "prompt_tokens_details", "cached_tokens"]).map(|c| c.min(prompt));
    Usage {
        input_tokens: prompt - cached.unwrap_or(0),
        output_tokens: usage_field(v, &["usage", "completion_tokens"]),
        cache_read_input_tokens: cached,
        cache_creation_input_tokens: None,
    }
}

/// The window of `model` in a `/models` answer: `max_model_len` (vLLM),
/// `context_length` (OpenRouter) or `meta.n_ctx` of the entry whose `id` is
/// `model`, or of the only entry.
pub(super) fn model_window(v: &Value, model: &str) -> Option<u32> {
    let data = v.get("data")?.as_array()?;
    let entry = data
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
        .or(if data.len() == 1 { data.first() } else { None })?;
    ["/max_model_len", "/context_length", "/meta/n_ctx"]
        .iter()
        .find_map(|p| entry.pointer(p).and_then(Value::as_u64))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
}

/// The window a llama.cpp server's `/props` answer reports:
/// `default_generation_settings.n_ctx`, or a top-level `n_ctx`.
pub(super) fn props_window(props: &Value) -> Option<u32> {
    let n_ctx = props
        .pointer("/default_generation_settings/n_ctx")
        .or_else(|| props.get("n_ctx"))?;
    n_ctx
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_models_window_from_vllm_and_openrouter_lists() {
        let vllm = json!({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 32768}]});
        assert_eq!(model_window(&vllm, "b"), Some(32768));
        assert_eq!(model_window(&vllm, "c"), None, "two entries, none named");
        let one = json!({"data": [{"id": "served-as-anything", "meta": {"n_ctx": 2048}}]});
        assert_eq!(model_window(&one, "smollm2"), Some(2048));
        let openrouter = json!({"data": [{"id": "x/y", "context_length": 200000}]});
        assert_eq!(model_window(&openrouter, "x/y"), Some(200000));
        assert_eq!(model_window(&json!({"data": [{"id": "m"}]}), "m"), None);
    }

    #[test]
    fn reads_the_reply_shape() {
        let o = reply(&json!({"choices": [{"message": {"content": "yo"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})).unwrap();
        assert_eq!((o.text.as_str(), o.usage.input_tokens), ("yo", 3));
    }

    #[test]
    fn cache_usage_is_read_as_openai_reports_it() {
        let o = reply(&json!({"choices": [{"message": {"content": "yo"}}], "usage": {"prompt_tokens": 1500, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 1280}}})).unwrap();
        assert_eq!(o.usage.input_tokens, 220, "prompt_tokens less the cached ones");
        assert_eq!(o.usage.cache_read_input_tokens, Some(1280));
        assert_eq!(o.usage.cache_creation_input_tokens, None);
    }
}
