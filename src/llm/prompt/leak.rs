//! The leak guard's reading of the verifier output: the values it presents
//! as expected, and whether a hint repeats one verbatim (issue 31, item 7).
//!
//! A value is a literal of at least [`MIN_LEAK_CHARS`] characters — a
//! quoted string (its text, without the quotes), a number, or a bracketed
//! list (brackets and all) — right after `expected`, `should be`, `==` or
//! `!=` (a `:`, `=` or spaces may stand between), in the accumulators
//! (failed and passed checks, whole) or the errors (the verifier's, the
//! tools'). A number counts only where no digit or letter touches it in
//! the hint, so `expected 100` is not found in `1000` or `100.5`.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::feedback::accumulator;
use crate::messages::FailedTrajectory;

/// The shortest value looked for: shorter ones (`0`, `ok`) are too common
/// to tell a leak from a coincidence.
pub const MIN_LEAK_CHARS: usize = 3;

/// The words after which a value is presented as expected (lower case).
const CUES: &[&str] = &["expected", "should be", "==", "!="];

/// The values `t`'s verifier output presents as expected, each once, in
/// the order found.
pub fn expected_values(t: &FailedTrajectory) -> Vec<String> {
    let stdout = t.verifier_stdout.as_deref().unwrap_or_default();
    let mut texts: Vec<String> = Vec::new();
    for name in ["ERROR_ACCUMULATOR", "SUCCESS_ACCUMULATOR"] {
        texts.extend(accumulator(stdout, name).unwrap_or_default());
    }
    texts.extend(t.verifier_error.iter().cloned());
    texts.extend(t.tool_error_messages.iter().flatten().cloned());
    let mut out: Vec<String> = Vec::new();
    for text in &texts {
        for value in values_in(text) {
            if !out.contains(&value) {
                out.push(value);
            }
        }
    }
    out
}

/// [`CUES`]' searchers, built once (`str::find` builds one a call).
static CUE_FINDERS: LazyLock<Vec<Finder<'static>>> = LazyLock::new(|| CUES.iter().map(Finder::new).collect());

/// The values `text` presents as expected.
pub fn values_in(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    for cue in CUE_FINDERS.iter() {
        let cue_len = cue.needle().len();
        let mut from = 0;
        while let Some(at) = cue.find(&lower.as_bytes()[from..]) {
            let after = from + at + cue_len;
            from = after;
            let rest = text[after..].trim_start_matches(|c: char| c.is_whitespace() || c == ':' || c == '=');
            if let Some(value) = literal(rest) {
                if value.chars().count() >= MIN_LEAK_CHARS {
                    out.push(value.to_string());
                }
            }
        }
    }
    out
}

/// The literal that starts `rest`: a quoted string's text, a bracketed
/// list with its brackets, or a number.
fn literal(rest: &str) -> Option<&str> {
    let first = rest.chars().next()?;
    match first {
        '\'' | '"' | '`' => {
            let body = &rest[1..];
            body.find(first).map(|end| &body[..end])
        }
        '[' | '(' | '{' => bracketed(rest),
        '-' | '+' | '0'..='9' => {
            let end = rest
                .char_indices()
                .skip(1)
                .find(|&(_, c)| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '_')))
                .map_or(rest.len(), |(i, _)| i);
            let number = rest[..end].trim_end_matches('.');
            number.chars().any(|c| c.is_ascii_digit()).then_some(number)
        }
        _ => None,
    }
}

/// The bracketed list that starts `rest`, nested brackets and quoted
/// strings inside included; `None` when it never closes.
fn bracketed(rest: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[..i + c.len_utf8()]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The first of `values` that `hint` repeats verbatim.
pub fn leaked<'a>(hint: &str, values: &'a [String]) -> Option<&'a str> {
    values
        .iter()
        .map(String::as_str)
        .find(|value| repeats(hint, value))
}

/// Every one of `values` that `hint` repeats verbatim, in their order.
pub fn repeated(hint: &str, values: &[String]) -> Vec<String> {
    values
        .iter()
        .filter(|value| repeats(hint, value))
        .cloned()
        .collect()
}

/// What stands for a value taken out of a hint by [`withhold`].
pub const WITHHELD: &str = "[withheld]";

/// `hint` with every verbatim repeat of `values` (by the rule of
/// [`leaked`]) replaced by [`WITHHELD`], the longest values first, so that
/// the result repeats none of them.
pub fn withhold(hint: &str, values: &[String]) -> String {
    let mut sorted: Vec<&String> = values.iter().collect();
    sorted.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut out = hint.to_string();
    for value in sorted {
        // Each pass takes out the first repeat; a repeat cannot come back,
        // since `WITHHELD` holds neither digits nor a value's other text.
        while let Some(at) = first_repeat(&out, value) {
            out.replace_range(at..at + value.len(), WITHHELD);
        }
    }
    out
}

/// Whether `hint` holds `value`; a number only where no letter or digit
/// touches it, nor a `.` before it or a `.` and a digit after it (a
/// sentence may end with it).
fn repeats(hint: &str, value: &str) -> bool {
    first_repeat(hint, value).is_some()
}

/// Where `hint` first holds `value` by the rule of [`repeats`].
fn first_repeat(hint: &str, value: &str) -> Option<usize> {
    let numeric = value.chars().all(|c| c.is_ascii_digit() || "+-.eE_".contains(c));
    if !numeric {
        return hint.find(value);
    }
    hint.match_indices(value).map(|(i, _)| i).find(|&i| {
        let before = hint[..i].chars().next_back();
        let mut after = hint[i + value.len()..].chars();
        let touched_before = before.is_some_and(|c| c.is_alphanumeric() || c == '.');
        let touched_after = match after.next() {
            Some('.') => after.next().is_some_and(|c| c.is_ascii_digit()),
            next => next.is_some_and(char::is_alphanumeric),
        };
        !touched_before && !touched_after
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(stdout: &str, error: Option<&str>) -> FailedTrajectory {
        serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
            "task_prompt": "Sort it", "chat_history": [], "reward": 0.0,
            "verifier_stdout": stdout, "verifier_error": error,
            "tool_error_messages": ["bash: expected: 'abc-tool'"]
        }))
        .unwrap()
    }

    #[test]
    fn finds_the_values_after_each_cue_in_the_accumulators_and_errors() {
        let t = trajectory(
            ">>> ERROR_ACCUMULATOR >>>\n['test_sort: expected [1, 2, 3], got [3, 2, 1]', \"name should be 'Ada Lovelace'\"]\n<<< ERROR_ACCUMULATOR <<<\n>>> SUCCESS_ACCUMULATOR >>>\n['len(x) == 1234']\n<<< SUCCESS_ACCUMULATOR <<<",
            Some("AssertionError: assert f(2) != -0.5 and Expected: {'a': [1, (2, ']')]}"),
        );
        assert_eq!(
            expected_values(&t),
            vec![
                "[1, 2, 3]",
                "Ada Lovelace",
                "1234",
                "{'a': [1, (2, ']')]}",
                "-0.5",
                "abc-tool"
            ]
        );
    }

    #[test]
    fn short_unclosed_and_wordy_values_are_not_values() {
        for text in [
            "expected 42",
            "expected 'ab'",
            "expected [1,",
            "expected a list",
            "expected 'unclosed",
            "== x",
        ] {
            assert_eq!(values_in(text), Vec::<String>::new(), "{text}");
        }
    }

    #[test]
    fn a_hint_that_repeats_a_value_verbatim_leaks_it() {
        let values = vec!["[1, 2, 3]".to_string(), "100".to_string()];
        assert_eq!(
            leaked("Return expected [1, 2, 3] from sort().", &values),
            Some("[1, 2, 3]")
        );
        assert_eq!(leaked("Return the list sorted ascending.", &values), None);
        assert_eq!(leaked("Use [1,2,3] as a test.", &values), None, "not verbatim");
        assert_eq!(leaked("Allow 1000 items.", &values), None, "a longer number");
        assert_eq!(leaked("Allow 100.5 items.", &values), None);
        assert_eq!(leaked("The limit is 100.", &values), Some("100"));
    }

    #[test]
    fn withholding_takes_out_every_repeat_and_nothing_else() {
        let values = vec!["[1, 2, 3]".to_string(), "100".to_string(), "1, 2".to_string()];
        let hint = "Return [1, 2, 3], not [1, 2, 3, 4]; allow 1000 items, at most 100. Then 1, 2.";
        assert_eq!(
            repeated(hint, &values),
            vec!["[1, 2, 3]".to_string(), "100".to_string(), "1, 2".to_string()]
        );
        let kept = withhold(hint, &values);
        assert_eq!(
            kept,
            "Return [withheld], not [[withheld], 3, 4]; allow 1000 items, at most [withheld]. Then [withheld]."
        );
        assert_eq!(leaked(&kept, &values), None);
        assert_eq!(withhold("Sort ascending.", &values), "Sort ascending.");
    }
}
