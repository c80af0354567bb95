"""The static hint, exactly as stage 1 builds it when there is no LLM answer
(``src/llm/prompt.rs``: ``feedback`` and ``static_hint``). The shared
fixtures in ``schemas/fixtures/static_hint/`` hold texts produced by the Rust
code; the tests check this module gives the same text for every one.
:func:`reference_static_hint` is the reference trainer's own static hint.

Lengths are in Unicode code points, as in the Rust code (``chars()``)."""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from .pyliteral import parse_list, rust_trim

#: Items kept of each accumulator list, and characters of each item.
MAX_ACCUMULATOR_ITEMS = 10
MAX_ACCUMULATOR_ITEM_CHARS = 200
#: Characters kept of the verifier error.
MAX_VERIFIER_ERROR_CHARS = 500
#: Unique tool errors kept, and characters of each.
MAX_TOOL_ERRORS = 10
MAX_TOOL_ERROR_CHARS = 300

#: The hint when the verifier said nothing usable.
GENERIC_HINT = (
    "Re-read the task requirements, verify each one explicitly with the tools before finishing, "
    "and use fewer, more targeted steps."
)


@dataclass
class VerifierFeedback:
    """What the verifier said, parsed and bounded."""

    failed_checks: List[str] = field(default_factory=list)
    passed_checks: List[str] = field(default_factory=list)
    verifier_error: Optional[str] = None
    tool_errors: List[str] = field(default_factory=list)


def truncate_chars(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with ``...``."""
    return text if len(text) <= limit else text[:limit] + "..."


def accumulator(stdout: str, name: str) -> Optional[List[str]]:
    """The list printed between ``>>> NAME >>>`` and its closing line
    ``<<< NAME <<<`` (or the end), parsed as a Python literal; ``None`` when
    absent or garbage. A ``<<<`` inside a check's text does not end it."""
    marker = f">>> {name} >>>"
    start = stdout.find(marker)
    if start < 0:
        return None
    rest = stdout[start + len(marker) :]
    end = rest.find(f"\n<<< {name} <<<")
    return parse_list(rest if end < 0 else rest[:end])


def _bounded(items: List[str]) -> List[str]:
    return [truncate_chars(s, MAX_ACCUMULATOR_ITEM_CHARS) for s in items[:MAX_ACCUMULATOR_ITEMS]]


def feedback(
    verifier_stdout: Optional[str],
    verifier_error: Optional[str],
    tool_error_messages: Optional[List[str]],
) -> VerifierFeedback:
    """Parses and bounds a trajectory's verifier feedback."""
    stdout = verifier_stdout or ""
    seen = set()
    tool_errors: List[str] = []
    for e in tool_error_messages or []:
        if len(tool_errors) == MAX_TOOL_ERRORS:
            break
        if not rust_trim(e) or e in seen:
            continue
        seen.add(e)
        tool_errors.append(truncate_chars(e, MAX_TOOL_ERROR_CHARS))
    error = verifier_error if verifier_error is not None and rust_trim(verifier_error) else None
    return VerifierFeedback(
        failed_checks=_bounded(accumulator(stdout, "ERROR_ACCUMULATOR") or []),
        passed_checks=_bounded(accumulator(stdout, "SUCCESS_ACCUMULATOR") or []),
        verifier_error=None if error is None else truncate_chars(error, MAX_VERIFIER_ERROR_CHARS),
        tool_errors=tool_errors,
    )


def static_hint_from_feedback(fb: VerifierFeedback) -> str:
    """The static hint of parsed feedback."""
    parts = []
    if fb.failed_checks:
        parts.append(
            "These checks failed last time: "
            + "; ".join(fb.failed_checks)
            + ". Make each of them pass before you finish."
        )
    if fb.verifier_error is not None:
        parts.append(f"The verifier reported: {fb.verifier_error}.")
    if fb.tool_errors:
        parts.append(
            "These tool calls returned errors: "
            + "; ".join(fb.tool_errors)
            + ". Check the tool's arguments before calling it again."
        )
    if fb.passed_checks:
        parts.append("Keep what already worked: " + "; ".join(fb.passed_checks) + ".")
    if not parts:
        parts.append(GENERIC_HINT)
    return " ".join(parts)


def static_hint(
    verifier_stdout: Optional[str] = None,
    verifier_error: Optional[str] = None,
    tool_error_messages: Optional[List[str]] = None,
) -> str:
    """The hint stage 1 publishes as ``static_fallback`` for a trajectory
    with this verifier feedback. Same call signature as the reference
    trainer's ``static_fallback_fn`` (``FleetTaskEnv.build_hint_text``)."""
    return static_hint_from_feedback(feedback(verifier_stdout, verifier_error, tool_error_messages))


def static_hint_for(trajectory: Mapping[str, Any]) -> str:
    """The static hint of a FailedTrajectory message (or a hint request)."""
    return static_hint(
        trajectory.get("verifier_stdout"),
        trajectory.get("verifier_error"),
        trajectory.get("tool_error_messages"),
    )


# --------------------------------------------------------------------------
# The reference trainer's static hint (SkyRL-Fleet's
# ``FleetTaskEnv.build_hint_text``), as stage 1 builds it under
# ``[llm] prompt_version = "reference"`` (src/llm/prompt/reference.rs). The
# shared fixtures in ``schemas/fixtures/reference_prompts.json`` hold the
# texts the reference's own function wrote; the tests check this one gives
# the same text for every one.

#: Checks shown of each accumulator, and characters of each.
REFERENCE_MAX_CHECKS = 5
REFERENCE_MAX_CHECK_CHARS = 100
#: Unique tool errors shown, and characters of each (the verifier error is
#: kept whole).
REFERENCE_MAX_TOOL_ERRORS = 5
REFERENCE_MAX_TOOL_ERROR_CHARS = 200
#: The reference's hint when the verifier said nothing usable.
REFERENCE_GENERIC_HINT = "The previous attempt failed. Try a different approach."


def reference_accumulator_body(stdout: str, name: str) -> Optional[str]:
    """The text between ``>>> NAME >>>`` + newline and the first closing
    line ``<<< NAME <<<`` at least one character later (the reference's
    regular expression), or ``None``."""
    opening = f">>> {name} >>>\n"
    start = stdout.find(opening)
    if start < 0:
        return None
    start += len(opening)
    end = stdout.find(f"\n<<< {name} <<<", start + 1)
    return None if end < 0 else stdout[start:end]


def _reference_checks(value: Any) -> Optional[List[Any]]:
    """An accumulator's items as the reference lists them; ``None`` when it
    lists none (a falsy value; a number, dict or set, where the reference's
    ``len()`` or slicing raises)."""
    if not value or not isinstance(value, (list, tuple, str, bytes)):
        return None
    return list(value)


def reference_literal(text: str) -> Any:
    """``ast.literal_eval(text)``, as the reference reads an accumulator
    block (invalid escapes, which warn from Python 3.12 on, silenced);
    raises what it raises. ``src/llm/prompt/pyeval.rs`` is stage 1's
    version: both are held to schemas/fixtures/python_literals.json."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.literal_eval(text)


def reference_accumulators(verifier_stdout: Optional[str]) -> Tuple[Optional[List[Any]], Optional[List[Any]]]:
    """(passed, failed) checks of the verifier's stdout, read with
    :func:`reference_literal`; both ``None`` when either block is not a
    literal."""
    if not verifier_stdout:
        return None, None
    errors = reference_accumulator_body(verifier_stdout, "ERROR_ACCUMULATOR")
    successes = reference_accumulator_body(verifier_stdout, "SUCCESS_ACCUMULATOR")
    try:
        failed = None if errors is None else reference_literal(errors)
        passed = None if successes is None else reference_literal(successes)
    except Exception:  # the reference catches every error alike
        return None, None
    return _reference_checks(passed), _reference_checks(failed)


def reference_static_hint(
    verifier_stdout: Optional[str] = None,
    verifier_error: Optional[str] = None,
    tool_error_messages: Optional[List[str]] = None,
) -> str:
    """The reference's static hint (``FleetTaskEnv.build_hint_text``), with
    its signature: the checks passed and failed, the verifier error, the
    unique tool errors, one line each."""
    parts = []
    passed, failed = reference_accumulators(verifier_stdout)
    for label, checks in (("passed", passed), ("failed", failed)):
        if checks:
            shown = ", ".join(str(c)[:REFERENCE_MAX_CHECK_CHARS] for c in checks[:REFERENCE_MAX_CHECKS])
            parts.append(f"Checks {label} ({len(checks)}): {shown}")
    if verifier_error:
        parts.append(f"Verifier: {verifier_error}")
    if tool_error_messages:
        unique = list(dict.fromkeys(tool_error_messages))[:REFERENCE_MAX_TOOL_ERRORS]
        parts.append("Tool errors: " + "; ".join(e[:REFERENCE_MAX_TOOL_ERROR_CHARS] for e in unique))
    return "\n".join(parts) if parts else REFERENCE_GENERIC_HINT
