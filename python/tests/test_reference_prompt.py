"""The reference trainer's own outputs (schemas/fixtures/reference_prompts.json
and python_literals.json, written once by scripts/reference-prompt-fixtures.py
from SkyRL-Fleet's functions and CPython 3.12) against ours: the static hint
of ``FleetTaskEnv.build_hint_text`` for every fixture, the value of every
accumulator literal, ``synthesize_hints_batch``'s signature, and its batch
log line. The Rust suite reads both files too (tests/it/hints/reference_prompt.rs)."""

import inspect
import json
import re
from pathlib import Path

import pytest

import hintstream
import hintstream.skyrl
from hintstream.dropin import batch_log_line
from hintstream.static_hint import reference_literal, reference_static_hint

FIXTURES = Path(__file__).resolve().parents[2] / "schemas" / "fixtures"
FIXTURE = json.loads((FIXTURES / "reference_prompts.json").read_text(encoding="utf-8"))
CASES = FIXTURE["cases"]
LITERALS = json.loads((FIXTURES / "python_literals.json").read_text(encoding="utf-8"))["vectors"]


def test_there_are_at_least_30_fixtures() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_python_reference_static_hint_is_build_hint_text_s(case) -> None:
    t = case["trajectory"]
    got = reference_static_hint(t.get("verifier_stdout"), t.get("verifier_error"), t.get("tool_error_messages"))
    assert got == case["static_hint"]


def test_the_drop_in_has_the_reference_s_signature_and_defaults() -> None:
    assert hintstream.synthesize_hints_batch is hintstream.skyrl.synthesize_hints_batch
    params = list(inspect.signature(hintstream.skyrl.synthesize_hints_batch).parameters.values())
    reference = FIXTURE["synthesize_hints_batch"]["signature"]
    ours = [
        {"name": p.name, "kind": p.kind.name, **({} if p.default is inspect.Parameter.empty else {"default": p.default})}
        for p in params[: len(reference)]
    ]
    assert ours == reference
    # Ours beyond them: keyword-only and optional.
    extra = params[len(reference) :]
    assert [p.name for p in extra] == ["client", "run_id", "step"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in extra)
    assert inspect.iscoroutinefunction(hintstream.skyrl.synthesize_hints_batch)


def test_the_batch_log_line_is_the_reference_s() -> None:
    example = FIXTURE["synthesize_hints_batch"]["log_example"]
    results = [("text", c) for c in example["categories"]]
    elapsed = float(re.search(r", ([0-9.]+)s elapsed$", example["message"]).group(1))
    assert batch_log_line(results, elapsed) == example["message"]
    assert example["level"] == "INFO"


def test_accumulator_literals_read_as_the_reference_and_stage_1_read_them() -> None:
    # The value the reference's ast.literal_eval gives (its repr), or None
    # where it raises; stage 1's pyeval.rs is held to the same file.
    assert len(LITERALS) >= 300
    failures = []
    for v in LITERALS:
        try:
            got = repr(reference_literal(v["source"]))
        except Exception:  # noqa: BLE001 - the reference catches every error alike
            got = None
        if got != v["repr"]:
            failures.append(f"{v['source']!r}: want {v['repr']!r}, got {got!r}")
    assert not failures, "\n".join(failures)
