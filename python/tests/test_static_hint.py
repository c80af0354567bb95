"""The Python static hint equals the Rust one on every shared fixture
(schemas/fixtures/static_hint, expected texts written by the Rust code
through scripts/static-hint-fixtures.sh)."""

import json
from pathlib import Path

import pytest

from hintstream import static_hint
from hintstream.pyliteral import parse_list
from hintstream.static_hint import static_hint_for

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "schemas" / "fixtures" / "static_hint").glob("*.json"))


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 15


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_python_static_hint_equals_the_rust_one(path: Path) -> None:
    fixture = json.loads(path.read_text(encoding="utf-8"))
    assert fixture["hint"], f"{path.name} has no expected text: run scripts/static-hint-fixtures.sh"
    assert static_hint_for(fixture["trajectory"]) == fixture["hint"]


def test_the_reference_signature() -> None:
    # static_fallback_fn(verifier_stdout, verifier_error, tool_error_messages)
    text = static_hint(None, "boom", ["a", "a"])
    assert text == "The verifier reported: boom. These tool calls returned errors: a. Check the tool's arguments before calling it again."


# The Rust parser's own unit-test vectors (src/llm/pyliteral.rs).
def test_pyliteral_matches_the_rust_unit_tests() -> None:
    assert parse_list(r"""['a', "b's", 'it\'s', "tab\there", 'x\\y']""") == ["a", "b's", "it's", "tab\there", "x\\y"]
    assert parse_list("[1, -2.5e3, None, True, ['x', [2]], r'\\d+']") == ["1", "-2.5e3", "None", "True", "['x', [2]]", "\\d+"]
    assert parse_list(r"""[["it's", 'a\\b', 'q"', '\x7f\n']]""") == [r"""["it's", 'a\\b', 'q"', '\x7f\n']"""]
    assert parse_list("  [] ") == []
    assert parse_list("['a',]") == ["a"]
    for garbage in ["", "[", "['a'", "['a' 'b']", "hello", "[foo]", "['a'] trailing", "[[[[", "['\\x4']", "[" * 100_000]:
        assert parse_list(garbage) is None, garbage[:40]


def test_pyliteral_never_raises_on_random_input() -> None:
    import random

    rng = random.Random(1)
    alphabet = list("[]'\"\\, abxuU0123456789.Nn\n")
    for _ in range(20_000):
        parse_list("".join(rng.choice(alphabet) for _ in range(rng.randrange(40))))
