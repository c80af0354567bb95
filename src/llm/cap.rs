//! The cap on a hint's length (`llm.max_hint_chars`): a longer text is cut at
//! a sentence boundary, else a word boundary, else a character.

/// A cut that keeps less than this share of the cap looks for a shorter
/// unit: a sentence boundary nearer the start than half the cap gives way
/// to a word boundary, and a word boundary there to a plain character cut.
const MIN_KEPT_SHARE: usize = 2;

/// `text` cut to at most `max_chars` characters, and whether it was cut.
/// The cut falls after the last sentence end (`.`, `!`, `?` or `…`, with
/// closing quotes or brackets, followed by whitespace; or a line break)
/// within the cap; when that would keep less than half the cap, after the
/// last word (before whitespace); when that too would keep less than half,
/// at `max_chars` characters. Trailing whitespace of a cut text is dropped.
pub fn cap_hint(text: String, max_chars: usize) -> (String, bool) {
    let Some((limit, _)) = text.char_indices().nth(max_chars) else {
        return (text, false);
    };
    let floor = text
        .char_indices()
        .nth(max_chars / MIN_KEPT_SHARE)
        .map_or(limit, |(i, _)| i);
    let end = sentence_end(&text, limit)
        .filter(|&e| e >= floor)
        .or_else(|| word_end(&text, limit).filter(|&e| e >= floor))
        .unwrap_or(limit);
    (text[..end].trim_end().to_string(), true)
}

/// The byte end of the last whole sentence of `text[..limit]`.
fn sentence_end(text: &str, limit: usize) -> Option<usize> {
    let head = &text[..limit];
    let mut best = None;
    let mut chars = head.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            best = Some(i);
            continue;
        }
        if !matches!(c, '.' | '!' | '?' | '…') {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, close)) = chars.peek() {
            if !matches!(close, '"' | '\'' | ')' | ']' | '”' | '’') {
                break;
            }
            end = j + close.len_utf8();
            chars.next();
        }
        // The sentence ends where whitespace follows (in the whole text:
        // the cut may fall right after it).
        if text[end..].chars().next().is_some_and(char::is_whitespace) {
            best = Some(end);
        }
    }
    best
}

/// The byte end of the last whole word of `text[..limit]`.
fn word_end(text: &str, limit: usize) -> Option<usize> {
    let head = &text[..limit];
    if text[limit..].chars().next().is_some_and(char::is_whitespace) {
        return Some(limit);
    }
    head.char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace())
        .map(|(i, _)| i)
        .filter(|&i| i > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(text: &str, max: usize) -> (String, bool) {
        cap_hint(text.to_string(), max)
    }

    #[test]
    fn a_hint_within_the_cap_is_kept_whole() {
        assert_eq!(cap("Run the test.", 13), ("Run the test.".into(), false));
        assert_eq!(cap("", 5), (String::new(), false));
    }

    #[test]
    fn a_long_hint_is_cut_after_its_last_whole_sentence() {
        let text = "Read the spec. Then test the edge case! Finally run the suite again.";
        let (cut, truncated) = cap(text, 45);
        assert!(truncated);
        assert_eq!(cut, "Read the spec. Then test the edge case!");
        // Closing quotes stay with their sentence.
        let (cut, _) = cap("He said \"stop.\" Then he went on and on", 30);
        assert_eq!(cut, "He said \"stop.\"");
        // A decimal point is no sentence end.
        let (cut, _) = cap("Use 3.14 here. Then 2.71 there and more", 26);
        assert_eq!(cut, "Use 3.14 here.");
    }

    #[test]
    fn without_a_late_enough_sentence_end_the_cut_falls_between_words() {
        let text = "Short. then a very long run of words without any stop at all";
        let (cut, truncated) = cap(text, 40);
        assert!(truncated);
        assert_eq!(cut, "Short. then a very long run of words");
    }

    #[test]
    fn without_words_the_cut_falls_at_the_cap_on_a_char_boundary() {
        let text = "é".repeat(100);
        let (cut, truncated) = cap(&text, 10);
        assert!(truncated);
        assert_eq!(cut, "é".repeat(10));
        let (cut, _) = cap(&"a".repeat(1 << 20), 4000);
        assert_eq!(cut.len(), 4000);
    }
}
