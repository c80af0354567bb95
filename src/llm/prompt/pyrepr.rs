//! Python values and their `str()` / `repr()` text, as CPython 3.12 writes
//! them: what the reference prompt shows of content blocks (JSON values,
//! through [`PyValue::from_json`]) and of verifier checks (Python literals,
//! through `pyeval`).
//!
//! Faithful for `None`, `True`/`False`, ints of any size, floats (shortest
//! round-trip digits, `1e+16`, `1e-05`, `inf`), complex numbers, str (quote
//! choice, escapes, and `str.isprintable()` from Unicode 15.0.0), bytes,
//! lists, tuples, dicts (in insertion order), `Ellipsis`. Limits: a set is
//! written in first-seen order, where CPython follows its hash table (for
//! strings, a different order in every process: the reference has no fixed
//! text for them either); an int past 4,300 digits is written whole, where
//! CPython's `str()` raises.

use crate::messages::OrderedJson;

use super::printable::is_printable;

/// A Python value of the kinds JSON and `ast.literal_eval` produce.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    /// An int that fits in 128 bits.
    Int(i128),
    /// A larger int: its sign and decimal digits (no leading zeros).
    BigInt {
        negative: bool,
        digits: String,
    },
    Float(f64),
    Complex {
        re: f64,
        im: f64,
    },
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    /// Elements in first-seen order (see the module's limits).
    Set(Vec<PyValue>),
    /// Entries in insertion order, keys unique.
    Dict(Vec<(PyValue, PyValue)>),
    Ellipsis,
}

impl PyValue {
    /// The value Python's `json.loads` gives for a JSON value.
    pub fn from_json(value: &OrderedJson) -> PyValue {
        match value {
            OrderedJson::Null => PyValue::None,
            OrderedJson::Bool(b) => PyValue::Bool(*b),
            OrderedJson::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => PyValue::Int(i.into()),
                (_, Some(u), _) => PyValue::Int(u.into()),
                (_, _, f) => PyValue::Float(f.unwrap_or(f64::NAN)),
            },
            OrderedJson::String(s) => PyValue::Str(s.clone()),
            OrderedJson::Array(items) => PyValue::List(items.iter().map(PyValue::from_json).collect()),
            OrderedJson::Object(entries) => PyValue::Dict(
                entries
                    .iter()
                    .map(|(k, v)| (PyValue::Str(k.clone()), PyValue::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Python's `bool(value)`.
    pub fn truthy(&self) -> bool {
        match self {
            PyValue::None => false,
            PyValue::Bool(b) => *b,
            PyValue::Int(i) => *i != 0,
            PyValue::BigInt { .. } | PyValue::Ellipsis => true,
            PyValue::Float(f) => *f != 0.0,
            PyValue::Complex { re, im } => *re != 0.0 || *im != 0.0,
            PyValue::Str(s) => !s.is_empty(),
            PyValue::Bytes(b) => !b.is_empty(),
            PyValue::List(v) | PyValue::Tuple(v) | PyValue::Set(v) => !v.is_empty(),
            PyValue::Dict(v) => !v.is_empty(),
        }
    }

    /// Python's `str(value)`: a str is itself, anything else its repr.
    pub fn to_py_str(&self) -> String {
        match self {
            PyValue::Str(s) => s.clone(),
            other => other.to_py_repr(),
        }
    }

    /// Python's `repr(value)`.
    pub fn to_py_repr(&self) -> String {
        let mut out = String::new();
        write_repr(self, &mut out);
        out
    }
}

fn write_repr(value: &PyValue, out: &mut String) {
    match value {
        PyValue::None => out.push_str("None"),
        PyValue::Bool(true) => out.push_str("True"),
        PyValue::Bool(false) => out.push_str("False"),
        PyValue::Int(i) => out.push_str(&i.to_string()),
        PyValue::BigInt { negative, digits } => {
            if *negative {
                out.push('-');
            }
            out.push_str(digits);
        }
        PyValue::Float(f) => out.push_str(&float_repr(*f)),
        PyValue::Complex { re, im } => out.push_str(&complex_repr(*re, *im)),
        PyValue::Str(s) => str_repr(s, out),
        PyValue::Bytes(b) => bytes_repr(b, out),
        PyValue::Ellipsis => out.push_str("Ellipsis"),
        PyValue::List(items) => write_seq(items, "[", "]", out),
        PyValue::Tuple(items) if items.len() == 1 => {
            out.push('(');
            write_repr(&items[0], out);
            out.push_str(",)");
        }
        PyValue::Tuple(items) => write_seq(items, "(", ")", out),
        PyValue::Set(items) if items.is_empty() => out.push_str("set()"),
        PyValue::Set(items) => write_seq(items, "{", "}", out),
        PyValue::Dict(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(k, out);
                out.push_str(": ");
                write_repr(v, out);
            }
            out.push('}');
        }
    }
}

fn write_seq(items: &[PyValue], open: &str, close: &str, out: &mut String) {
    out.push_str(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_repr(item, out);
    }
    out.push_str(close);
}

/// The quote Python picks: `'` unless the text has a `'` and no `"`.
fn quote_for(has_single: bool, has_double: bool) -> char {
    if has_single && !has_double {
        '"'
    } else {
        '\''
    }
}

/// `repr()` of a str.
fn str_repr(s: &str, out: &mut String) {
    let quote = quote_for(s.contains('\''), s.contains('"'));
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_ascii() || is_printable(c) => out.push(c),
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
}

/// `repr()` of a bytes object.
fn bytes_repr(b: &[u8], out: &mut String) {
    let quote = quote_for(b.contains(&b'\''), b.contains(&b'"'));
    out.push('b');
    out.push(quote);
    for &byte in b {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            c if char::from(c) == quote => {
                out.push('\\');
                out.push(c as char);
            }
            c if !(0x20..0x7f).contains(&c) => out.push_str(&format!("\\x{c:02x}")),
            c => out.push(c as char),
        }
    }
    out.push(quote);
}

/// The shortest round-trip decimal digits of a finite, non-zero `|f|` and
/// the decimal exponent of the first digit: 1234.5 is ("12345", 3).
fn shortest_digits(f: f64) -> (String, i32) {
    // Rust's `{:e}` writes the shortest digits that read back as `f`, the
    // same digits as Python's repr (both are correctly rounded shortest).
    let text = format!("{:e}", f.abs());
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    (digits, exponent.parse().unwrap_or(0))
}

/// Python's `format(f, 'r')`: repr's digits and layout, with `.0` added to
/// an integral value in fixed notation when `dot_zero`.
fn format_r(f: f64, dot_zero: bool) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f.is_infinite() {
        return format!("{sign}inf");
    }
    if f == 0.0 {
        return format!("{sign}0{}", if dot_zero { ".0" } else { "" });
    }
    let (digits, exp) = shortest_digits(f);
    if (-4..16).contains(&exp) {
        let mut text = String::from(sign);
        if exp < 0 {
            text.push_str("0.");
            text.push_str(&"0".repeat((-exp - 1) as usize));
            text.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                text.push_str(&digits);
                text.push_str(&"0".repeat(int_len - digits.len()));
                if dot_zero {
                    text.push_str(".0");
                }
            } else {
                text.push_str(&digits[..int_len]);
                text.push('.');
                text.push_str(&digits[int_len..]);
            }
        }
        text
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}e{exp_sign}{:02}", exp.abs())
    }
}

/// Python's `repr(float)`.
pub fn float_repr(f: f64) -> String {
    format_r(f, true)
}

/// Python's `repr(complex)`.
pub fn complex_repr(re: f64, im: f64) -> String {
    if re == 0.0 && re.is_sign_positive() {
        return format!("{}j", format_r(im, false));
    }
    let im_text = format_r(im, false);
    let im_signed = if im_text.starts_with('-') {
        im_text
    } else {
        format!("+{im_text}")
    };
    format!("({}{im_signed}j)", format_r(re, false))
}

/// The first `n` characters (code points) of `s`, as Python's `s[:n]`.
pub fn take_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> PyValue {
        PyValue::from_json(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn json_values_render_as_python_str_does() {
        assert_eq!(
            json(r#"{"cmd": "ls -la", "flags": [true, false, null], "n": 3, "x": 1.0}"#).to_py_str(),
            "{'cmd': 'ls -la', 'flags': [True, False, None], 'n': 3, 'x': 1.0}"
        );
        assert_eq!(json(r#""plain""#).to_py_str(), "plain");
        assert_eq!(
            json(r#"["it's", "say \"hi\"", "both ' \"", "tab\t\\"]"#).to_py_str(),
            r#"["it's", 'say "hi"', 'both \' "', 'tab\t\\']"#
        );
        assert_eq!(json(r#"{"z": {}, "a": []}"#).to_py_str(), "{'z': {}, 'a': []}");
    }

    #[test]
    fn non_printable_characters_are_escaped_and_the_rest_kept() {
        let s = "\u{0}\u{1f}\u{7f}\u{80}\u{a0}\u{ad}é\u{2028}\u{200b}\u{e000}\u{e0001}😀日本";
        assert_eq!(
            PyValue::Str(s.into()).to_py_repr(),
            r"'\x00\x1f\x7f\x80\xa0\xadé\u2028\u200b\ue000\U000e0001😀日本'"
        );
    }

    #[test]
    fn floats_use_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123_456_789.123_456_79, "123456789.12345679"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e22, "1e+22"),
            (12345678901234567890.0, "1.2345678901234567e+19"),
            (9999999999999998.0, "9999999999999998.0"),
            (f64::INFINITY, "inf"),
            (-2.5, "-2.5"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:?}");
        }
    }

    #[test]
    fn complex_numbers_use_python_repr() {
        assert_eq!(complex_repr(0.0, 1.0), "1j");
        assert_eq!(complex_repr(-0.0, -1.0), "(-0-1j)");
        assert_eq!(complex_repr(1.0, 2.0), "(1+2j)");
        assert_eq!(complex_repr(1.0, 0.0), "(1+0j)");
        assert_eq!(complex_repr(0.0, 1e16), "1e+16j");
        assert_eq!(complex_repr(2.5, 1e-5), "(2.5+1e-05j)");
    }

    #[test]
    fn containers_and_bytes_use_python_repr() {
        let v = PyValue::List(vec![
            PyValue::Tuple(vec![PyValue::Int(1)]),
            PyValue::Tuple(vec![]),
            PyValue::Set(vec![]),
            PyValue::Set(vec![PyValue::Int(2)]),
            PyValue::Bytes(b"\x00\x7f\x80'".to_vec()),
            PyValue::Bytes(b"'\"".to_vec()),
            PyValue::Ellipsis,
        ]);
        assert_eq!(
            v.to_py_repr(),
            r#"[(1,), (), set(), {2}, b"\x00\x7f\x80'", b'\'"', Ellipsis]"#
        );
    }

    #[test]
    fn take_chars_counts_code_points() {
        assert_eq!(take_chars("héllo😀x", 6), "héllo😀");
        assert_eq!(take_chars("ab", 5), "ab");
    }
}
