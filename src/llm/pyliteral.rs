//! A parser for the Python list literals the verifier prints inside its
//! accumulator blocks (`['a', "b", ...]`): single and double quotes, escapes,
//! raw and byte prefixes, numbers, None/True/False and nested lists. Garbage
//! gives `None`, never a panic.

/// Deepest nesting accepted; deeper input is treated as garbage.
const MAX_DEPTH: usize = 32;

/// Parses `text` (surrounding whitespace allowed) as one Python list and
/// returns its items as strings: strings as their value, other items as their
/// literal text (nested lists rendered back in Python syntax).
pub fn parse_list(text: &str) -> Option<Vec<String>> {
    let text = text.trim();
    // Sized once (a char per byte at most): collected from `chars()`, whose
    // size hint is a quarter of the bytes, the vector grew a copy at a time,
    // on every message of stage 1.
    let mut chars = Vec::with_capacity(text.len());
    chars.extend(text.chars());
    let mut p = Parser { chars, pos: 0 };
    let Item::List(items) = p.list(0)? else {
        return None;
    };
    p.skip_ws();
    if p.pos != p.chars.len() {
        return None;
    }
    Some(items.into_iter().map(Item::into_text).collect())
}

enum Item {
    Str(String),
    Atom(String),
    List(Vec<Item>),
}

impl Item {
    fn into_text(self) -> String {
        match self {
            Item::Str(s) | Item::Atom(s) => s,
            Item::List(items) => {
                let inner: Vec<String> = items
                    .into_iter()
                    .map(|i| match i {
                        Item::Str(s) => python_repr(&s),
                        other => other.into_text(),
                    })
                    .collect();
                format!("[{}]", inner.join(", "))
            }
        }
    }
}

/// A string as Python's `repr` writes it: single quotes unless it holds a
/// single quote and no double one; backslash, the quote, \n, \r, \t and
/// other control characters escaped (at most 4 bytes for 1).
fn python_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn list(&mut self, depth: usize) -> Option<Item> {
        if depth > MAX_DEPTH || self.peek()? != '[' {
            return None;
        }
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            match self.peek()? {
                ']' => {
                    self.pos += 1;
                    return Some(Item::List(items));
                }
                _ => items.push(self.item(depth)?),
            }
            self.skip_ws();
            match self.peek()? {
                ',' => self.pos += 1,
                ']' => {}
                _ => return None,
            }
        }
    }

    fn item(&mut self, depth: usize) -> Option<Item> {
        match self.peek()? {
            '[' => self.list(depth + 1),
            '\'' | '"' => self.string(false).map(Item::Str),
            'r' | 'R' | 'b' | 'B' | 'u' | 'U' if matches!(self.chars.get(self.pos + 1), Some('\'' | '"')) => {
                let raw = matches!(self.peek(), Some('r' | 'R'));
                self.pos += 1;
                self.string(raw).map(Item::Str)
            }
            _ => self.atom(),
        }
    }

    fn string(&mut self, raw: bool) -> Option<String> {
        let quote = self.peek()?;
        self.pos += 1;
        // Sized to the characters up to the next quote of its kind (the
        // string's length when it is ASCII without escapes): grown from
        // empty, a check's text cost three allocations and two copies.
        let up_to_quote = self.chars[self.pos..].iter().position(|&c| c == quote);
        let mut out = String::with_capacity(up_to_quote.unwrap_or(0));
        loop {
            let c = self.peek()?;
            self.pos += 1;
            match c {
                c if c == quote => return Some(out),
                '\\' if raw => {
                    out.push('\\');
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.pos += 1;
                    }
                }
                '\\' => {
                    let e = self.peek()?;
                    self.pos += 1;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        '\\' | '\'' | '"' => out.push(e),
                        '\n' => {}
                        'x' => out.push(self.hex(2)?),
                        'u' => out.push(self.hex(4)?),
                        'U' => out.push(self.hex(8)?),
                        other => {
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn hex(&mut self, digits: usize) -> Option<char> {
        let text: String = self.chars.get(self.pos..self.pos + digits)?.iter().collect();
        self.pos += digits;
        char::from_u32(u32::from_str_radix(&text, 16).ok()?)
    }

    fn atom(&mut self) -> Option<Item> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
        {
            self.pos += 1;
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        let known = matches!(text.as_str(), "None" | "True" | "False") || text.parse::<f64>().is_ok();
        known.then_some(Item::Atom(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mixed_quotes_and_escapes() {
        let items = parse_list(r#"['a', "b's", 'it\'s', "tab\there", 'x\\y']"#).unwrap();
        assert_eq!(items, vec!["a", "b's", "it's", "tab\there", "x\\y"]);
    }

    #[test]
    fn parses_nested_lists_numbers_and_constants() {
        let items = parse_list("[1, -2.5e3, None, True, ['x', [2]], r'\\d+']").unwrap();
        assert_eq!(items, vec!["1", "-2.5e3", "None", "True", "['x', [2]]", "\\d+"]);
    }

    #[test]
    fn nested_strings_render_as_python_would() {
        let items = parse_list(r#"[["it's", 'a\\b', 'q"', '\x7f\n']]"#).unwrap();
        assert_eq!(items, vec![r#"["it's", 'a\\b', 'q"', '\x7f\n']"#]);
    }

    #[test]
    fn nested_rendering_grows_at_most_four_times() {
        // Found by the pyliteral fuzz target: Rust's `{:?}` wrote DEL as
        // `\u{7f}`, 8 bytes for 1.
        let text = include_str!("../../fuzz/regressions/pyliteral-nested-repr-growth.txt");
        let items = parse_list(text).unwrap();
        assert!(items.iter().map(String::len).sum::<usize>() <= text.len() * 4);
    }

    #[test]
    fn parses_empty_and_trailing_comma() {
        assert_eq!(parse_list("  [] "), Some(vec![]));
        assert_eq!(parse_list("['a',]"), Some(vec!["a".to_string()]));
    }

    #[test]
    fn garbage_gives_none() {
        for text in [
            "",
            "[",
            "['a'",
            "['a' 'b']",
            "hello",
            "[foo]",
            "['a'] trailing",
            "[[[[",
            "['\\x4']",
            &"[".repeat(100_000),
        ] {
            assert_eq!(parse_list(text), None, "{text:.40}");
        }
    }

    /// The vectors both languages read (`schemas/vectors/pyliteral.json`;
    /// python/tests/test_pyliteral.py holds the Python port to them).
    #[test]
    fn parse_list_gives_the_shared_vectors() {
        let vectors = crate::messages::vectors::shared("pyliteral.json");
        let cases = vectors["cases"].as_array().unwrap();
        assert!(cases.len() >= 50, "{} cases", cases.len());
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|case| {
                let source = case["source"].as_str().unwrap();
                let want: Option<Vec<String>> = serde_json::from_value(case["items"].clone()).unwrap();
                let got = parse_list(source);
                (got != want).then(|| format!("{}: {source:?}: want {want:?}, got {got:?}", case["case"]))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn never_panics_on_random_input() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let alphabet: Vec<char> = "[]'\"\\, abxuU0-9.Nn\n".chars().collect();
        for _ in 0..20_000 {
            let len = rng.random_range(0..40);
            let s: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let _ = parse_list(&s);
        }
    }
}
