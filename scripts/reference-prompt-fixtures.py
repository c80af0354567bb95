#!/usr/bin/env python3
"""Writes the reference-prompt fixtures, once, by running the reference
trainer's own functions:

- schemas/fixtures/reference_prompts.json: for each of 51 failed
  trajectories, the system prompt and user message that SkyRL-Fleet's
  ``synthesize_hint`` sends (captured from its ``litellm.acompletion`` call,
  stubbed here) and the static hint of ``FleetTaskEnv.build_hint_text``;
  also ``synthesize_hints_batch``'s signature and its batch log line.
- schemas/fixtures/python_literals.json: sources and the ``repr()`` of
  what ``ast.literal_eval`` makes of them (``null`` where it raises): the
  reference reads the verifier's accumulator blocks with it.

The Rust prompt builder (src/llm/prompt/reference.rs, its tests in
tests/it/hints/reference_prompt.rs) and the Python static fallback
(python/tests/test_reference_prompt.py) are checked against these files.
The reference's code is read from a git mirror of fleet-ai/SkyRL-Fleet,
checked out into a temporary folder; nothing of it is kept. Its heavy
imports (the environment base class, litellm) are stubbed in sys.modules;
nothing reaches the network.

    python3.12 scripts/reference-prompt-fixtures.py --git-dir PATH/TO/SkyRL-Fleet.git [--commit HEAD]

Run it with CPython 3.12 (the reference's interpreter): str() and
isprintable() follow its Unicode database.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
FLEET_TASK = "skyrl-gym/skyrl_gym/envs/fleet_task"


def checkout(git_dir: str, commit: str, into: Path) -> str:
    """The reference's fleet_task folder at `commit`, extracted under `into`;
    returns the full commit id."""
    full = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", commit], check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", full, FLEET_TASK], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return full


def load_reference(root: Path) -> types.SimpleNamespace:
    """Imports hint_synthesizer.py and env.py with the minimum stubs."""
    captured: List[Dict[str, Any]] = []

    # litellm: acompletion records the request and answers "ok".
    litellm = types.ModuleType("litellm")

    async def acompletion(**kwargs: Any) -> Any:
        captured.append(kwargs)
        message = types.SimpleNamespace(content="ok")
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])

    litellm.acompletion = acompletion  # type: ignore[attr-defined]
    sys.modules["litellm"] = litellm

    # The environment's base classes and tool-call parser (env.py's imports).
    for name in ("skyrl_gym", "skyrl_gym.envs", "skyrl_gym.envs.fleet_task"):
        module = types.ModuleType(name)
        module.__path__ = []  # type: ignore[attr-defined]
        sys.modules[name] = module
    base = types.ModuleType("skyrl_gym.envs.base_text_env")

    class BaseTextEnv:  # noqa: D401 - a stub
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    base.BaseTextEnv = BaseTextEnv  # type: ignore[attr-defined]
    base.BaseTextEnvStepOutput = dict  # type: ignore[attr-defined]
    base.ConversationType = list  # type: ignore[attr-defined]
    sys.modules[base.__name__] = base
    parser = types.ModuleType("skyrl_gym.envs.fleet_task.tool_call_parser")
    parser.parse_tool_call = lambda *a, **k: None  # type: ignore[attr-defined]
    sys.modules[parser.__name__] = parser

    def load(name: str, path: Path) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    folder = root / FLEET_TASK
    synth = load("skyrl_gym.envs.fleet_task.hint_synthesizer", folder / "hint_synthesizer.py")
    env = load("skyrl_gym.envs.fleet_task.env", folder / "env.py")
    return types.SimpleNamespace(synth=synth, env=env, captured=captured)


def run_reference(ref: types.SimpleNamespace, t: Dict[str, Any]) -> Dict[str, str]:
    """What the reference sends for one trajectory, and its static hint."""
    ref.captured.clear()
    text, category = asyncio.run(
        ref.synth.synthesize_hint(
            task_prompt=t["task_prompt"],
            chat_history=t["chat_history"],
            verifier_stdout=t.get("verifier_stdout"),
            verifier_error=t.get("verifier_error"),
            tool_error_messages=t.get("tool_error_messages"),
        )
    )
    assert (text, category) == ("ok", ref.synth.CATEGORY_LLM), (text, category)
    (call,) = ref.captured
    system, user = call["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    static = ref.env.FleetTaskEnv.build_hint_text(t.get("verifier_stdout"), t.get("verifier_error"), t.get("tool_error_messages"))
    return {"system": system["content"], "user": user["content"], "static_hint": static, "max_tokens": call["max_tokens"], "temperature": call["temperature"]}


def batch_facts(ref: types.SimpleNamespace) -> Dict[str, Any]:
    """synthesize_hints_batch's signature, and its log line for a batch of
    three where the LLM fails once (stubbed)."""
    import inspect
    import logging

    params = [
        {"name": p.name, "kind": p.kind.name, **({} if p.default is inspect.Parameter.empty else {"default": p.default})}
        for p in inspect.signature(ref.synth.synthesize_hints_batch).parameters.values()
    ]
    litellm = sys.modules["litellm"]
    answer = litellm.acompletion

    async def flaky(**kwargs: Any) -> Any:
        if "FAIL" in kwargs["messages"][1]["content"]:
            raise RuntimeError("stubbed failure")
        return await answer(**kwargs)

    records: List[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(ref.synth.__name__)
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    litellm.acompletion = flaky
    try:
        requests = [{"task_prompt": p, "chat_history": [], "verifier_stdout": None, "verifier_error": None, "tool_error_messages": None, "instance_id": f"i{n}"} for n, p in enumerate(["ok", "FAIL", "ok"])]
        results = asyncio.run(ref.synth.synthesize_hints_batch(hint_requests=requests, static_fallback_fn=ref.env.FleetTaskEnv.build_hint_text))
    finally:
        litellm.acompletion = answer
    (line,) = [r for r in records if r.getMessage().startswith("Hint synthesis batch")]
    return {
        "signature": params,
        "log_example": {"categories": [c for _, c in results], "level": line.levelname, "message": line.getMessage()},
    }


# ---------------------------------------------------------------- the inputs


def msg(role: str, content: Any) -> Dict[str, Any]:
    return {"role": role, "content": content}


def acc(name: str, body: str) -> str:
    return f">>> {name} >>>\n{body}\n<<< {name} <<<"


def cases() -> List[Dict[str, Any]]:
    """(name, trajectory fields) of every fixture."""
    long_text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))
    emoji_text = "é" * 2990 + "😀" * 20 + "tail"
    out: List[Dict[str, Any]] = []

    def case(name: str, **fields: Any) -> None:
        fields.setdefault("task_prompt", "Book a table for two at 7pm in the restaurant app.")
        fields.setdefault("chat_history", [])
        out.append({"name": name, **fields})

    case("empty-history-no-feedback")
    case("empty-history-verifier-error-only", verifier_error="Timeout after 300s")
    case(
        "plain-text-conversation",
        chat_history=[msg("system", "You are a helpful agent."), msg("user", "Book a table."), msg("assistant", "Calling search_restaurants."), msg("tool", "{'results': []}")],
        verifier_stdout="log line\n" + acc("ERROR_ACCUMULATOR", "['reservation not found', 'wrong party size: expected 2, got 4']"),
    )
    case(
        "both-accumulators",
        chat_history=[msg("user", "Do it."), msg("assistant", "Done.")],
        verifier_stdout="start\n" + acc("SUCCESS_ACCUMULATOR", "['logged in', \"opened 'Reservations'\"]") + "\nmiddle\n" + acc("ERROR_ACCUMULATOR", "['time is 8pm, expected 7pm']") + "\nend",
        verifier_error="AssertionError: 1 of 3 checks failed",
        tool_error_messages=["search: 404"],
    )
    case(
        "multimodal-text-and-images",
        chat_history=[
            msg("user", [{"type": "text", "text": "Find the button."}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
            msg("assistant", [{"type": "text", "text": "I see a login form."}, {"type": "text", "text": "Clicking it."}]),
            msg("user", [{"type": "image_url", "image_url": {"url": "https://example.invalid/s.png", "detail": "low"}}]),
        ],
    )
    case(
        "tool-use-with-name-and-ordered-input",
        chat_history=[msg("assistant", [{"type": "tool_use", "id": "tu_1", "name": "click", "input": {"y": 20, "x": 10, "button": "left", "double": False, "modifiers": None}}])],
    )
    case(
        "tool-use-without-a-name",
        chat_history=[msg("assistant", [{"type": "tool_use", "input": {"query": "pizza"}}, {"type": "tool_use", "name": None, "input": "raw string input"}, {"type": "tool_use"}])],
    )
    case(
        "tool-use-name-not-a-string",
        chat_history=[msg("assistant", [{"type": "tool_use", "name": 42, "input": [1, 2.5, "three", [True]]}, {"type": "tool_use", "name": ["a"], "input": {}}])],
    )
    case(
        "tool-use-long-input",
        chat_history=[msg("assistant", [{"type": "tool_use", "name": "write_file", "input": {"path": "/tmp/a.txt", "content": "x" * 800}}])],
    )
    case(
        "tool-results",
        chat_history=[
            msg("user", [{"type": "tool_result", "tool_use_id": "tu_1", "content": "clicked"}]),
            msg("user", [{"type": "tool_result", "content": [{"type": "text", "text": "nested result"}, {"type": "image_url", "image_url": {"url": "u"}}]}]),
            msg("user", [{"type": "tool_result", "is_error": True}]),
            msg("user", [{"type": "tool_result", "content": "r" * 700}]),
        ],
    )
    case(
        "other-block-types-shown-as-python-str",
        chat_history=[msg("assistant", [{"signature": "abc", "type": "thinking", "thinking": "Let me think about the 'form'."}, {"type": "redacted_thinking", "data": "Zm9v"}, {"type": "document", "source": {"type": "text", "data": "d" * 300}}])],
    )
    case(
        "text-block-without-text",
        chat_history=[msg("user", [{"type": "text"}, {"type": "text", "text": ""}, {"type": "text", "text": "after two empty"}])],
    )
    case("empty-block-list", chat_history=[msg("user", []), msg("assistant", "ok")])
    case("long-message-truncated", chat_history=[msg("tool", long_text)])
    case("message-of-exactly-3000-chars", chat_history=[msg("user", "a" * 3000), msg("user", "b" * 3001)])
    case("blocks-joined-then-truncated", chat_history=[msg("user", [{"type": "text", "text": "p" * 2000}, {"type": "text", "text": "q" * 2000}])])
    case("more-than-15-messages", chat_history=[msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(22)])
    case("history-budget-drops-the-rest", chat_history=[msg("user", "first"), msg("r" * 100_000, "second"), msg("r" * 60_000, "third"), msg("user", "fourth")])
    case("first-entry-past-the-budget", chat_history=[msg("r" * 150_000, "x"), msg("user", "never shown")])
    case("entry-exactly-at-the-budget", chat_history=[msg("r" * (150_000 - len("[]: x")), "x"), msg("user", "y")])
    case("task-prompt-past-5000-chars", task_prompt="T" * 4990 + "0123456789ABCDEF")
    case(
        "broken-error-literal-drops-both",
        verifier_stdout=acc("SUCCESS_ACCUMULATOR", "['fine']") + "\n" + acc("ERROR_ACCUMULATOR", "['unterminated"),
        verifier_error="boom",
    )
    case("broken-success-literal-drops-both", verifier_stdout=acc("ERROR_ACCUMULATOR", "['a']") + "\n" + acc("SUCCESS_ACCUMULATOR", "[foo]"))
    case("accumulator-without-closing-marker", verifier_stdout=">>> ERROR_ACCUMULATOR >>>\n['never closed']\n", tool_error_messages=["x"])
    case("accumulator-closing-marker-inside-an-item", verifier_stdout=acc("ERROR_ACCUMULATOR", "['expected <<< ERROR_ACCUMULATOR <<< in output', 'b']"))
    case("accumulator-closed-twice", verifier_stdout=">>> ERROR_ACCUMULATOR >>>\n['a',\n<<< ERROR_ACCUMULATOR <<<\n'b']\n<<< ERROR_ACCUMULATOR <<<")
    case("accumulator-on-the-marker-line-is-not-read", verifier_stdout=">>> ERROR_ACCUMULATOR >>>['a']\n<<< ERROR_ACCUMULATOR <<<", verifier_error="e")
    case(
        "accumulator-with-an-expression-drops-both",
        verifier_stdout=acc("ERROR_ACCUMULATOR", "[1, -2.5e3, None, True, ['x', [2]], {'k': (1,), 2: 'v'}, (), 1e16, 0.1, 10**0 if False else 3]")
        + "\n"
        + acc("SUCCESS_ACCUMULATOR", "[0x1F, 0o17, 0b101, 1_000_000, 123456789012345678901234567890, 1.5j, 1+2j, -0.0, ..., b'bytes\\x00']"),
    )
    case(
        "accumulator-valid-non-string-items",
        verifier_stdout=acc("ERROR_ACCUMULATOR", "[1, -2.5e3, None, True, ['x', [2]], {'k': (1,), 2: 'v'}, (), 1e16, 0.1, 1e-05, set()]")
        + "\n"
        + acc("SUCCESS_ACCUMULATOR", "[0x1F, 0o17, 0b101, 1_000_000, 123456789012345678901234567890, 1.5j, 1+2j, -0.0, ..., b'bytes\\x00', {3}]"),
    )
    case(
        "accumulator-escapes-and-quotes",
        verifier_stdout=acc(
            "ERROR_ACCUMULATOR",
            r"""['it\'s', "say \"hi\"", 'tab\there', 'nl\nx', '\x41\101\u00e9\U0001F600', r'\d+\s', 'back\\slash', '''tri'ple''', 'a' 'b', "both ' and \""]""",
        ),
    )
    case("accumulator-tuple-and-string-values", verifier_stdout=acc("ERROR_ACCUMULATOR", "('t1', 't2')") + "\n" + acc("SUCCESS_ACCUMULATOR", "'abc'"))
    case("accumulator-falsy-values", verifier_stdout=acc("ERROR_ACCUMULATOR", "[]") + "\n" + acc("SUCCESS_ACCUMULATOR", "None"), verifier_error="only this")
    case("accumulator-empty-dict-and-set", verifier_stdout=acc("ERROR_ACCUMULATOR", "{}") + "\n" + acc("SUCCESS_ACCUMULATOR", "set()"))
    case("accumulator-bytes-value", verifier_stdout=acc("ERROR_ACCUMULATOR", "b'AB'"))
    case(
        "more-than-10-checks-and-long-items",
        verifier_stdout=acc("ERROR_ACCUMULATOR", repr([f"check {i}: " + "z" * (250 if i % 3 == 0 else 5) for i in range(13)]))
        + "\n"
        + acc("SUCCESS_ACCUMULATOR", repr([f"ok {i}" for i in range(12)])),
    )
    case("accumulator-multiline-with-comments", verifier_stdout=acc("ERROR_ACCUMULATOR", "[\n    'a',  # first\n    'b',\n]"))
    case("accumulator-crlf-lines", verifier_stdout="x\r\n>>> ERROR_ACCUMULATOR >>>\n['crlf item']\r\n<<< ERROR_ACCUMULATOR <<<\r\n")
    case("accumulator-trailing-indented-line-is-an-error", verifier_stdout=acc("ERROR_ACCUMULATOR", "['a']\n  "), verifier_error="v")
    case("accumulator-too-deep", verifier_stdout=acc("ERROR_ACCUMULATOR", "[" * 201 + "]" * 201) + "\n" + acc("SUCCESS_ACCUMULATOR", "['s']"))
    case("accumulator-200-deep", verifier_stdout=acc("ERROR_ACCUMULATOR", "[" * 200 + "]" * 200))
    case("accumulator-leading-zeros-int-is-an-error", verifier_stdout=acc("ERROR_ACCUMULATOR", "[007]"))
    case("accumulator-name-is-an-error", verifier_stdout=acc("ERROR_ACCUMULATOR", "[check_a, check_b]"))
    case("accumulator-unicode-items", verifier_stdout=acc("ERROR_ACCUMULATOR", "['café', '日本語のテスト', 'مرحبا', 'e\\u0301', '\\u200b\\u2028', '😀👍🏽']"))
    case("long-verifier-error", verifier_error="E" * 450 + "é" * 100 + "END")
    case(
        "tool-errors-with-repeats",
        tool_error_messages=["bash: exit 1", "bash: exit 1", "edit: no such file", "", "bash: exit 1"] + [f"error {i}: " + "w" * 320 for i in range(12)],
    )
    case("tool-errors-empty-list-and-empty-strings", tool_error_messages=[], verifier_stdout="", verifier_error="")
    case("tool-errors-only-empty-string", tool_error_messages=["", ""])
    case(
        "non-ascii-and-emoji-messages",
        task_prompt="Réserve une table 🍽️ pour deux",
        chat_history=[msg("user", "Привет, 日本, עברית, 😀"), msg("assistant", emoji_text)],
    )
    case(
        "python-repr-escapes-in-blocks",
        chat_history=[
            msg("assistant", [{"type": "tool_use", "name": "type_text", "input": {"text": "a\tb\nc\r\\d'e", "ctrl": "\u0000\u001f\u007f\u0085\u00a0\u00ad", "uni": "\u200b\u2028\ue000\U000e0001 é 😀", "q": "it's \"both\""}}]),
            msg("assistant", [{"type": "custom", "only_single": "it's", "only_double": 'say "x"', "neither": "plain"}]),
        ],
    )
    case(
        "python-repr-numbers-in-blocks",
        chat_history=[msg("assistant", [{"type": "tool_use", "name": "n", "input": {"f": [1.0, 1e16, 1e15, 0.1, -0.0, 1.5e-7, 123456789.123456789, 2.5], "i": [0, -1, 9007199254740993, 18446744073709551615], "b": [True, False, None]}}])],
    )
    case(
        "everything",
        task_prompt="Cancel my 7pm booking and book 8pm instead.",
        chat_history=[msg("system", "sys")]
        + [msg("user", [{"type": "text", "text": f"step {i}"}, {"type": "image_url", "image_url": {"url": "x"}}]) for i in range(8)]
        + [msg("assistant", [{"type": "tool_use", "name": "cancel", "input": {"id": 7}}]), msg("user", [{"type": "tool_result", "content": "cancelled"}]), msg("assistant", "final answer " * 300)],
        verifier_stdout=acc("SUCCESS_ACCUMULATOR", "['cancelled 7pm']") + "\n" + acc("ERROR_ACCUMULATOR", "['no 8pm booking', 'party size 0']"),
        verifier_error="2 checks failed",
        tool_error_messages=["book: slot taken", "book: slot taken"],
    )
    return out


def trajectory(i: int, fields: Dict[str, Any]) -> Dict[str, Any]:
    """The FailedTrajectory message of one case."""
    t: Dict[str, Any] = {
        "schema_version": 1,
        "run_id": "reference-prompts",
        "step": 0,
        "instance_id": f"case-{i:02d}",
        "trajectory_id": f"traj-{i:02d}",
        "task_prompt": fields["task_prompt"],
        "chat_history": fields["chat_history"],
        "reward": 0.0,
    }
    for key in ("verifier_stdout", "verifier_error", "tool_error_messages"):
        if key in fields:
            t[key] = fields[key]
    return t


# ------------------------------------------------------- the literal vectors


def literal_sources(n: int) -> List[str]:
    """Curated sources plus random ones built from literal fragments and
    mutations (a fixed seed)."""
    curated = [
        "['a', 'b']", "[1, 2.0, None]", "('x',)", "{'k': [1, {'n': None}]}", "[]", "()", "{}", "set()", "[set()]",
        "['a',]", "['a' 'b']", "[r'\\d', b'\\x00']", "[1e16, 1e-5, 0.1, -0.0, 1e400]", "[0x_ff, 0o7, 0b1_0]", "[1j, -1j, 1+2j, 1.5-0j]",
        "['\\N{BULLET}']", "['\\ud800']", "[1_]", "[01]", "[00]", "[1 2]", "['a'\n'b']", "(\n'a'\n'b')", "[\\\n1]", "# c\n[1]",
        "\n  [1]", "[1]\n  ", "[1]\n  \n", "[1] # c", "[1]\r\n", "[True, False, None, ...]", "[-True]", "[--1]", "[+1, -1.5]",
        "[1 + 2]", "[2j + 1]", "[{1: 2, 1.0: 3}]", "[{[1]: 2}]", "[{(1, 2): 'tuple key'}]", "[{(1, [2]): 3}]", "f'x'", "[u'x', U'y', R'z', bR'w']",
        "'''multi\nline'''", "'bad\nline'", "b'caf\u00e9'", "['caf\u00e9', '\\xe9', '\\u00e9', '\\U0001f600']", "['\\a\\b\\f\\v\\0\\07\\777']",
        "[b'\\777\\400']", "['\\q\\w']", "[b'\\u1234\\N{X}']", "['\\x4']", "['\\U00110000']", "[1e]", "[.5, 5., 1_0.2_5e1_0]", "[1.e5j]",
        "[0xg]", "[1abc]", "[1if 1 else 2]", "[x]", "[print(1)]", "[[1][0]]", "['a'.upper()]", "[*a]", "{**{}}", "{1, 2, 3}", "{1: 2, 3}",
        "1, 2", "1,", "(1)", "((1,),)", "[(-1) + 2j]", "[-(1)]", "[-(1+2j)]", "[1 + 2j + 3]", "[~1]", "[not 1]", "[1 < 2]",
    ]
    rng = random.Random(20240601)
    atoms = [
        "'a'", '"b"', "'it\\'s'", '"q\\"x"', "r'\\d'", "b'z'", "u'\\u00e9'", "''", "'\\n\\t'", "'''t'''", "1", "-2", "0", "3.5", "-0.0", "1e16", "1e-7",
        "0x1f", "0b11", "0o7", "1_000", "2j", "1+2j", "-1-2j", "True", "False", "None", "...", "set()", "()", "[]", "{}", "'😀'", "'日本'",
        "123456789012345678901234567890",
    ]

    def value(depth: int) -> str:
        r = rng.random()
        if depth > 3 or r < 0.5:
            return rng.choice(atoms)
        items = [value(depth + 1) for _ in range(rng.randrange(0, 4))]
        kind = rng.choice(["list", "tuple", "dict"])
        sep = rng.choice([", ", ",", " , ", ",\n", ", # c\n"])
        trail = rng.choice(["", ","])
        if kind == "list":
            return "[" + sep.join(items) + (trail if items else "") + "]"
        if kind == "tuple":
            if len(items) == 1:
                return "(" + items[0] + ",)"
            return "(" + sep.join(items) + ")"
        keys = [rng.choice(["'k'", "'j'", "1", "2.0", "True", "None", "(1,)", "'😀'"]) for _ in items]
        return "{" + sep.join(f"{k}: {v}" for k, v in zip(keys, items)) + (trail if items else "") + "}"

    def mutate(s: str) -> str:
        if not s:
            return s
        i = rng.randrange(len(s))
        op = rng.random()
        if op < 0.4:
            return s[:i] + s[i + 1 :]
        if op < 0.8:
            return s[:i] + rng.choice(list("[](){}'\",:#\\\n _.0xjeEbru+-")) + s[i:]
        return s[:i] + s[i:][::-1]

    out = list(curated)
    while len(out) < n:
        s = value(0)
        if rng.random() < 0.35:
            s = mutate(s)
        if rng.random() < 0.1:
            s = mutate(s)
        out.append(s)
    return out


def has_unordered_set(v: Any) -> bool:
    if isinstance(v, (set, frozenset)):
        return len(v) > 1 or any(has_unordered_set(x) for x in v)
    if isinstance(v, (list, tuple)):
        return any(has_unordered_set(x) for x in v)
    if isinstance(v, dict):
        return any(has_unordered_set(k) or has_unordered_set(x) for k, x in v.items())
    return False


def has_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(has_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(has_surrogate(k) or has_surrogate(x) for k, x in v.items())
    return False


def literal_vectors(n: int) -> List[Dict[str, Optional[str]]]:
    vectors = []
    seen = set()
    for source in literal_sources(n):
        if source in seen:
            continue
        seen.add(source)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                value = ast.literal_eval(source)
            except Exception:
                vectors.append({"source": source, "repr": None})
                continue
        if has_unordered_set(value) or has_surrogate(value):
            continue  # no fixed text (hash order), or not representable in UTF-8
        vectors.append({"source": source, "repr": repr(value)})
    return vectors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--git-dir", default=os.environ.get("SKYRL_FLEET_GIT_DIR"), required=os.environ.get("SKYRL_FLEET_GIT_DIR") is None)
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args()
    if sys.version_info[:2] != (3, 12):
        print(f"warning: run with CPython 3.12 (this is {sys.version.split()[0]})", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        commit = checkout(args.git_dir, args.commit, Path(tmp))
        ref = load_reference(Path(tmp))
        fixtures = []
        system = None
        for i, fields in enumerate(cases()):
            t = trajectory(i, fields)
            got = run_reference(ref, t)
            assert system in (None, got["system"])
            system = got["system"]
            assert (got["max_tokens"], got["temperature"]) == (300, 0.3)
            fixtures.append({"name": fields["name"], "trajectory": t, "user": got["user"], "static_hint": got["static_hint"]})
        batch = batch_facts(ref)

    source = {
        "repository": "fleet-ai/SkyRL-Fleet",
        "commit": commit,
        "functions": [
            f"{FLEET_TASK}/hint_synthesizer.py: synthesize_hint (the messages of its litellm call)",
            f"{FLEET_TASK}/env.py: FleetTaskEnv.build_hint_text",
        ],
        "python": sys.version.split()[0],
        "generated_by": "scripts/reference-prompt-fixtures.py",
    }
    prompts = {"source": source, "max_tokens": 300, "temperature": 0.3, "synthesize_hints_batch": batch, "system": system, "cases": fixtures}
    out = ROOT / "schemas" / "fixtures" / "reference_prompts.json"
    out.write_text(json.dumps(prompts, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out}: {len(fixtures)} cases", file=sys.stderr)

    vectors = literal_vectors(600)
    lit = {
        "source": {"function": "repr(ast.literal_eval(source)), null where it raises", "python": sys.version.split()[0], "generated_by": "scripts/reference-prompt-fixtures.py"},
        "vectors": vectors,
    }
    out = ROOT / "schemas" / "fixtures" / "python_literals.json"
    out.write_text(json.dumps(lit, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out}: {len(vectors)} vectors ({sum(v['repr'] is None for v in vectors)} refused)", file=sys.stderr)


if __name__ == "__main__":
    main()
