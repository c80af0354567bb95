"""The verifier-accumulator list parser (``hintstream.pyliteral``, the port of
``src/llm/pyliteral.rs``) against the vectors the Rust suite reads too
(schemas/vectors/pyliteral.json), and never an exception on any input."""

import random

import pytest

from hintstream.pyliteral import parse_list
from vectors import shared_vectors

VECTORS = shared_vectors("pyliteral.json")


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["case"])
def test_parse_list_gives_the_shared_vectors(case: dict) -> None:
    assert parse_list(case["source"]) == case["items"]


def test_very_deep_nesting_is_garbage_without_recursing() -> None:
    assert parse_list("[" * 100_000) is None


def test_parse_list_never_raises_on_random_input() -> None:
    rng = random.Random(1)
    alphabet = list("[]'\"\\, abxuU0123456789.Nn\n")
    for _ in range(20_000):
        parse_list("".join(rng.choice(alphabet) for _ in range(rng.randrange(40))))
