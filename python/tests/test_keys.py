"""Keys against the vectors the Rust suite reads too (schemas/vectors/keys.json):
both languages build and parse the same keys, non-ASCII ids included."""

import pytest

from hintstream import group_key, parse_group_key, parse_step_key, step_key
from vectors import shared_vectors

VECTORS = shared_vectors("keys.json")


@pytest.mark.parametrize("case", VECTORS["encode"], ids=lambda c: c["case"])
def test_keys_are_the_shared_vectors(case: dict) -> None:
    assert group_key(case["run_id"], case["step"], case["instance_id"]) == case["group_key"]
    assert step_key(case["run_id"], case["step"]) == case["step_key"]


@pytest.mark.parametrize("case", VECTORS["parse_group"], ids=lambda c: c["key"])
def test_group_keys_parse_as_the_shared_vectors(case: dict) -> None:
    if "error" in case:
        with pytest.raises(ValueError):
            parse_group_key(case["key"])
    else:
        assert parse_group_key(case["key"]) == (case["run_id"], case["step"], case["instance_id"])


@pytest.mark.parametrize("case", VECTORS["parse_step"], ids=lambda c: c["key"])
def test_step_keys_parse_as_the_shared_vectors(case: dict) -> None:
    if "error" in case:
        with pytest.raises(ValueError):
            parse_step_key(case["key"])
    else:
        assert parse_step_key(case["key"]) == (case["run_id"], case["step"])
