"""One training step as a trainer runs it through hintstream, used by the
tests and by scripts/bench-trainer-client.sh: hint requests for the failed
groups through the drop-in, hinted retries scored, then the step's
advantages and metrics."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import pyarrow as pa

import hintstream
from hintstream import TrainerClient, apply_hint

#: Groups whose raw rollouts all failed (they get a hint) and groups with a
#: success (no hint), per step.
FAILED_GROUPS = 16
PASSING_GROUPS = 4
RAW_PER_GROUP = 4
HINTED_PER_GROUP = 2


@dataclass
class Step:
    requests: List[Dict[str, Any]]
    tokens: List[str]
    hints: List[Tuple[str, str]]
    rows: List[Dict[str, Any]]
    advantages: pa.Table
    metrics: Dict[str, Any]
    seconds: Dict[str, float] = field(default_factory=dict)


def hint_requests(step: int, rng: random.Random, groups: int = FAILED_GROUPS) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The reference generator's hint requests for ``groups`` failed groups,
    each carrying its own token in the verifier output."""
    requests, tokens = [], []
    for i in range(groups):
        token = f"TOKEN-{uuid.uuid4().hex}"
        tokens.append(token)
        task = f"Task {i} of step {step}: make the parser tests pass."
        requests.append(
            {
                "task_prompt": task,
                "chat_history": [
                    {"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": task},
                    {"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {"cmd": "pytest -x"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "content": "1 failed"}]},
                    {"role": "assistant", "content": None},
                ],
                "verifier_stdout": f"running\n>>> ERROR_ACCUMULATOR >>>\n['check {token} failed', 'test_{i}: expected 3']\n<<< ERROR_ACCUMULATOR <<<",
                "verifier_error": f"{token}: assertion failed",
                "tool_error_messages": ["bash: exit status 1"],
                # '/' and '%' in group ids: every key must stay distinct.
                "instance_id": f"repo/issue-{i}%{rng.randrange(1000)}",
            }
        )
    return requests, tokens


def scored_rows(requests: List[Dict[str, Any]], hints: List[Tuple[str, str]], rng: random.Random) -> List[Dict[str, Any]]:
    """Raw rows (all failed for the hinted groups), hinted retries with
    their own trajectory_ids and the hint's category, and passing groups
    without hints; shuffled, so input order is not group order."""
    rows: List[Dict[str, Any]] = []
    for request, (hint, category) in zip(requests, hints):
        iid = request["instance_id"]
        for r in range(RAW_PER_GROUP):
            rows.append({"instance_id": iid, "trajectory_id": f"{iid}/raw-{r}", "reward": rng.choice([0.0, 0.0, -0.25, -1.0]), "is_hinted": False})
        assert apply_hint(request["task_prompt"], hint).endswith(hint)
        for h in range(HINTED_PER_GROUP):
            reward = rng.choice([0.0, 0.0, 1.0, 0.5, rng.random()])
            rows.append({"instance_id": iid, "trajectory_id": f"{iid}/hinted-{h}", "reward": reward, "is_hinted": True, "hint_category": category})
    for g in range(PASSING_GROUPS):
        iid = f"passing-{g}-{rng.randrange(10**6)}"
        for r in range(RAW_PER_GROUP):
            rows.append({"instance_id": iid, "trajectory_id": f"{iid}/raw-{r}", "reward": rng.choice([1.0, 0.0, rng.random()]), "is_hinted": False})
    rng.shuffle(rows)
    return rows


async def run_step(client: TrainerClient, run_id: str, step: int, rng: random.Random, arrow: bool = False, hint_timeout: float = 30.0, wait_timeout: float = 60.0) -> Step:
    """One step: hints through the drop-in, scored rows published, advantages
    and metrics awaited."""
    t0 = time.monotonic()
    requests, tokens = hint_requests(step, rng)
    hints = await hintstream.synthesize_hints_batch(requests, model="openrouter/anthropic/claude-sonnet-4", timeout=hint_timeout, client=client, run_id=run_id, step=step)
    t1 = time.monotonic()
    rows = scored_rows(requests, hints, rng)
    client.publish_scored(run_id, step, rows, arrow=arrow)
    advantages = client.wait_advantages(run_id, step, timeout=wait_timeout)
    t2 = time.monotonic()
    metrics = client.wait_metrics(run_id, step, timeout=wait_timeout)
    t3 = time.monotonic()
    return Step(requests, tokens, hints, rows, advantages, metrics, {"hints": t1 - t0, "advantages": t2 - t1, "metrics": t3 - t2, "step": t3 - t0})
