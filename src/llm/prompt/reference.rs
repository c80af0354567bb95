//! `prompt_version = "reference"`: the reference trainer's own hint prompt
//! (SkyRL-Fleet's `hint_synthesizer.py`: `HINT_SYSTEM_PROMPT`,
//! `format_trajectory_for_hint`, `format_verifier_feedback` and the user
//! message of `synthesize_hint`) and its static hint
//! (`FleetTaskEnv.build_hint_text`), byte for byte. Lengths are Python's:
//! code points. Blocks are shown as Python `str()` (see `pyrepr`); the
//! accumulators are read with Python's `ast.literal_eval` (see `pyeval`).
//! `schemas/fixtures/reference_prompts.json` holds what the reference's own
//! functions produce for 51 inputs, and the tests check every one.
//!
//! Where the reference raises instead of answering (a `text` block whose
//! `text` is not a string; an accumulator that evaluates to a number, a dict
//! or a set), this builder shows the value's `str()` and no checks,
//! respectively.

use crate::messages::{ChatContent, ChatMessage, ContentBlock, FailedTrajectory, OrderedJson};

use super::pyeval::literal_eval;
use super::pyrepr::{take_chars, PyValue};

/// Stamped on hints as `prompt_version`.
pub const PROMPT_VERSION: &str = "reference";

/// The reference's `HINT_SYSTEM_PROMPT`.
pub const SYSTEM_PROMPT: &str = "\
You are a debugging assistant for an AI agent that failed a task. \
Analyze the failed trajectory and verifier feedback, then provide \
2-5 sentences of actionable guidance for the agent's next attempt.

Rules:
- Be specific: reference exact actions that failed and why.
- Be actionable: tell the agent what to do differently, not just what went wrong.
- If the agent ran out of context/turns, suggest being more efficient (fewer unnecessary steps).
- If tool calls errored, explain the correct usage pattern.
- Do NOT repeat the task instructions verbatim.
- Do NOT say \"the previous attempt failed\" \u{2014} the agent already knows that.";

/// Characters of the task prompt kept.
pub const MAX_TASK_CHARS: usize = 5_000;
/// Chat messages shown, counted from the end (`max_turns`).
pub const MAX_MESSAGES: usize = 15;
/// Characters of one message's text before it is cut (`max_msg_chars`).
pub const MAX_MESSAGE_CHARS: usize = 3_000;
/// Characters of the shown entries in all (`max_total_chars`): the entry
/// that would pass it is replaced by a marker and the rest dropped.
pub const MAX_TOTAL_CHARS: usize = 150_000;
/// Characters of a tool call's input and of a tool result.
pub const MAX_TOOL_CHARS: usize = 500;
/// Characters of a block of another type (or of a non-block item).
pub const MAX_OTHER_BLOCK_CHARS: usize = 200;
/// Checks listed of each accumulator in the prompt, and characters of each.
pub const MAX_CHECKS: usize = 10;
pub const MAX_CHECK_CHARS: usize = 200;
/// Characters of the verifier error in the prompt.
pub const MAX_VERIFIER_ERROR_CHARS: usize = 500;
/// Unique tool errors in the prompt, and characters of each.
pub const MAX_TOOL_ERRORS: usize = 10;
pub const MAX_TOOL_ERROR_CHARS: usize = 300;
/// The static hint's bounds: checks and characters of each, unique tool
/// errors and characters of each (the verifier error is kept whole).
pub const STATIC_MAX_CHECKS: usize = 5;
pub const STATIC_MAX_CHECK_CHARS: usize = 100;
pub const STATIC_MAX_TOOL_ERRORS: usize = 5;
pub const STATIC_MAX_TOOL_ERROR_CHARS: usize = 200;

/// The static hint when the verifier said nothing usable.
pub const STATIC_GENERIC_HINT: &str = "The previous attempt failed. Try a different approach.";

/// The user message of the hint request.
pub fn user_message(t: &FailedTrajectory) -> String {
    format!(
        "## Task\n{}\n\n## Agent Trajectory (last turns)\n{}\n\n## Verifier Feedback\n{}\n\n\
         Based on the trajectory and feedback above, provide 2-5 sentences of specific, \
         actionable guidance for the agent's next attempt.",
        take_chars(&t.task_prompt, MAX_TASK_CHARS),
        format_trajectory(&t.chat_history),
        format_feedback(t),
    )
}

/// `format_trajectory_for_hint`: the last messages as `[role]: text`
/// entries joined by a blank line.
pub fn format_trajectory(history: &[ChatMessage]) -> String {
    if history.is_empty() {
        return "(empty trajectory)".to_string();
    }
    let recent = &history[history.len().saturating_sub(MAX_MESSAGES)..];
    let mut parts: Vec<String> = Vec::new();
    let mut total = 0usize;
    for message in recent {
        let mut content = content_text(&message.content);
        let chars = content.chars().count();
        if chars > MAX_MESSAGE_CHARS {
            content = format!(
                "{}... [truncated, {chars} chars total]",
                take_chars(&content, MAX_MESSAGE_CHARS)
            );
        }
        let line = format!("[{}]: {content}", message.role);
        let len = line.chars().count();
        if total + len > MAX_TOTAL_CHARS {
            parts.push(format!("... [trajectory truncated at {MAX_TOTAL_CHARS} chars]"));
            break;
        }
        parts.push(line);
        total += len;
    }
    parts.join("\n\n")
}

/// One message's content as the reference shows it, before its cut.
pub(crate) fn content_text(content: &ChatContent) -> String {
    match content {
        ChatContent::Text(text) => text.clone(),
        ChatContent::Blocks(blocks) => blocks.iter().map(block_text).collect::<Vec<_>>().join("\n"),
    }
}

/// Python's `str(block.get(key, default))`.
fn field_str(block: &ContentBlock, key: &str, default: &str) -> String {
    block
        .ordered
        .get(key)
        .map_or_else(|| default.to_string(), |v| PyValue::from_json(v).to_py_str())
}

fn block_text(block: &ContentBlock) -> String {
    match block.kind.as_str() {
        "text" => field_str(block, "text", ""),
        "image_url" => "[image]".to_string(),
        "tool_use" => {
            let name = field_str(block, "name", "unknown_tool");
            let input = field_str(block, "input", "");
            format!("[tool_use: {name}({})]", take_chars(&input, MAX_TOOL_CHARS))
        }
        "tool_result" => {
            let result = field_str(block, "content", "");
            format!("[tool_result: {}]", take_chars(&result, MAX_TOOL_CHARS))
        }
        _ => {
            let whole = match &block.ordered {
                OrderedJson::Object(_) => PyValue::from_json(&block.ordered),
                // A block built in code rather than decoded: `type` first.
                _ => {
                    let mut entries = vec![(PyValue::Str("type".into()), PyValue::Str(block.kind.clone()))];
                    entries.extend(block.fields.iter().map(|(k, v)| {
                        let v: OrderedJson = serde_json::from_value(v.clone()).unwrap_or(OrderedJson::Null);
                        (PyValue::Str(k.clone()), PyValue::from_json(&v))
                    }));
                    PyValue::Dict(entries)
                }
            };
            take_chars(&whole.to_py_str(), MAX_OTHER_BLOCK_CHARS).to_string()
        }
    }
}

/// The body of `>>> NAME >>>\n(.+?)\n<<< NAME <<<` (Python's `re.search`
/// with DOTALL): from the first opening marker to the first closing line at
/// least one character after it.
pub fn accumulator_body<'a>(stdout: &'a str, name: &str) -> Option<&'a str> {
    let open = format!(">>> {name} >>>\n");
    let close = format!("\n<<< {name} <<<");
    let start = stdout.find(&open)? + open.len();
    let rest = &stdout[start..];
    rest.match_indices(&close)
        .find(|(i, _)| *i >= 1)
        .map(|(i, _)| &rest[..i])
}

/// An accumulator's checks as the reference lists them: how many, and the
/// items.
type Checks = Option<(usize, Vec<PyValue>)>;

/// The checks of one accumulator; `None` when it shows none (falsy, or
/// where the reference raises).
fn checks(value: &PyValue) -> Checks {
    if !value.truthy() {
        return None;
    }
    match value {
        PyValue::List(items) | PyValue::Tuple(items) => Some((items.len(), items.clone())),
        PyValue::Str(s) => Some((
            s.chars().count(),
            s.chars().map(|c| PyValue::Str(c.to_string())).collect(),
        )),
        PyValue::Bytes(b) => Some((b.len(), b.iter().map(|&x| PyValue::Int(x.into())).collect())),
        // len() or slicing raises in the reference.
        _ => None,
    }
}

/// The (passed, failed) checks of the verifier's stdout: both empty when
/// either block is there but not a Python literal, as in the reference.
fn accumulators(stdout: Option<&str>) -> (Checks, Checks) {
    let Some(stdout) = stdout.filter(|s| !s.is_empty()) else {
        return (None, None);
    };
    let errors = accumulator_body(stdout, "ERROR_ACCUMULATOR");
    let successes = accumulator_body(stdout, "SUCCESS_ACCUMULATOR");
    let eval = |body: Option<&str>| body.map(literal_eval).transpose();
    match (eval(errors), eval(successes)) {
        (Ok(errors), Ok(successes)) => (
            successes.as_ref().and_then(checks),
            errors.as_ref().and_then(checks),
        ),
        _ => (None, None),
    }
}

/// `list(dict.fromkeys(errors))[:n]`.
fn unique(errors: &[String], n: usize) -> Vec<&str> {
    let mut seen = std::collections::HashSet::new();
    errors
        .iter()
        .filter(|e| seen.insert(e.as_str()))
        .take(n)
        .map(String::as_str)
        .collect()
}

/// `format_verifier_feedback`.
pub fn format_feedback(t: &FailedTrajectory) -> String {
    let mut parts: Vec<String> = Vec::new();
    let (passed, failed) = accumulators(t.verifier_stdout.as_deref());
    for (label, list) in [("PASSED", passed), ("FAILED", failed)] {
        if let Some((count, items)) = list {
            parts.push(format!("Verifier checks {label} ({count}):"));
            for item in items.iter().take(MAX_CHECKS) {
                parts.push(format!("  - {}", take_chars(&item.to_py_str(), MAX_CHECK_CHARS)));
            }
        }
    }
    if let Some(e) = t.verifier_error.as_deref().filter(|e| !e.is_empty()) {
        parts.push(format!(
            "Verifier error: {}",
            take_chars(e, MAX_VERIFIER_ERROR_CHARS)
        ));
    }
    if let Some(errors) = t.tool_error_messages.as_deref().filter(|e| !e.is_empty()) {
        parts.push("Tool errors encountered:".to_string());
        for e in unique(errors, MAX_TOOL_ERRORS) {
            parts.push(format!("  - {}", take_chars(e, MAX_TOOL_ERROR_CHARS)));
        }
    }
    if parts.is_empty() {
        "(no verifier feedback available)".to_string()
    } else {
        parts.join("\n")
    }
}

/// `FleetTaskEnv.build_hint_text`: the reference's static hint.
pub fn static_hint(t: &FailedTrajectory) -> String {
    let mut parts: Vec<String> = Vec::new();
    let (passed, failed) = accumulators(t.verifier_stdout.as_deref());
    for (label, list) in [("passed", passed), ("failed", failed)] {
        if let Some((count, items)) = list {
            let shown: Vec<String> = items
                .iter()
                .take(STATIC_MAX_CHECKS)
                .map(|item| take_chars(&item.to_py_str(), STATIC_MAX_CHECK_CHARS).to_string())
                .collect();
            parts.push(format!("Checks {label} ({count}): {}", shown.join(", ")));
        }
    }
    if let Some(e) = t.verifier_error.as_deref().filter(|e| !e.is_empty()) {
        parts.push(format!("Verifier: {e}"));
    }
    if let Some(errors) = t.tool_error_messages.as_deref().filter(|e| !e.is_empty()) {
        let shown: Vec<&str> = unique(errors, STATIC_MAX_TOOL_ERRORS)
            .into_iter()
            .map(|e| take_chars(e, STATIC_MAX_TOOL_ERROR_CHARS))
            .collect();
        parts.push(format!("Tool errors: {}", shown.join("; ")));
    }
    if parts.is_empty() {
        STATIC_GENERIC_HINT.to_string()
    } else {
        parts.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accumulator_body_ends_at_the_first_closing_line_after_one_character() {
        let s = ">>> E >>>\n['a']\n<<< E <<<\n>>> E >>>\n['b']\n<<< E <<<";
        assert_eq!(accumulator_body(s, "E"), Some("['a']"));
        assert_eq!(accumulator_body(">>> E >>>\n\n<<< E <<<", "E"), None);
        assert_eq!(accumulator_body(">>> E >>>\nx\n<<< E <<<", "E"), Some("x"));
        assert_eq!(accumulator_body(">>> E >>>\n\n\n<<< E <<<", "E"), Some("\n"));
        assert_eq!(accumulator_body(">>> E >>>['a']\n<<< E <<<", "E"), None);
        assert_eq!(accumulator_body(">>> E >>>\n['a']", "E"), None);
    }
}
