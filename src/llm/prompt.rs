//! The hint prompt, versioned: how a failed trajectory and its verifier
//! feedback are shown to the LLM, and the static hint built from the same
//! feedback when there is no LLM answer. Bounds follow the reference trainer:
//! the task's first 5,000 characters; the last 15 chat messages, 3,000
//! characters a message, 150,000 in all (a message that would pass that is
//! dropped whole, with every later one); verifier checks with their counts.

use std::collections::BTreeSet;

use crate::messages::{ChatContent, ChatMessage, FailedTrajectory};

use super::pyliteral::parse_list;

pub mod printable;
pub mod pyeval;
pub mod pyrepr;
pub mod reference;

pub use crate::config::{PromptVersion, UnknownPromptVersion, PROMPT_VERSION};

impl PromptVersion {
    /// The system prompt.
    pub fn system_prompt(self) -> &'static str {
        match self {
            PromptVersion::V2 => SYSTEM_PROMPT,
            PromptVersion::Reference => reference::SYSTEM_PROMPT,
        }
    }

    /// The user message for a failed trajectory.
    pub fn user_message(self, t: &FailedTrajectory) -> String {
        match self {
            PromptVersion::V2 => user_prompt(t, &feedback(t)),
            PromptVersion::Reference => reference::user_message(t),
        }
    }

    /// One message's content as this version shows it, before its cut to
    /// the version's characters per message (for `llm::fit`).
    pub fn content_text(self, content: &ChatContent) -> String {
        match self {
            PromptVersion::V2 => content_text(content),
            PromptVersion::Reference => reference::content_text(content),
        }
    }

    /// How many of the last messages this version shows.
    pub fn max_messages(self) -> usize {
        match self {
            PromptVersion::V2 => MAX_MESSAGES,
            PromptVersion::Reference => reference::MAX_MESSAGES,
        }
    }

    /// The characters one message's text may have before the version cuts it.
    pub fn max_message_chars(self) -> usize {
        match self {
            PromptVersion::V2 => MAX_MESSAGE_CHARS,
            PromptVersion::Reference => reference::MAX_MESSAGE_CHARS,
        }
    }

    /// The static hint when there is no LLM answer: ours, or the
    /// reference's `FleetTaskEnv.build_hint_text`.
    pub fn static_hint(self, t: &FailedTrajectory) -> String {
        match self {
            PromptVersion::V2 => static_hint(&feedback(t)),
            PromptVersion::Reference => reference::static_hint(t),
        }
    }
}

/// The system prompt of version [`PROMPT_VERSION`].
pub const SYSTEM_PROMPT: &str = "\
You coach an AI agent that just failed a task. You will see the task, the \
agent's recent conversation (tool calls and results included) and the \
verifier's feedback. Write 2-5 sentences of specific, actionable guidance for \
the agent's next attempt at the same task:
- refer to the exact actions or tool calls that went wrong and say what to do instead;
- if the agent ran out of turns, suggest how to reach the goal in fewer steps;
- if a tool was misused, explain how to use it correctly;
- do not restate the task, and do not say that the previous attempt failed.
Answer with the guidance only.";

/// Characters kept of the task prompt.
pub const MAX_TASK_CHARS: usize = 5_000;
/// Most chat messages shown, counted from the end.
pub const MAX_MESSAGES: usize = 15;
/// Characters kept of one message.
pub const MAX_MESSAGE_CHARS: usize = 3_000;
/// Characters of conversation shown in all.
pub const MAX_HISTORY_CHARS: usize = 150_000;
/// Characters kept of a tool call's input or a tool result.
pub const MAX_TOOL_CHARS: usize = 500;
/// Characters kept of a content block of another type.
pub const MAX_OTHER_BLOCK_CHARS: usize = 200;
/// Items kept of each accumulator list, and characters of each item.
pub const MAX_ACCUMULATOR_ITEMS: usize = 10;
pub const MAX_ACCUMULATOR_ITEM_CHARS: usize = 200;
/// Characters kept of the verifier error.
pub const MAX_VERIFIER_ERROR_CHARS: usize = 500;
/// Unique tool errors kept, and characters of each.
pub const MAX_TOOL_ERRORS: usize = 10;
pub const MAX_TOOL_ERROR_CHARS: usize = 300;

/// What the verifier said, parsed and bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifierFeedback {
    pub failed_checks: Vec<String>,
    pub passed_checks: Vec<String>,
    /// How many checks failed and passed, before the lists were bounded.
    pub failed_total: usize,
    pub passed_total: usize,
    pub verifier_error: Option<String>,
    pub tool_errors: Vec<String>,
}

/// Cuts `text` to `max` characters, marking the cut.
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((end, _)) => format!("{}...", &text[..end]),
    }
}

/// The bytes of the task section that starts a user message (`## Task`
/// and the task's text, up to the blank line before the next `## `
/// heading), when it starts with one. Both prompt versions open with it,
/// so the section depends on the task alone: a prompt cache breakpoint
/// after it matches every request for the same task.
pub fn task_section_len(user: &str) -> Option<usize> {
    const HEADING: &str = "## Task\n";
    if !user.starts_with(HEADING) {
        return None;
    }
    user[HEADING.len()..]
        .find("\n\n## ")
        .map(|end| HEADING.len() + end)
        .filter(|&end| end > HEADING.len())
}

/// The list printed between `>>> NAME >>>` and its closing line
/// `<<< NAME <<<` (or the end), parsed as a Python literal; `None` when the
/// block is absent or garbage. A `<<<` inside a check's text does not end it.
pub fn accumulator(stdout: &str, name: &str) -> Option<Vec<String>> {
    let marker = format!(">>> {name} >>>");
    let start = stdout.find(&marker)? + marker.len();
    let rest = &stdout[start..];
    let end_marker = format!("\n<<< {name} <<<");
    let body = rest.find(&end_marker).map_or(rest, |end| &rest[..end]);
    parse_list(body)
}

fn bounded(items: Vec<String>) -> Vec<String> {
    items
        .into_iter()
        .take(MAX_ACCUMULATOR_ITEMS)
        .map(|s| truncate_chars(&s, MAX_ACCUMULATOR_ITEM_CHARS))
        .collect()
}

/// Parses and bounds the verifier feedback of a trajectory.
pub fn feedback(t: &FailedTrajectory) -> VerifierFeedback {
    let stdout = t.verifier_stdout.as_deref().unwrap_or_default();
    let mut seen = BTreeSet::new();
    let tool_errors = t
        .tool_error_messages
        .iter()
        .flatten()
        .filter(|e| !e.trim().is_empty() && seen.insert(e.as_str()))
        .take(MAX_TOOL_ERRORS)
        .map(|e| truncate_chars(e, MAX_TOOL_ERROR_CHARS))
        .collect();
    let failed = accumulator(stdout, "ERROR_ACCUMULATOR").unwrap_or_default();
    let passed = accumulator(stdout, "SUCCESS_ACCUMULATOR").unwrap_or_default();
    VerifierFeedback {
        failed_total: failed.len(),
        passed_total: passed.len(),
        failed_checks: bounded(failed),
        passed_checks: bounded(passed),
        verifier_error: t
            .verifier_error
            .as_deref()
            .filter(|e| !e.trim().is_empty())
            .map(|e| truncate_chars(e, MAX_VERIFIER_ERROR_CHARS)),
        tool_errors,
    }
}

/// One message's content as prompt text.
fn content_text(content: &ChatContent) -> String {
    match content {
        ChatContent::Text(text) => text.clone(),
        ChatContent::Blocks(blocks) => blocks
            .iter()
            .map(|b| match b.kind.as_str() {
                "text" => b.str_field("text").unwrap_or_default().to_string(),
                "image_url" | "image" => "[image]".to_string(),
                "tool_use" => {
                    let input = b.fields.get("input").map(|v| v.to_string()).unwrap_or_default();
                    format!(
                        "[tool_use: {}({})]",
                        b.str_field("name").unwrap_or("?"),
                        truncate_chars(&input, MAX_TOOL_CHARS)
                    )
                }
                "tool_result" => {
                    let result = match b.fields.get("content") {
                        Some(serde_json::Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    format!("[tool_result: {}]", truncate_chars(&result, MAX_TOOL_CHARS))
                }
                _ => {
                    let mut whole = b.fields.clone();
                    whole.insert("type".into(), serde_json::Value::String(b.kind.clone()));
                    truncate_chars(
                        &serde_json::Value::Object(whole).to_string(),
                        MAX_OTHER_BLOCK_CHARS,
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// One message's text, cut to [`MAX_MESSAGE_CHARS`] with a marker that
/// says how long it was.
fn message_text(content: &ChatContent) -> String {
    let text = content_text(content);
    let chars = text.chars().count();
    if chars > MAX_MESSAGE_CHARS {
        let end = text
            .char_indices()
            .nth(MAX_MESSAGE_CHARS)
            .map_or(text.len(), |(i, _)| i);
        format!("{}... [truncated, {chars} chars total]", &text[..end])
    } else {
        text
    }
}

/// The last [`MAX_MESSAGES`] messages, each cut to [`MAX_MESSAGE_CHARS`]. A
/// message that would take the whole past [`MAX_HISTORY_CHARS`] is dropped
/// whole, with every later one, and a marker says so.
pub fn format_history(messages: &[ChatMessage]) -> String {
    let start = messages.len().saturating_sub(MAX_MESSAGES);
    let mut out = String::new();
    let mut total = 0usize;
    for message in &messages[start..] {
        let entry = format!("[{}]: {}\n", message.role, message_text(&message.content));
        let len = entry.chars().count();
        if total + len > MAX_HISTORY_CHARS {
            out.push_str(&format!(
                "... [trajectory truncated at {MAX_HISTORY_CHARS} chars]\n"
            ));
            break;
        }
        total += len;
        out.push_str(&entry);
    }
    out
}

/// The user message of the hint request.
pub fn user_prompt(t: &FailedTrajectory, fb: &VerifierFeedback) -> String {
    let mut p = String::new();
    p.push_str("## Task\n");
    p.push_str(&truncate_chars(&t.task_prompt, MAX_TASK_CHARS));
    p.push_str("\n\n## Conversation (most recent messages)\n");
    p.push_str(&format_history(&t.chat_history));
    p.push_str(&format!("\n## Outcome\nReward: {}\n", t.reward));
    if !fb.passed_checks.is_empty() {
        p.push_str(&format!("\nVerifier checks PASSED ({}):\n", fb.passed_total));
        fb.passed_checks
            .iter()
            .for_each(|c| p.push_str(&format!("- {c}\n")));
    }
    if !fb.failed_checks.is_empty() {
        p.push_str(&format!("\nVerifier checks FAILED ({}):\n", fb.failed_total));
        fb.failed_checks
            .iter()
            .for_each(|c| p.push_str(&format!("- {c}\n")));
    }
    if let Some(e) = &fb.verifier_error {
        p.push_str(&format!("\nVerifier error: {e}\n"));
    }
    if !fb.tool_errors.is_empty() {
        p.push_str("\nTool errors:\n");
        fb.tool_errors
            .iter()
            .for_each(|e| p.push_str(&format!("- {e}\n")));
    }
    p.push_str("\nWrite the guidance for the next attempt.");
    p
}

/// The hint used when no LLM answer is available: built from the same
/// feedback, naming the failed checks.
pub fn static_hint(fb: &VerifierFeedback) -> String {
    let mut parts = Vec::new();
    if !fb.failed_checks.is_empty() {
        parts.push(format!(
            "These checks failed last time: {}. Make each of them pass before you finish.",
            fb.failed_checks.join("; ")
        ));
    }
    if let Some(e) = &fb.verifier_error {
        parts.push(format!("The verifier reported: {e}."));
    }
    if !fb.tool_errors.is_empty() {
        parts.push(format!(
            "These tool calls returned errors: {}. Check the tool's arguments before calling it again.",
            fb.tool_errors.join("; ")
        ));
    }
    if !fb.passed_checks.is_empty() {
        parts.push(format!(
            "Keep what already worked: {}.",
            fb.passed_checks.join("; ")
        ));
    }
    if parts.is_empty() {
        parts.push(
            "Re-read the task requirements, verify each one explicitly with the tools before finishing, \
             and use fewer, more targeted steps."
                .to_string(),
        );
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::ContentBlock;

    fn trajectory(stdout: &str) -> FailedTrajectory {
        serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
            "task_prompt": "Fix the parser", "chat_history": [], "reward": 0.0,
            "verifier_stdout": stdout, "verifier_error": "AssertionError: boom",
            "tool_error_messages": ["bash: exit 1", "bash: exit 1", "edit: no such file"]
        }))
        .unwrap()
    }

    #[test]
    fn the_task_section_of_both_prompt_versions_is_found() {
        let t = trajectory("");
        for version in [PromptVersion::V2, PromptVersion::Reference] {
            let user = version.user_message(&t);
            let end = task_section_len(&user).unwrap();
            assert_eq!(&user[..end], "## Task\nFix the parser", "{version}");
        }
        assert_eq!(task_section_len("no heading"), None);
    }

    #[test]
    fn parses_accumulators_and_dedups_tool_errors() {
        let t = trajectory(
            "log\n>>> ERROR_ACCUMULATOR >>>\n['test_a failed', \"test_b: expected 'x'\"]\n<<< ERROR_ACCUMULATOR <<<\n>>> SUCCESS_ACCUMULATOR >>>\n['test_c']\n<<< SUCCESS_ACCUMULATOR <<<",
        );
        let fb = feedback(&t);
        assert_eq!(fb.failed_checks, vec!["test_a failed", "test_b: expected 'x'"]);
        assert_eq!(fb.passed_checks, vec!["test_c"]);
        assert_eq!(fb.tool_errors, vec!["bash: exit 1", "edit: no such file"]);
        let hint = static_hint(&fb);
        assert!(
            hint.contains("test_a failed") && hint.contains("test_b: expected 'x'"),
            "{hint}"
        );
    }

    #[test]
    fn garbage_accumulator_gives_no_checks() {
        let fb = feedback(&trajectory(">>> ERROR_ACCUMULATOR >>>\n['unterminated\n"));
        assert!(fb.failed_checks.is_empty());
        assert!(static_hint(&fb).contains("AssertionError: boom"));
    }

    #[test]
    fn bounds_accumulator_items() {
        let items: Vec<String> = (0..30).map(|i| format!("'{}{}'", i, "x".repeat(500))).collect();
        let fb = feedback(&trajectory(&format!(
            ">>> ERROR_ACCUMULATOR >>>[{}]",
            items.join(",")
        )));
        assert_eq!(fb.failed_checks.len(), MAX_ACCUMULATOR_ITEMS);
        assert!(fb
            .failed_checks
            .iter()
            .all(|c| c.chars().count() <= MAX_ACCUMULATOR_ITEM_CHARS + 3));
    }

    #[test]
    fn formats_blocks_and_keeps_the_last_messages() {
        let block = |v: serde_json::Value| -> ContentBlock { serde_json::from_value(v).unwrap() };
        let mut history: Vec<ChatMessage> = (0..20)
            .map(|i| ChatMessage {
                role: "user".into(),
                content: ChatContent::Text(format!("message {i}")),
            })
            .collect();
        history.push(ChatMessage {
            role: "assistant".into(),
            content: ChatContent::Blocks(vec![
                block(serde_json::json!({"type": "image_url", "image_url": {"url": "data:..."}})),
                block(serde_json::json!({"type": "tool_use", "name": "bash", "input": {"cmd": "x".repeat(900)}})),
                block(serde_json::json!({"type": "tool_result", "content": "y".repeat(900)})),
                block(serde_json::json!({"type": "thinking", "thinking": "z".repeat(900)})),
            ]),
        });
        let text = format_history(&history);
        assert!(!text.contains("message 5\n") && text.contains("message 6\n") && text.contains("message 19"));
        assert!(text.contains("[image]") && text.contains("[tool_use: bash("));
        let tool_result = text.lines().find(|l| l.starts_with("[tool_result: ")).unwrap();
        assert!(tool_result.chars().count() <= "[tool_result: ]".len() + MAX_TOOL_CHARS + 3);
        let other = text.lines().find(|l| l.contains("thinking")).unwrap();
        assert!(other.chars().count() <= MAX_OTHER_BLOCK_CHARS + 3);
    }

    #[test]
    fn an_accumulator_ends_at_its_closing_line_not_at_the_first_angle_brackets() {
        let fb = feedback(&trajectory(
            ">>> ERROR_ACCUMULATOR >>>\n['expected <<< in output', 'b']\n<<< ERROR_ACCUMULATOR <<<",
        ));
        assert_eq!(fb.failed_checks, vec!["expected <<< in output", "b"]);
    }

    #[test]
    fn the_prompt_counts_checks_before_bounding_them() {
        let items: Vec<String> = (0..12).map(|i| format!("'c{i}'")).collect();
        let t = trajectory(&format!(
            ">>> ERROR_ACCUMULATOR >>>\n[{}]\n<<< ERROR_ACCUMULATOR <<<\n>>> SUCCESS_ACCUMULATOR >>>\n['ok']\n<<< SUCCESS_ACCUMULATOR <<<",
            items.join(", ")
        ));
        let fb = feedback(&t);
        let prompt = user_prompt(&t, &fb);
        assert!(prompt.contains("Verifier checks FAILED (12):"), "{prompt}");
        assert!(prompt.contains("Verifier checks PASSED (1):"), "{prompt}");
        assert_eq!(prompt.matches("\n- c").count(), MAX_ACCUMULATOR_ITEMS);
    }

    #[test]
    fn the_task_keeps_5000_characters() {
        let mut t = trajectory("");
        t.task_prompt = format!("{}END", "t".repeat(4_997));
        assert!(user_prompt(&t, &VerifierFeedback::default()).contains("tEND"));
        t.task_prompt = format!("{}END", "t".repeat(5_000));
        assert!(!user_prompt(&t, &VerifierFeedback::default()).contains("END"));
    }

    #[test]
    fn a_message_past_the_history_budget_is_dropped_whole() {
        let message = |text: String| ChatMessage {
            role: "user".into(),
            content: ChatContent::Text(text),
        };
        // A role so long that the second message cannot fit whole.
        let long_role = ChatMessage {
            role: "r".repeat(100_000),
            content: ChatContent::Text("short".into()),
        };
        let text = format_history(&[
            message("first".into()),
            long_role.clone(),
            long_role,
            message("last".into()),
        ]);
        assert!(text.contains("first"));
        assert!(text.contains("... [trajectory truncated at 150000 chars]"));
        assert!(!text.contains("last"), "every later message goes too");
        assert_eq!(
            text.matches("short").count(),
            1,
            "no message is cut in the middle"
        );
    }

    #[test]
    fn caps_each_message_and_the_whole_history() {
        let long = ChatMessage {
            role: "user".into(),
            content: ChatContent::Text("a".repeat(50_000)),
        };
        let text = format_history(&vec![long; 15]);
        assert!(text.chars().count() <= 15 * (MAX_MESSAGE_CHARS + 50));
        let prompt = user_prompt(&trajectory(""), &VerifierFeedback::default());
        assert!(prompt.contains("Fix the parser"));
    }
}
