//! The verifier's feedback on a failed trajectory, parsed and bounded (its
//! accumulator blocks, its error, the tools' errors), and the static hint
//! built from it when there is no LLM answer.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use crate::llm::pyliteral::parse_list;
use crate::messages::FailedTrajectory;

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

/// The list printed between `>>> NAME >>>` and its closing line
/// `<<< NAME <<<` (or the end), parsed as a Python literal; `None` when the
/// block is absent or garbage. A `<<<` inside a check's text does not end it.
pub fn accumulator(stdout: &str, name: &str) -> Option<Vec<String>> {
    static OPEN: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(">>> "));
    static CLOSE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\n<<< "));
    let start = marked(stdout, &OPEN, name, " >>>")?.end;
    let rest = &stdout[start..];
    let body = marked(rest, &CLOSE, name, " <<<").map_or(rest, |end| &rest[..end.start]);
    parse_list(body)
}

/// Where `before` (an ASCII text), `name` and `after` first stand together
/// in `text` (the marker's bytes), without building the marker (this runs
/// on every message of stage 1, several times). `before`'s searcher is
/// built once: `str::find` builds one for its pattern at every call (1%
/// of stage 1's CPU on static hints, with the leak guard's cues).
fn marked(text: &str, before: &Finder<'_>, name: &str, after: &str) -> Option<std::ops::Range<usize>> {
    let before_len = before.needle().len();
    let mut from = 0;
    loop {
        let at = from + before.find(&text.as_bytes()[from..])?;
        let rest = &text[at + before_len..];
        if rest.strip_prefix(name).is_some_and(|r| r.starts_with(after)) {
            return Some(at..at + before_len + name.len() + after.len());
        }
        // Past the first byte of this candidate (ASCII: a char boundary).
        from = at + 1;
    }
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
    fn an_accumulator_ends_at_its_closing_line_not_at_the_first_angle_brackets() {
        let fb = feedback(&trajectory(
            ">>> ERROR_ACCUMULATOR >>>\n['expected <<< in output', 'b']\n<<< ERROR_ACCUMULATOR <<<",
        ));
        assert_eq!(fb.failed_checks, vec!["expected <<< in output", "b"]);
    }

    #[test]
    fn an_accumulator_is_found_past_markers_of_other_names_and_its_own_close_past_others() {
        let text = ">>> >>> X_OLD >>> <<< X <<<\n<<< X <<<";
        assert_eq!(marked(text, &Finder::new(">>> "), "X", " >>>"), None);
        assert_eq!(marked(text, &Finder::new("\n<<< "), "X", " <<<"), Some(27..37));
        assert_eq!(
            marked(">>> >>> X >>>", &Finder::new(">>> "), "X", " >>>"),
            Some(4..13)
        );
        let stdout = ">>> ERROR_ACCUMULATOR_OLD >>>\n['old']\n>>> ERROR_ACCUMULATOR >>>\n['new']\n<<< ERROR_ACCUMULATOR <<<";
        assert_eq!(
            accumulator(stdout, "ERROR_ACCUMULATOR"),
            Some(vec!["new".to_string()])
        );
        assert_eq!(accumulator(">>> ERROR_ACCUMULATOR >>", "ERROR_ACCUMULATOR"), None);
    }
}
