//! Python's `ast.literal_eval` on a string, as CPython 3.12 runs it: what the
//! reference does with the verifier's accumulator blocks. Accepted: str and
//! bytes literals (every prefix but `f`, every escape but `\N{...}`, implicit
//! concatenation), ints (decimal, hex, octal, binary, `_`), floats,
//! imaginary numbers, one unary `+`/`-` on a number, `real ± imaginary`,
//! tuples, lists, dicts, sets, `set()`, `True`, `False`, `None`, `...`, with
//! Python's rules for comments, line continuations, blank lines, indentation
//! and nesting (at most 200 brackets deep). Whatever Python refuses (a
//! syntax error, a name, a call, an operator, an unhashable key) is an
//! error here.
//!
//! Limits: `\N{NAME}` escapes are refused (Python accepts known names); a
//! lone surrogate (`\ud800`) becomes U+FFFD, which Rust strings cannot hold.

use super::pyrepr::PyValue;

/// Why a text is not a Python literal (the reference catches every such
/// error alike).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a Python literal: {0}")]
pub struct NotALiteral(pub &'static str);

type Parsed<T> = Result<T, NotALiteral>;

/// Brackets open at once that Python's tokenizer accepts (`MAXLEVEL`).
pub const MAX_NESTING: usize = 200;

/// Decimal digits of an int literal that Python 3.12 converts
/// (`sys.get_int_max_str_digits()`): a longer decimal literal is a syntax error.
pub const MAX_INT_DIGITS: usize = 4_300;

/// `ast.literal_eval(source)`.
pub fn literal_eval(source: &str) -> Parsed<PyValue> {
    if source.contains('\0') {
        return Err(NotALiteral("null byte"));
    }
    let source = source.trim_start_matches([' ', '\t']);
    let text: Vec<char> = translate_newlines(source);
    let mut p = Parser {
        s: &text,
        i: 0,
        depth: 0,
    };
    p.skip_leading_lines()?;
    let value = p.top_level()?;
    p.expect_end()?;
    Ok(value)
}

/// `\r\n` and a lone `\r` read as `\n`, as Python's tokenizer reads them.
fn translate_newlines(source: &str) -> Vec<char> {
    let mut out = Vec::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    out
}

/// How an expression was written: literal_eval treats these differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// A constant (a number, string, `True`, ...), perhaps in parentheses.
    Constant,
    /// `+` or `-` applied to a numeric constant.
    Signed,
    /// `real ± imaginary`.
    Sum,
    /// A container.
    Other,
}

struct Parser<'a> {
    s: &'a [char],
    i: usize,
    depth: usize,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || !c.is_ascii()
}

fn is_number(v: &PyValue) -> bool {
    matches!(
        v,
        PyValue::Int(_) | PyValue::BigInt { .. } | PyValue::Float(_) | PyValue::Complex { .. }
    )
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    /// Skips what separates tokens: blanks, comments, line continuations,
    /// and newlines inside brackets. A newline outside brackets ends the
    /// expression and is left in place.
    fn skip_trivia(&mut self) -> Parsed<()> {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\x0c' => self.i += 1,
                '\n' if self.depth > 0 => self.i += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '\\' => {
                    if self.peek_at(1) != Some('\n') {
                        return Err(NotALiteral("a character after a line continuation"));
                    }
                    self.i += 2;
                    if self.peek().is_none() {
                        return Err(NotALiteral("end of input after a line continuation"));
                    }
                }
                _ => break,
            }
        }
        Ok(())
    }

    /// Blank and comment lines before the expression; its first line may
    /// not be indented.
    fn skip_leading_lines(&mut self) -> Parsed<()> {
        loop {
            let mut indented = false;
            while let Some(c) = self.peek() {
                match c {
                    ' ' | '\t' => indented = true,
                    '\x0c' => indented = false,
                    _ => break,
                }
                self.i += 1;
            }
            match self.peek() {
                Some('#') => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                Some('\\') if !indented => {
                    // A line continuation: the next line goes on this one.
                    self.skip_trivia()?;
                    if self.peek() != Some('\n') {
                        return Ok(());
                    }
                }
                Some('\n') => {}
                None => return Err(NotALiteral("no expression")),
                Some(_) if indented => return Err(NotALiteral("unexpected indent")),
                Some(_) => return Ok(()),
            }
            if self.peek() == Some('\n') {
                self.i += 1;
            }
        }
    }

    /// After the expression: only blank or comment lines; a last line of
    /// blanks alone is an "unexpected indent", as in Python.
    fn expect_end(&mut self) -> Parsed<()> {
        self.skip_trivia()?;
        match self.peek() {
            None => return Ok(()),
            Some('\n') => self.i += 1,
            Some(_) => return Err(NotALiteral("text after the expression")),
        }
        loop {
            let mut indented = false;
            while let Some(c) = self.peek() {
                match c {
                    ' ' | '\t' => indented = true,
                    '\x0c' => indented = false,
                    _ => break,
                }
                self.i += 1;
            }
            match self.peek() {
                None if indented => return Err(NotALiteral("unexpected indent")),
                None => return Ok(()),
                Some('#') => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                Some('\n') => {}
                Some(_) => return Err(NotALiteral("a second statement")),
            }
            if self.peek() == Some('\n') {
                self.i += 1;
            } else {
                return Ok(());
            }
        }
    }

    /// The expression: one item, or a tuple without parentheses (`1, 2`).
    fn top_level(&mut self) -> Parsed<PyValue> {
        let (first, _) = self.item()?;
        self.skip_trivia()?;
        if self.peek() != Some(',') {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.peek() == Some(',') {
            self.i += 1;
            self.skip_trivia()?;
            if matches!(self.peek(), None | Some('\n')) {
                break;
            }
            items.push(self.item()?.0);
            self.skip_trivia()?;
        }
        Ok(PyValue::Tuple(items))
    }

    /// One element: a signed atom, or `real ± imaginary`.
    fn item(&mut self) -> Parsed<(PyValue, Form)> {
        let (left, form) = self.unary()?;
        self.skip_trivia()?;
        let op = match self.peek() {
            Some(c @ ('+' | '-')) => c,
            _ => return Ok((left, form)),
        };
        self.i += 1;
        self.skip_trivia()?;
        let (right, right_form) = self.atom()?;
        let left_ok = matches!(form, Form::Constant | Form::Signed)
            && matches!(left, PyValue::Int(_) | PyValue::BigInt { .. } | PyValue::Float(_));
        let (PyValue::Complex { re, im }, Form::Constant, true) = (&right, right_form, left_ok) else {
            return Err(NotALiteral("an operator other than real +/- imaginary"));
        };
        let l = as_f64(&left);
        let value = if op == '+' {
            PyValue::Complex {
                re: l + re,
                im: 0.0 + im,
            }
        } else {
            PyValue::Complex {
                re: l - re,
                im: 0.0 - im,
            }
        };
        Ok((value, Form::Sum))
    }

    fn unary(&mut self) -> Parsed<(PyValue, Form)> {
        let op = match self.peek() {
            Some(c @ ('+' | '-')) => c,
            Some('~') => return Err(NotALiteral("the ~ operator")),
            _ => return self.atom(),
        };
        self.i += 1;
        self.skip_trivia()?;
        let (operand, form) = self.unary()?;
        if form != Form::Constant || !is_number(&operand) {
            return Err(NotALiteral("a sign on something other than a number"));
        }
        let value = if op == '+' { operand } else { negate(operand) };
        Ok((value, Form::Signed))
    }

    fn atom(&mut self) -> Parsed<(PyValue, Form)> {
        let c = self.peek().ok_or(NotALiteral("unexpected end"))?;
        let (value, form) = match c {
            '(' | '[' | '{' => self.bracketed(c)?,
            '\'' | '"' => (self.strings(String::new())?, Form::Constant),
            '0'..='9' => (self.number()?, Form::Constant),
            '.' if self.peek_at(1).is_some_and(|c| c.is_ascii_digit()) => (self.number()?, Form::Constant),
            '.' if self.peek_at(1) == Some('.') && self.peek_at(2) == Some('.') => {
                self.i += 3;
                (PyValue::Ellipsis, Form::Constant)
            }
            c if is_ident_char(c) => self.name()?,
            _ => return Err(NotALiteral("an unexpected character")),
        };
        // A call, subscript or attribute right after the atom.
        let save = self.i;
        self.skip_trivia()?;
        if matches!(self.peek(), Some('(' | '[' | '.')) {
            return Err(NotALiteral("a call, subscript or attribute"));
        }
        self.i = save;
        Ok((value, form))
    }

    /// A name: `True`, `False`, `None`, `set()`, or a string's prefix.
    fn name(&mut self) -> Parsed<(PyValue, Form)> {
        let start = self.i;
        while self.peek().is_some_and(is_ident_char) {
            self.i += 1;
        }
        let name: String = self.s[start..self.i].iter().collect();
        if matches!(self.peek(), Some('\'' | '"')) {
            return Ok((self.strings(name)?, Form::Constant));
        }
        match name.as_str() {
            "True" => Ok((PyValue::Bool(true), Form::Constant)),
            "False" => Ok((PyValue::Bool(false), Form::Constant)),
            "None" => Ok((PyValue::None, Form::Constant)),
            "set" => {
                self.skip_trivia()?;
                if self.peek() != Some('(') {
                    return Err(NotALiteral("a name"));
                }
                self.open()?;
                self.skip_trivia()?;
                if self.peek() != Some(')') {
                    return Err(NotALiteral("set() with arguments"));
                }
                self.close();
                Ok((PyValue::Set(vec![]), Form::Other))
            }
            _ => Err(NotALiteral("a name")),
        }
    }

    fn open(&mut self) -> Parsed<()> {
        if self.depth >= MAX_NESTING {
            return Err(NotALiteral("too many nested parentheses"));
        }
        self.depth += 1;
        self.i += 1;
        Ok(())
    }

    fn close(&mut self) {
        self.depth -= 1;
        self.i += 1;
    }

    /// Items up to `close`, comma-separated, a trailing comma allowed.
    /// Returns them and whether any comma was seen.
    fn items_until(&mut self, close: char, first: Option<PyValue>) -> Parsed<(Vec<PyValue>, bool)> {
        let mut items: Vec<PyValue> = first.into_iter().collect();
        let mut comma = false;
        loop {
            self.skip_trivia()?;
            if !items.is_empty() {
                match self.peek() {
                    Some(',') => {
                        comma = true;
                        self.i += 1;
                        self.skip_trivia()?;
                    }
                    Some(c) if c == close => break,
                    _ => return Err(NotALiteral("a missing comma")),
                }
            }
            if self.peek() == Some(close) {
                break;
            }
            items.push(self.item()?.0);
        }
        self.close();
        Ok((items, comma))
    }

    fn bracketed(&mut self, open: char) -> Parsed<(PyValue, Form)> {
        self.open()?;
        self.skip_trivia()?;
        match open {
            '[' => Ok((PyValue::List(self.items_until(']', None)?.0), Form::Other)),
            '(' => {
                if self.peek() == Some(')') {
                    self.close();
                    return Ok((PyValue::Tuple(vec![]), Form::Other));
                }
                let (first, form) = self.item()?;
                self.skip_trivia()?;
                if self.peek() == Some(')') {
                    self.close();
                    return Ok((first, form));
                }
                let (items, _) = self.items_until(')', Some(first))?;
                Ok((PyValue::Tuple(items), Form::Other))
            }
            _ => self.braced(),
        }
    }

    /// `{...}`: a dict or a set.
    fn braced(&mut self) -> Parsed<(PyValue, Form)> {
        if self.peek() == Some('}') {
            self.close();
            return Ok((PyValue::Dict(vec![]), Form::Other));
        }
        let (first, _) = self.item()?;
        self.skip_trivia()?;
        if self.peek() != Some(':') {
            let (items, _) = self.items_until('}', Some(first))?;
            let mut set: Vec<PyValue> = Vec::new();
            for item in items {
                hash_check(&item)?;
                if !set.iter().any(|s| py_eq(s, &item)) {
                    set.push(item);
                }
            }
            return Ok((PyValue::Set(set), Form::Other));
        }
        let mut entries: Vec<(PyValue, PyValue)> = Vec::new();
        let mut key = first;
        loop {
            // At the ':' after `key`.
            self.i += 1;
            self.skip_trivia()?;
            let (value, _) = self.item()?;
            hash_check(&key)?;
            match entries.iter_mut().find(|(k, _)| py_eq(k, &key)) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
            self.skip_trivia()?;
            match self.peek() {
                Some(',') => {
                    self.i += 1;
                    self.skip_trivia()?;
                }
                Some('}') => break,
                _ => return Err(NotALiteral("a missing comma in a dict")),
            }
            if self.peek() == Some('}') {
                break;
            }
            key = self.item()?.0;
            self.skip_trivia()?;
            if self.peek() != Some(':') {
                return Err(NotALiteral("a dict entry without a value"));
            }
        }
        self.close();
        Ok((PyValue::Dict(entries), Form::Other))
    }

    /// One or more adjacent string literals, the first one's prefix given.
    fn strings(&mut self, mut prefix: String) -> Parsed<PyValue> {
        let mut text = String::new();
        let mut bytes: Option<Vec<u8>> = None;
        let mut first = true;
        loop {
            let lower = prefix.to_ascii_lowercase();
            let (raw, is_bytes) = match lower.as_str() {
                "" | "u" => (false, false),
                "r" => (true, false),
                "b" => (false, true),
                "br" | "rb" => (true, true),
                "f" | "fr" | "rf" => return Err(NotALiteral("an f-string")),
                _ => return Err(NotALiteral("an unknown string prefix")),
            };
            if !first && is_bytes != bytes.is_some() {
                return Err(NotALiteral("bytes and str literals mixed"));
            }
            let body = self.string_body(raw, is_bytes)?;
            if is_bytes {
                let out = bytes.get_or_insert_with(Vec::new);
                out.extend(body.chars().map(|c| c as u32 as u8));
            } else {
                text.push_str(&body);
            }
            first = false;
            // Another literal may follow, after blanks (or newlines inside brackets).
            let save = self.i;
            self.skip_trivia()?;
            let start = self.i;
            while self.peek().is_some_and(|c| c.is_ascii_alphabetic()) && self.i - start < 2 {
                self.i += 1;
            }
            if matches!(self.peek(), Some('\'' | '"')) {
                prefix = self.s[start..self.i].iter().collect();
                continue;
            }
            self.i = save;
            break;
        }
        Ok(match bytes {
            Some(b) => PyValue::Bytes(b),
            None => PyValue::Str(text),
        })
    }

    /// The text of one literal, at its opening quote, escapes decoded. For
    /// bytes, every char of the result is below 256.
    fn string_body(&mut self, raw: bool, is_bytes: bool) -> Parsed<String> {
        let quote = self.peek().ok_or(NotALiteral("unexpected end"))?;
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.i += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let c = self.peek().ok_or(NotALiteral("an unterminated string"))?;
            if c == quote && (!triple || (self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote))) {
                self.i += if triple { 3 } else { 1 };
                return Ok(out);
            }
            if c == '\n' && !triple {
                return Err(NotALiteral("a newline in a string"));
            }
            if is_bytes && !c.is_ascii() {
                return Err(NotALiteral("a non-ASCII character in bytes"));
            }
            self.i += 1;
            if c != '\\' {
                out.push(c);
                continue;
            }
            let e = self.peek().ok_or(NotALiteral("an unterminated string"))?;
            if is_bytes && !e.is_ascii() {
                return Err(NotALiteral("a non-ASCII character in bytes"));
            }
            self.i += 1;
            if raw {
                out.push('\\');
                out.push(e);
                continue;
            }
            self.escape(e, is_bytes, &mut out)?;
        }
    }

    /// Decodes the escape `\e...` (the backslash and `e` already read).
    fn escape(&mut self, e: char, is_bytes: bool, out: &mut String) -> Parsed<()> {
        let simple = match e {
            '\n' => Some(None),
            '\\' => Some(Some('\\')),
            '\'' => Some(Some('\'')),
            '"' => Some(Some('"')),
            'a' => Some(Some('\x07')),
            'b' => Some(Some('\x08')),
            'f' => Some(Some('\x0c')),
            'n' => Some(Some('\n')),
            'r' => Some(Some('\r')),
            't' => Some(Some('\t')),
            'v' => Some(Some('\x0b')),
            _ => None,
        };
        if let Some(c) = simple {
            out.extend(c);
            return Ok(());
        }
        match e {
            '0'..='7' => {
                let mut value = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match self.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            value = value * 8 + d;
                            self.i += 1;
                        }
                        None => break,
                    }
                }
                let value = if is_bytes { value & 0xff } else { value };
                out.push(char::from_u32(value).unwrap_or('\u{fffd}'));
            }
            'x' => out.push(self.hex_escape(2)?),
            'u' if !is_bytes => out.push(self.hex_escape(4)?),
            'U' if !is_bytes => out.push(self.hex_escape(8)?),
            'N' if !is_bytes => return Err(NotALiteral("a \\N{...} escape (not supported)")),
            other => {
                out.push('\\');
                out.push(other);
            }
        }
        Ok(())
    }

    fn hex_escape(&mut self, n: usize) -> Parsed<char> {
        let mut value: u32 = 0;
        for _ in 0..n {
            let d = self
                .peek()
                .and_then(|c| c.to_digit(16))
                .ok_or(NotALiteral("a truncated \\x, \\u or \\U escape"))?;
            value = value * 16 + d;
            self.i += 1;
        }
        if value > 0x10ffff {
            return Err(NotALiteral("an escape past U+10FFFF"));
        }
        // A lone surrogate: Python keeps it, a Rust string cannot.
        Ok(char::from_u32(value).unwrap_or('\u{fffd}'))
    }

    /// A number token: int, float or imaginary.
    fn number(&mut self) -> Parsed<PyValue> {
        let radix = match (self.peek(), self.peek_at(1)) {
            (Some('0'), Some('x' | 'X')) => 16,
            (Some('0'), Some('o' | 'O')) => 8,
            (Some('0'), Some('b' | 'B')) => 2,
            _ => 10,
        };
        if radix != 10 {
            self.i += 2;
            let mut digits = String::new();
            loop {
                if self.peek() == Some('_') {
                    self.i += 1;
                }
                match self.peek().filter(|c| c.is_digit(radix)) {
                    Some(c) => {
                        digits.push(c);
                        self.i += 1;
                    }
                    None => break,
                }
            }
            let last = self.s[self.i - 1];
            if digits.is_empty() || last == '_' || self.peek().is_some_and(is_ident_char) {
                return Err(NotALiteral("an invalid number"));
            }
            return Ok(int_from_digits(&digits, radix));
        }
        let mut text = String::new();
        let int_part = self.digit_part()?;
        text.push_str(&int_part);
        let mut is_float = false;
        if self.peek() == Some('.') {
            is_float = true;
            self.i += 1;
            text.push('.');
            if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                text.push_str(&self.digit_part()?);
            }
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let save = self.i;
            self.i += 1;
            let mut exp = String::from("e");
            if let Some(sign @ ('+' | '-')) = self.peek() {
                exp.push(sign);
                self.i += 1;
            }
            if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                exp.push_str(&self.digit_part()?);
                text.push_str(&exp);
                is_float = true;
            } else {
                self.i = save;
                return Err(NotALiteral("an invalid exponent"));
            }
        }
        let imaginary = matches!(self.peek(), Some('j' | 'J'));
        if imaginary {
            self.i += 1;
        }
        if self.peek().is_some_and(is_ident_char) {
            return Err(NotALiteral("an invalid decimal literal"));
        }
        if !is_float && !imaginary {
            if int_part.len() > 1 && int_part.starts_with('0') && int_part.chars().any(|c| c != '0') {
                return Err(NotALiteral("leading zeros in an int"));
            }
            if int_part.len() > MAX_INT_DIGITS {
                return Err(NotALiteral("an int past Python's 4300 digits"));
            }
            return Ok(int_from_digits(&int_part, 10));
        }
        let mut f_text = text;
        if f_text.starts_with('.') {
            f_text.insert(0, '0');
        }
        let f_text = f_text.replace(".e", ".0e");
        let f_text = if f_text.ends_with('.') {
            format!("{f_text}0")
        } else {
            f_text
        };
        let value: f64 = f_text.parse().map_err(|_| NotALiteral("an invalid float"))?;
        Ok(if imaginary {
            PyValue::Complex { re: 0.0, im: value }
        } else {
            PyValue::Float(value)
        })
    }

    /// `digit (_? digit)*`, the underscores dropped.
    fn digit_part(&mut self) -> Parsed<String> {
        let mut digits = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() {
                digits.push(c);
                self.i += 1;
            } else if c == '_' && !digits.is_empty() && self.peek_at(1).is_some_and(|d| d.is_ascii_digit()) {
                self.i += 1;
            } else {
                break;
            }
        }
        if self.peek() == Some('_') {
            return Err(NotALiteral("an invalid underscore in a number"));
        }
        Ok(digits)
    }
}

/// An int from its digits in `radix`, in 128 bits when it fits.
fn int_from_digits(digits: &str, radix: u32) -> PyValue {
    if let Ok(v) = i128::from_str_radix(digits, radix) {
        return PyValue::Int(v);
    }
    // Base 10^9 limbs, least significant first.
    let mut limbs: Vec<u64> = vec![0];
    for c in digits.chars() {
        let mut carry = u64::from(c.to_digit(radix).unwrap_or(0));
        for limb in limbs.iter_mut() {
            let v = *limb * u64::from(radix) + carry;
            *limb = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push(carry % 1_000_000_000);
            carry /= 1_000_000_000;
        }
    }
    let mut text = String::new();
    for (i, limb) in limbs.iter().rev().enumerate() {
        if i == 0 {
            text.push_str(&limb.to_string());
        } else {
            text.push_str(&format!("{limb:09}"));
        }
    }
    PyValue::BigInt {
        negative: false,
        digits: text,
    }
}

fn negate(v: PyValue) -> PyValue {
    match v {
        PyValue::Int(i) => match i.checked_neg() {
            Some(n) => PyValue::Int(n),
            None => PyValue::BigInt {
                negative: true,
                digits: i.unsigned_abs().to_string(),
            },
        },
        PyValue::BigInt { negative, digits } => PyValue::BigInt {
            negative: !negative,
            digits,
        },
        PyValue::Float(f) => PyValue::Float(-f),
        PyValue::Complex { re, im } => PyValue::Complex { re: -re, im: -im },
        other => other,
    }
}

fn as_f64(v: &PyValue) -> f64 {
    match v {
        PyValue::Int(i) => *i as f64,
        PyValue::BigInt { negative, digits } => {
            let f: f64 = digits.parse().unwrap_or(f64::INFINITY);
            if *negative {
                -f
            } else {
                f
            }
        }
        PyValue::Float(f) => *f,
        _ => 0.0,
    }
}

/// A value Python would refuse as a dict key or set element.
fn hash_check(v: &PyValue) -> Parsed<()> {
    match v {
        PyValue::List(_) | PyValue::Dict(_) | PyValue::Set(_) => Err(NotALiteral("an unhashable key")),
        PyValue::Tuple(items) => items.iter().try_for_each(hash_check),
        _ => Ok(()),
    }
}

/// A number as (real, imaginary) for comparing across int, float, complex
/// and bool, as Python's `==` does; `None` for a big int (compared exactly).
fn numeric(v: &PyValue) -> Option<(f64, f64)> {
    match v {
        PyValue::Bool(b) => Some((f64::from(u8::from(*b)), 0.0)),
        PyValue::Int(i) if i.unsigned_abs() < (1 << 53) => Some((*i as f64, 0.0)),
        PyValue::Float(f) => Some((*f, 0.0)),
        PyValue::Complex { re, im } => Some((*re, *im)),
        _ => None,
    }
}

/// Python's `==` between two hashable values.
fn py_eq(a: &PyValue, b: &PyValue) -> bool {
    if let (Some(x), Some(y)) = (numeric(a), numeric(b)) {
        return x == y;
    }
    match (a, b) {
        (PyValue::Tuple(x), PyValue::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(source: &str) -> Option<String> {
        literal_eval(source).ok().map(|v| v.to_py_repr())
    }

    // Each expected text is what CPython 3.12.1's repr(ast.literal_eval(source)) printed.
    #[test]
    fn accepts_what_python_accepts_and_writes_the_same_value() {
        let cases = [
            ("\n[1]", "[1]"),
            ("  [1]", "[1]"),
            ("# c\n[1]", "[1]"),
            ("[1] # c", "[1]"),
            ("[1]\n\n", "[1]"),
            ("[1]\n  \n", "[1]"),
            ("[1]\n  # c", "[1]"),
            ("[1]\n\x0c", "[1]"),
            ("[1]\r\n", "[1]"),
            ("[1]\r", "[1]"),
            ("'''a\r\nb'''", "'a\\nb'"),
            ("[1,\r2]", "[1, 2]"),
            ("(\n1)", "1"),
            ("b'\\777'", "b'\\xff'"),
            ("'\\777'", "'ǿ'"),
            ("b'\\400'", "b'\\x00'"),
            ("'\\d'", "'\\\\d'"),
            ("b'\\u1234'", "b'\\\\u1234'"),
            ("r'a\\\nb'", "'a\\\\\\nb'"),
            ("'a\\\nb'", "'ab'"),
            ("1_000", "1000"),
            ("00", "0"),
            ("0_0", "0"),
            ("1.e5", "100000.0"),
            ("1e5j", "100000j"),
            ("-1j", "(-0-1j)"),
            ("1+2j", "(1+2j)"),
            ("-0.0", "-0.0"),
            ("1e400", "inf"),
            ("-1e400", "-inf"),
            ("{1: 'a', 1.0: 'b', True: 'c'}", "{1: 'c'}"),
            ("{1, 1.0}", "{1}"),
            ("'a'r'b'", "'ab'"),
            ("...", "Ellipsis"),
            ("set ()", "set()"),
            ("[1,]", "[1]"),
            ("(1)", "1"),
            ("()", "()"),
            ("1,", "(1,)"),
            ("u'x'", "'x'"),
            ("Rb'x'", "b'x'"),
            ("[\\\n1]", "[1]"),
            ("\\\n[1]", "[1]"),
            ("('a'\n'b')", "'ab'"),
            ("(1) + (2j)", "(1+2j)"),
            ("- (1)", "-1"),
            (
                "0xffffffffffffffffffffffffffff",
                "5192296858534827628530496329220095",
            ),
            ("0b101", "5"),
            ("0O17", "15"),
            ("1.5J", "1.5j"),
            ("[-0]", "[0]"),
            ("[-0j]", "[(-0-0j)]"),
            (
                "[1e16, 1e15, 0.0001, 0.00001, 1.5e-7]",
                "[1e+16, 1000000000000000.0, 0.0001, 1e-05, 1.5e-07]",
            ),
            (
                "[1-0j, 0j, -1.5+0j, 1e16j, 2.5+1e-5j]",
                "[(1+0j), 0j, (-1.5+0j), 1e+16j, (2.5+1e-05j)]",
            ),
            ("'a\\\r\nb'", "'ab'"),
            ("'\\\n'", "''"),
            ("[True, False, None]", "[True, False, None]"),
            ("['a' 'b' r'\\d' u'\\u00e9']", "['ab\\\\dé']"),
            (
                "{'a': [1, (2,)], 'b': {'c': None}}",
                "{'a': [1, (2,)], 'b': {'c': None}}",
            ),
            (
                "[b'\\x00\\x7f\\x80', b\"'\", b'\"', b'\\'\"']",
                "[b'\\x00\\x7f\\x80', b\"'\", b'\"', b'\\'\"']",
            ),
            (
                "[\"it's\", 'say \"hi\"', 'both \\' \"', '\\\\']",
                "[\"it's\", 'say \"hi\"', 'both \\' \"', '\\\\']",
            ),
            ("(1)+2j", "(1+2j)"),
            ("1 +2j", "(1+2j)"),
            ("{}", "{}"),
            ("{'k': 1,}", "{'k': 1}"),
            ("(1, 2,)", "(1, 2)"),
        ];
        for (source, want) in cases {
            assert_eq!(repr(source).as_deref(), Some(want), "{source:?}");
        }
    }

    #[test]
    fn refuses_what_python_refuses() {
        let cases = [
            "\n  [1]",
            "[1]\n  ",
            "[1]\n\t",
            "[1]\n\n  ",
            "[1]\n#c\n  ",
            "[1]\r  ",
            "1,\n2",
            "'\\N{DASH}'",
            "[1]\\\n",
            "[1] \\",
            "'a'\n'b'",
            "1 + 2j + 3",
            "[1 2]",
            "[1, 2 3]",
            "ur'x'",
            "f'x'",
            "'\\x4'",
            "'\\U00110000'",
            "0_7",
            "1__0",
            "'a' b'c'",
            "[1]\n\\\n",
            "\\\n",
            "[1\u{0}]",
            "[1]\n \\\n",
            "",
            "   ",
            "[foo]",
            "[1][0]",
            "['a'",
            "set(1)",
            "{1: 2, 3}",
            "{[1]: 2}",
            "{[1]}",
            "--1",
            "-True",
            "-'a'",
            "1 + 2",
            "2j + 1",
            "1 + -2j",
            "-(1+2j)",
            "1e",
            "0x",
            "1_",
            "01",
            "1a",
            "b'é'",
            "'a\nb'",
            "~1",
            "not 1",
            "1 if 1 else 2",
            "[*a]",
            "{**{}}",
            "x.y",
            "(1)(2)",
            "'abc'[0]",
            "1 * 2",
            "{1}[0]",
        ];
        for source in cases {
            assert_eq!(repr(source), None, "{source:?}");
        }
    }

    #[test]
    fn nesting_stops_at_python_s_limit() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(repr(&deep(MAX_NESTING)).is_some());
        assert_eq!(repr(&deep(MAX_NESTING + 1)), None);
        assert_eq!(repr(&"[".repeat(100_000)), None);
    }

    #[test]
    fn decimal_ints_stop_at_python_s_digit_limit() {
        assert!(repr(&"9".repeat(MAX_INT_DIGITS)).is_some());
        assert_eq!(repr(&"9".repeat(MAX_INT_DIGITS + 1)), None);
        assert_eq!(
            repr("-170141183460469231731687303715884105728").as_deref(),
            Some("-170141183460469231731687303715884105728")
        );
        assert_eq!(
            repr("[123456789012345678901234567890123456789012]").as_deref(),
            Some("[123456789012345678901234567890123456789012]")
        );
    }
}
