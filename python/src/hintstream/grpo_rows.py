"""The rows of one GRPO step as hintstream sees them, for a trainer adapter
(``hintstream.trl``): group ids, the all-failed groups and the
``FailedTrajectory`` of each, the hint each group gets (stage 1's, or the
static fallback at the deadline), the hinted prompt, the scored rows, and
the advantages of stage 2 matched back to the rows. Pure Python: no torch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import pyarrow as pa

from . import wire
from .dropin import apply_hint
from .static_hint import static_hint_for
from .wire import CATEGORY_LLM_FAILED

#: ``feedback_fn(prompt, completion) -> str``: what the verifier says about
#: a failed completion (sent as the trajectory's ``verifier_error``).
FeedbackFn = Callable[[Any, Any], str]


@dataclass
class Rollout:
    """One completion of a step, raw or hinted."""

    instance_id: str
    trajectory_id: str
    prompt: Any
    completion: Any
    reward: float
    response_length: int
    is_hinted: bool = False
    hint_id: Optional[str] = None
    hint_category: Optional[str] = None
    logprob_hinted: Optional[float] = None
    logprob_unhinted: Optional[float] = None
    #: The completion's token ids (what the loss trains on).
    completion_ids: Optional[List[int]] = None
    #: The data set row it came from (its columns go to the reward functions).
    source: Optional[Mapping[str, Any]] = None

    def scored_row(self) -> Dict[str, Any]:
        """The row ``TrainerClient.publish_scored`` takes."""
        row: Dict[str, Any] = {
            "instance_id": self.instance_id,
            "trajectory_id": self.trajectory_id,
            "reward": float(self.reward),
            "is_hinted": self.is_hinted,
            "response_length": int(self.response_length),
        }
        for name in ("hint_id", "hint_category", "logprob_hinted", "logprob_unhinted"):
            value = getattr(self, name)
            if value is not None:
                row[name] = value
        return row


@dataclass
class GroupHint:
    """The hint a failed group runs with."""

    text: str
    category: str
    hint_id: Optional[str]


def group_ids(task_ids: Sequence[str]) -> List[str]:
    """One distinct instance id per group of the step: the group's task id,
    ``<task id>#<n>`` when a task repeats within the step."""
    seen: Dict[str, int] = {}
    out = []
    for task in task_ids:
        n = seen.get(task, 0)
        seen[task] = n + 1
        out.append(task if n == 0 else f"{task}#{n}")
    return out


def task_text(prompt: Any) -> str:
    """The task a prompt states: its last user message's text (a string
    prompt is its own text)."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content", "")
            return content if isinstance(content, str) else str(content)
    return ""


def hinted_prompt(prompt: Any, hint: str) -> Any:
    """``prompt`` with the hint applied to its task (``apply_hint``): the
    last user message of a conversation, or the string itself."""
    if isinstance(prompt, str):
        return apply_hint(prompt, hint)
    messages = copy.deepcopy(list(prompt))
    for message in reversed(messages):
        if message.get("role") == "user":
            message["content"] = apply_hint(task_text([message]), hint)
            break
    return messages


def best_of_failed_groups(rollouts: Sequence[Rollout], threshold: float) -> Dict[str, Rollout]:
    """The best (highest reward, first on ties) raw rollout of each group
    whose best reward is at most ``threshold``, by instance id, in order."""
    best: Dict[str, Rollout] = {}
    for r in rollouts:
        if r.is_hinted:
            continue
        if r.instance_id not in best or r.reward > best[r.instance_id].reward:
            best[r.instance_id] = r
    return {iid: r for iid, r in best.items() if r.reward <= threshold}


def _chat(prompt: Any, completion: Any) -> List[Any]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if isinstance(completion, str):
        return messages + [{"role": "assistant", "content": completion}]
    return messages + list(completion)


def failed_trajectory(run_id: str, step: int, best: Rollout, feedback_fn: Optional[FeedbackFn]) -> Dict[str, Any]:
    """The ``FailedTrajectory`` of a failed group's best rollout: the task,
    the conversation with the completion, the verifier's feedback as
    ``verifier_error``."""
    feedback = feedback_fn(best.prompt, best.completion) if feedback_fn is not None else None
    return wire.failed_trajectory(
        run_id=run_id,
        step=step,
        instance_id=best.instance_id,
        task_prompt=task_text(best.prompt),
        chat_history_messages=_chat(best.prompt, best.completion),
        verifier_error=feedback,
        reward=best.reward,
        trajectory_id=best.trajectory_id,
        group_size=1,
    )


def resolve_hints(trajectories: Sequence[Mapping[str, Any]], received: Mapping[str, Mapping[str, Any]]) -> Dict[str, GroupHint]:
    """Each failed group's hint: stage 1's when it arrived, else the static
    hint of its trajectory (category ``llm_failed_static_fallback``, as the
    drop-in falls back at its deadline)."""
    out = {}
    for t in trajectories:
        iid = t["instance_id"]
        hint = received.get(iid)
        text = hint.get("hint") if hint is not None else None
        if hint is not None and isinstance(text, str) and text:
            out[iid] = GroupHint(text, str(hint.get("category", wire.CATEGORY_LLM)), str(hint["hint_id"]))
        else:
            out[iid] = GroupHint(static_hint_for(t), CATEGORY_LLM_FAILED, None)
    return out


def advantages_for(table: pa.Table, trajectory_ids: Sequence[str]) -> "tuple[List[float], Optional[List[float]]]":
    """Stage 2's ``advantage`` (and ``weight``, when the table has it) of
    each row, in the order of ``trajectory_ids``. Raises ``ValueError`` when
    a row is missing."""
    ids = table.column("trajectory_id").to_pylist()
    advantage = dict(zip(ids, table.column("advantage").to_pylist()))
    weight = dict(zip(ids, table.column("weight").to_pylist())) if "weight" in table.column_names else None
    missing = [t for t in trajectory_ids if t not in advantage]
    if missing:
        raise ValueError(f"stage 2's advantages lack {len(missing)} of the step's rows (first: {missing[0]!r})")
    return [float(advantage[t]) for t in trajectory_ids], (None if weight is None else [float(weight[t]) for t in trajectory_ids])
