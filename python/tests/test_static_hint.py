"""The Python static hint equals the Rust one on every shared fixture
(schemas/fixtures/static_hint, expected texts written by the Rust code
through scripts/static-hint-fixtures.sh)."""

import json
from pathlib import Path

import pytest

from hintstream import static_hint
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

