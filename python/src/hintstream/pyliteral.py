"""The Python-list-literal parser of stage 1 (``src/llm/pyliteral.rs``),
ported rule for rule so that the static hint built here is the one stage 1
builds: single and double quotes, escapes, raw and byte prefixes, numbers,
None/True/False and nested lists. Garbage gives ``None``, never an exception.

This is deliberately not ``ast.literal_eval``: the point is the Rust
parser's exact result (for example a nested list is rendered back with the
Rust side's rules, and hex literals are garbage)."""

from __future__ import annotations

import re
from typing import List, Optional, Union

#: Deepest nesting accepted; deeper input is treated as garbage.
MAX_DEPTH = 32

#: Rust's ``char::is_whitespace`` (Unicode White_Space). Python's
#: ``str.isspace`` also counts U+001C..U+001F, which Rust does not.
_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

#: What Rust's ``str::parse::<f64>`` accepts. ASCII only: without
#: ``re.ASCII``, ignoring case lets ``ı`` and ``İ`` match ``i`` (``[ınf]``
#: would be a number here and garbage in Rust).
_RUST_FLOAT = re.compile(r"[+-]?(?:(?i:inf|infinity|nan)|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)", re.ASCII)
_HEX = frozenset("0123456789abcdefABCDEF")


def is_rust_whitespace(c: str) -> bool:
    """Rust's ``char::is_whitespace``."""
    return c in _WHITESPACE


def rust_trim(text: str) -> str:
    """Rust's ``str::trim``."""
    start, end = 0, len(text)
    while start < end and text[start] in _WHITESPACE:
        start += 1
    while end > start and text[end - 1] in _WHITESPACE:
        end -= 1
    return text[start:end]


def _is_rust_alphanumeric(c: str) -> bool:
    # Rust: Alphabetic or Numeric. Python's isalnum differs only on exotic
    # marks; such an atom is garbage either way (it never parses as a number).
    return c.isalnum() or c.isalpha() or c.isnumeric()


class _Str(str):
    """A string item (rendered with quotes inside a nested list)."""


class _Atom(str):
    """A number or None/True/False, kept as its literal text."""


_Item = Union[_Str, _Atom, "List[_Item]"]


def parse_list(text: str) -> Optional[List[str]]:
    """Parses ``text`` (surrounding whitespace allowed) as one Python list
    and returns its items as strings: strings as their value, other items as
    their literal text, nested lists rendered back in Python syntax."""
    parser = _Parser(rust_trim(text))
    items = parser.list(0)
    if not isinstance(items, list):
        return None
    parser.skip_ws()
    if parser.pos != len(parser.chars):
        return None
    return [_into_text(item) for item in items]


def _into_text(item: _Item) -> str:
    if isinstance(item, list):
        inner = [python_repr(i) if isinstance(i, _Str) else _into_text(i) for i in item]
        return "[" + ", ".join(inner) + "]"
    return str(item)


def python_repr(s: str) -> str:
    """A string as the Rust side writes Python's ``repr``: single quotes
    unless it holds a single quote and no double one; backslash, the quote,
    \\n, \\r, \\t and other control characters (< 0x20, 0x7f) escaped."""
    quote = '"' if "'" in s and '"' not in s else "'"
    out = [quote]
    for c in s:
        if c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c == quote:
            out.append("\\" + c)
        elif ord(c) < 0x20 or c == "\x7f":
            out.append("\\x%02x" % ord(c))
        else:
            out.append(c)
    out.append(quote)
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.chars = text
        self.pos = 0

    def peek(self) -> Optional[str]:
        return self.chars[self.pos] if self.pos < len(self.chars) else None

    def skip_ws(self) -> None:
        while self.pos < len(self.chars) and self.chars[self.pos] in _WHITESPACE:
            self.pos += 1

    def list(self, depth: int) -> Optional[_Item]:
        if depth > MAX_DEPTH or self.peek() != "[":
            return None
        self.pos += 1
        items: List[_Item] = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c is None:
                return None
            if c == "]":
                self.pos += 1
                return items
            item = self.item(depth)
            if item is None:
                return None
            items.append(item)
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]":
                return None

    def item(self, depth: int) -> Optional[_Item]:
        c = self.peek()
        if c is None:
            return None
        if c == "[":
            return self.list(depth + 1)
        if c in "'\"":
            s = self.string(False)
            return None if s is None else _Str(s)
        nxt = self.chars[self.pos + 1] if self.pos + 1 < len(self.chars) else None
        if c in "rRbBuU" and nxt in ("'", '"'):
            raw = c in "rR"
            self.pos += 1
            s = self.string(raw)
            return None if s is None else _Str(s)
        return self.atom()

    def string(self, raw: bool) -> Optional[str]:
        quote = self.peek()
        self.pos += 1
        out: List[str] = []
        while True:
            c = self.peek()
            if c is None:
                return None
            self.pos += 1
            if c == quote:
                return "".join(out)
            if c == "\\" and raw:
                out.append("\\")
                nxt = self.peek()
                if nxt is not None:
                    out.append(nxt)
                    self.pos += 1
            elif c == "\\":
                e = self.peek()
                if e is None:
                    return None
                self.pos += 1
                if e == "n":
                    out.append("\n")
                elif e == "t":
                    out.append("\t")
                elif e == "r":
                    out.append("\r")
                elif e == "0":
                    out.append("\0")
                elif e in "\\'\"":
                    out.append(e)
                elif e == "\n":
                    pass
                elif e in "xuU":
                    ch = self.hex({"x": 2, "u": 4, "U": 8}[e])
                    if ch is None:
                        return None
                    out.append(ch)
                else:
                    out.append("\\")
                    out.append(e)
            else:
                out.append(c)

    def hex(self, digits: int) -> Optional[str]:
        if self.pos + digits > len(self.chars):
            return None
        text = self.chars[self.pos : self.pos + digits]
        self.pos += digits
        # Rust's u32::from_str_radix: an optional leading '+', then ASCII hex.
        body = text[1:] if text.startswith("+") else text
        if not body or any(ch not in _HEX for ch in body):
            return None
        value = int(body, 16)
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            return None
        return chr(value)

    def atom(self) -> Optional[_Item]:
        start = self.pos
        while self.pos < len(self.chars):
            c = self.chars[self.pos]
            if _is_rust_alphanumeric(c) or c in ".-+_":
                self.pos += 1
            else:
                break
        text = self.chars[start : self.pos]
        if text in ("None", "True", "False") or _RUST_FLOAT.fullmatch(text):
            return _Atom(text)
        return None
