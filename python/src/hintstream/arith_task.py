"""A built-in verifiable task for real GRPO runs: small arithmetic word
problems with a required answer format, made from a seed, and a verifier
whose feedback says what was wrong without giving the answer away.

Pure Python (no torch): :func:`problems` makes the data set's rows,
:func:`reward` scores a completion (the TRL reward function is
:func:`reward_func`), :func:`feedback` is the ``feedback_fn`` of
:class:`hintstream.trl.HintstreamGRPOTrainer`.

Each prompt is a short conversation: one worked example (a user question and
the assistant's answer in the required format), then the problem. Without
the example SmolLM2-135M-Instruct wrote the ``Answer:`` line in 8% of its
replies; with it, in 86%.

Difficulty (``level``): 1 is one operation on numbers under 20; 2 is two
operations; 3 is two operations on larger numbers. Untrained, SmolLM2-135M-
Instruct solved level 1 in 7.8% and level 2 in 4.7% of 64 samples at
temperature 1 (docs/BENCHMARKS.md, "A real run")."""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: The line every reply must end with.
ANSWER_FORMAT = "Answer: <number>"

INSTRUCTION = f"Give the result on the last line as '{ANSWER_FORMAT}'."

#: The worked example every prompt starts with (not one of the problems).
EXAMPLE = [
    {"role": "user", "content": f"Tom has 3 apples and gets 2 more. How many apples does Tom have?\n{INSTRUCTION}"},
    {"role": "assistant", "content": "Tom has 3 + 2 = 5 apples.\nAnswer: 5"},
]

_ANSWER_RE = re.compile(r"answer\s*[:=]\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)

NAMES = ("Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea")
ITEMS = ("apples", "marbles", "stickers", "pencils", "coins", "cards", "shells", "books")

Problem = Tuple[str, int]


def _add_sub(rng: random.Random, hi: int) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, hi), rng.randint(2, hi)
    c = rng.randint(1, a + b - 1)
    return f"{who} has {a} {item}. {who} gets {b} more, then gives away {c}. How many {item} does {who} have now?", a + b - c


def _times_minus(rng: random.Random, hi: int) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    boxes, per = rng.randint(2, max(3, hi // 3)), rng.randint(2, max(3, hi // 2))
    used = rng.randint(1, boxes * per - 1)
    return f"{who} buys {boxes} packs of {per} {item} and uses {used} of them. How many {item} are left?", boxes * per - used


def _share(rng: random.Random, hi: int) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each = rng.randint(2, max(3, hi // 3)), rng.randint(2, max(3, hi // 2))
    extra = rng.randint(1, hi)
    return (
        f"{who} has {friends * each} {item} and shares them equally among {friends} friends. "
        f"Then each friend finds {extra} more. How many {item} does each friend have now?",
        each + extra,
    )


def _one_step(rng: random.Random, hi: int) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, hi), rng.randint(2, hi)
    if rng.random() < 0.5:
        return f"{who} has {a} {item} and gets {b} more. How many {item} does {who} have?", a + b
    a, b = max(a, b), min(a, b)
    return f"{who} has {a} {item} and gives away {b}. How many {item} are left?", a - b


def problem(rng: random.Random, level: int) -> Problem:
    """One (question, answer) pair at ``level`` (1 to 3)."""
    if level <= 1:
        return _one_step(rng, 19)
    hi = 20 if level == 2 else 60
    return rng.choice((_add_sub, _times_minus, _share))(rng, hi)


def prompt_text(question: str) -> str:
    """The user message of a problem: the question and the format rule."""
    return f"{question}\n{INSTRUCTION}"


def problems(n: int, seed: int, level: int = 1) -> List[Dict[str, Any]]:
    """``n`` rows for a ``datasets.Dataset``: ``prompt`` (the worked example,
    then the problem as the last user message), ``answer`` (an int) and
    ``task_id`` (stable over runs of the same seed)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, answer = problem(rng, level)
        prompt = [dict(m) for m in EXAMPLE] + [{"role": "user", "content": prompt_text(question)}]
        rows.append({"prompt": prompt, "answer": answer, "task_id": f"arith-{seed}-{i}-l{level}"})
    return rows


def _text(completion: Any) -> str:
    """A completion as text: TRL passes a list of messages for
    conversational prompts, a string otherwise."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def parse_answer(text: str) -> Optional[float]:
    """The number on the reply's last ``Answer: N`` line, or ``None``."""
    found = _ANSWER_RE.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def reward(completion: Any, answer: int) -> float:
    """1.0 when the reply's ``Answer:`` value equals ``answer``, else 0.0."""
    got = parse_answer(_text(completion))
    return 1.0 if got is not None and got == float(answer) else 0.0


def reward_func(completions: List[Any], answer: List[int], **_: Any) -> List[float]:
    """The TRL reward function (it receives the data set's ``answer``
    column)."""
    return [reward(c, a) for c, a in zip(completions, answer)]


def _last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


def feedback_for(answer: int) -> Callable[[Any, Any], str]:
    """The verifier's feedback for a problem whose answer is ``answer``."""

    def feedback(prompt: Any, completion: Any) -> str:
        del prompt
        text = _text(completion)
        got = parse_answer(text)
        if got is None:
            if not text.strip():
                return f"The reply was empty. It must end with the line '{ANSWER_FORMAT}'."
            return f"The reply has no line '{ANSWER_FORMAT}', so no answer could be read. End with that line, a plain integer after 'Answer:'."
        if got != int(got):
            return f"The answer {got:g} is not a whole number; the quantity asked for is a count."
        direction = "too high" if got > answer else "too low"
        return f"The answer {int(got)} is wrong ({direction}). Recompute each step of the arithmetic in order."

    return feedback


class Verifier:
    """``feedback_fn(prompt, completion) -> str`` for the problems of one
    data set: finds a prompt's answer by its question text."""

    def __init__(self, rows: Sequence[Dict[str, Any]]) -> None:
        self._answers = {_last_user_text(r["prompt"]): int(r["answer"]) for r in rows}

    def __call__(self, prompt: Any, completion: Any) -> str:
        answer = self._answers.get(_last_user_text(prompt))
        if answer is None:
            return "The verifier does not know this task."
        return feedback_for(answer)(prompt, completion)
