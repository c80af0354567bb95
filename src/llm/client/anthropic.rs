//! The Anthropic Messages API's wire format: the request body, with the
//! system prompt and the task as text blocks marked with `cache_control`
//! where the request asks for caching, and the reply with its usage.

use serde_json::{json, Value};

use super::completion::{reported, usage_field, Completion, Reply};
use super::error::LlmError;
use crate::messages::Usage;

/// The Anthropic API version header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The path of a completion, under `/v1`.
pub(super) const PATH: &str = "/messages";

/// The JSON body of `request`.
pub(super) fn body(request: &Completion<'_>) -> Value {
    json!({
        "model": request.model,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "system": system(request),
        "messages": [{"role": "user", "content": user(request)}],
    })
}

/// Anthropic's `cache_control` for a breakpoint of `request`.
fn cache_control(request: &Completion<'_>) -> Value {
    if request.cache.one_hour {
        json!({"type": "ephemeral", "ttl": "1h"})
    } else {
        json!({"type": "ephemeral"})
    }
}

/// The `system` of a Messages request: the string, or text blocks split at
/// the breakpoints, each marked block ending at one.
fn system(request: &Completion<'_>) -> Value {
    let breaks = &request.cache.system_breaks;
    if breaks.is_empty() {
        return json!(request.system);
    }
    let mut blocks = Vec::new();
    let mut start = 0;
    for &end in breaks {
        let Some(text) = request.system.get(start..end).filter(|t| !t.is_empty()) else {
            continue;
        };
        blocks.push(json!({"type": "text", "text": text, "cache_control": cache_control(request)}));
        start = end;
    }
    if let Some(rest) = request.system.get(start..).filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "text", "text": rest}));
    }
    Value::Array(blocks)
}

/// The user message's `content`: the string, or the task section as a
/// marked block and the rest after it.
fn user(request: &Completion<'_>) -> Value {
    let split = request
        .cache
        .task_break
        .and_then(|end| Some((request.user.get(..end)?, request.user.get(end..)?)))
        .filter(|(task, rest)| !task.is_empty() && !rest.is_empty());
    match split {
        None => json!(request.user),
        Some((task, rest)) => json!([
            {"type": "text", "text": task, "cache_control": cache_control(request)},
            {"type": "text", "text": rest},
        ]),
    }
}

/// The text, usage and stop reason of a Messages reply.
pub(super) fn reply(v: &Value) -> Result<Reply, LlmError> {
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::Malformed("no `content` array".into()))?;
    let text = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("");
    Ok(Reply {
        text: text.trim().to_string(),
        // `input_tokens` is the uncached input; the cache parts are apart.
        usage: Usage {
            input_tokens: usage_field(v, &["usage", "input_tokens"]),
            output_tokens: usage_field(v, &["usage", "output_tokens"]),
            cache_read_input_tokens: reported(v, &["usage", "cache_read_input_tokens"]),
            cache_creation_input_tokens: reported(v, &["usage", "cache_creation_input_tokens"]),
        },
        stop_reason: v.get("stop_reason").and_then(Value::as_str).map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::client::CacheMarks;

    #[test]
    fn reads_the_reply_shape() {
        let a = reply(&json!({"content": [{"type": "text", "text": " hi "}], "usage": {"input_tokens": 5, "output_tokens": 2}, "stop_reason": "end_turn"})).unwrap();
        assert_eq!(
            (a.text.as_str(), a.usage.input_tokens, a.usage.output_tokens),
            ("hi", 5, 2)
        );
        assert!(matches!(reply(&json!({"id": 1})), Err(LlmError::Malformed(_))));
    }

    #[test]
    fn cache_usage_is_read_as_anthropic_reports_it() {
        let a = reply(&json!({"content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 50, "output_tokens": 2, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 0}})).unwrap();
        assert_eq!(a.usage.input_tokens, 50);
        assert_eq!(a.usage.cache_read_input_tokens, Some(2000));
        assert_eq!(
            a.usage.cache_creation_input_tokens,
            Some(0),
            "a reported 0 stays 0"
        );
        let unreported = reply(&json!({"content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 5, "output_tokens": 2}})).unwrap();
        assert_eq!(
            unreported.usage.cache_read_input_tokens, None,
            "absent is unknown, not 0"
        );
    }

    fn completion<'a>(system: &'a str, user: &'a str, cache: CacheMarks) -> Completion<'a> {
        Completion {
            model: "m",
            system,
            user,
            max_tokens: 10,
            temperature: 0.0,
            cache,
        }
    }

    #[test]
    fn breakpoints_split_the_system_and_the_task_into_marked_blocks() {
        let plain = completion("sys", "## Task\nx\n\n## Rest", CacheMarks::default());
        assert_eq!(system(&plain), json!("sys"));
        assert_eq!(user(&plain), json!("## Task\nx\n\n## Rest"));
        let marks = CacheMarks {
            system_breaks: vec![4, 9],
            task_break: Some(9),
            one_hour: true,
            key: None,
        };
        let marked = completion("base ctx env", "## Task\nx\n\n## Rest", marks);
        let ephemeral = json!({"type": "ephemeral", "ttl": "1h"});
        assert_eq!(
            system(&marked),
            json!([
                {"type": "text", "text": "base", "cache_control": ephemeral},
                {"type": "text", "text": " ctx ", "cache_control": ephemeral},
                {"type": "text", "text": "env"},
            ])
        );
        assert_eq!(
            user(&marked),
            json!([
                {"type": "text", "text": "## Task\nx", "cache_control": ephemeral},
                {"type": "text", "text": "\n\n## Rest"},
            ])
        );
    }
}
