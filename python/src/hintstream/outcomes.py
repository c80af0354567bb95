"""Hint outcomes from the trainer's side: the hints a client delivered, the
``hint_id`` they put on hinted rows, and :func:`report_hint_outcomes` for a
trainer that keeps its own advantages (stage 2 publishes outcomes for the
others).

- A :class:`~hintstream.TrainerClient` remembers every hint it handed over
  (``wait_hints``, which the drop-in uses) by its group ``(run_id, step,
  instance_id)`` and by its ``hint_id``, at most ``max_buffered_groups``
  of them (oldest forgotten first).
- ``publish_scored`` (through :func:`fill_hint_ids`) gives a hinted row that
  has no ``hint_id`` the id of the hint delivered for its group; a row that
  names one keeps it.
- :func:`outcome_messages` turns ``{hint_id, reward}`` rows into one
  ``HintOutcome`` per ``hint_id`` (run, step and group from the delivered
  hint), keyed by the group: what ``TrainerClient.report_hint_outcomes``
  publishes (and :func:`hintstream.report_hint_outcomes`, with the
  drop-in's client by default).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from . import wire
from .keys import group_key

#: The group a delivered hint belongs to: (run_id, step, instance_id).
Group = Tuple[str, int, str]


class DeliveredHints:
    """The hints a client handed over, by group and by ``hint_id``, bounded
    (the oldest delivered is forgotten first). Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self._lock = threading.Lock()
        self._by_group: "collections.OrderedDict[Group, str]" = collections.OrderedDict()
        self._by_id: Dict[str, Group] = {}

    def add(self, hint: Mapping[str, Any]) -> None:
        """Remembers one delivered ``Hint`` (a dict as ``wait_hints`` returns)."""
        try:
            hint_id = str(hint["hint_id"])
            group: Group = (str(hint["run_id"]), int(hint["step"]), str(hint["instance_id"]))
        except (KeyError, TypeError, ValueError):
            return
        with self._lock:
            old = self._by_group.pop(group, None)
            if old is not None:
                self._by_id.pop(old, None)
            self._by_group[group] = hint_id
            self._by_id[hint_id] = group
            while len(self._by_group) > self.limit:
                _, dropped = self._by_group.popitem(last=False)
                self._by_id.pop(dropped, None)

    def hint_id_of(self, run_id: str, step: int, instance_id: str) -> Optional[str]:
        """The ``hint_id`` delivered for the group, if any."""
        with self._lock:
            return self._by_group.get((run_id, int(step), instance_id))

    def group_of(self, hint_id: str) -> Optional[Group]:
        """The group of a delivered hint, if it is remembered."""
        with self._lock:
            return self._by_id.get(hint_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_group)


def fill_hint_ids(delivered: DeliveredHints, run_id: str, step: int, rows: Iterable[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """``rows`` with ``hint_id`` set on each hinted row that lacks one, from
    the hint delivered for its group (a row without a delivered hint, or
    that names one already, is left as it is)."""
    out: List[Mapping[str, Any]] = []
    for row in rows:
        if row.get("is_hinted") and row.get("hint_id") is None and "instance_id" in row:
            hint_id = delivered.hint_id_of(run_id, step, str(row["instance_id"]))
            if hint_id is not None:
                row = {**row, "hint_id": hint_id}
        out.append(row)
    return out


def outcome_messages(delivered: DeliveredHints, rows: Iterable[Mapping[str, Any]], success_threshold: float = 0.0) -> List[Tuple[str, Dict[str, Any]]]:
    """One ``(key, HintOutcome)`` per ``hint_id`` of ``rows`` (``{hint_id,
    reward}``, and ``logprob_hinted``, ``logprob_unhinted`` and
    ``response_length`` where the trainer has them: ``transfer`` and
    ``reliance`` then come with the outcome), in first-seen order, by stage 2's counting rules
    (``advantages/outcomes.rs``; both are held to
    ``schemas/vectors/outcomes.json``): a row whose ``is_hinted`` is false
    ran without the hint it names and is left out. ``ValueError`` for any
    other row without ``hint_id`` or ``reward``, a ``hint_id`` this client
    did not deliver (naming it), or a non-finite reward."""
    rewards: "collections.OrderedDict[str, List[float]]" = collections.OrderedDict()
    logprobs: Dict[str, List[Optional[Tuple[float, float, int]]]] = {}
    for i, row in enumerate(rows):
        if "is_hinted" in row and not row["is_hinted"]:
            continue
        try:
            hint_id, reward = str(row["hint_id"]), float(row["reward"])
        except KeyError as e:
            raise ValueError(f"outcome row {i} has no {e.args[0]!r}") from None
        rewards.setdefault(hint_id, []).append(reward)
        logprobs.setdefault(hint_id, []).append(_logprobs(i, row))
    out = []
    for hint_id, values in rewards.items():
        group = delivered.group_of(hint_id)
        if group is None:
            raise ValueError(
                f"hint_id {hint_id!r} was not delivered by this client (or was forgotten): its run, step and group are unknown"
            )
        run_id, step, instance_id = group
        message = wire.hint_outcome(
            hint_id=hint_id,
            run_id=run_id,
            step=step,
            instance_id=instance_id,
            rewards=values,
            success_threshold=success_threshold,
            logprobs=logprobs[hint_id],
        )
        out.append((group_key(run_id, step, instance_id), message))
    return out


def _logprobs(i: int, row: Mapping[str, Any]) -> Optional[Tuple[float, float, int]]:
    """Row i's ``(logprob_hinted, logprob_unhinted, response_length)`` when
    it carries both log-probs (checked as ``scored_rows`` checks them), else
    None. ``ValueError`` for a bad value or log-probs without a length."""
    if row.get("logprob_hinted") is None or row.get("logprob_unhinted") is None:
        return None
    if row.get("response_length") is None:
        raise ValueError(f"outcome row {i} has log-probs but no response_length (the log-probs are per token)")
    return (
        wire._logprob(i, "logprob_hinted", row["logprob_hinted"]),
        wire._logprob(i, "logprob_unhinted", row["logprob_unhinted"]),
        wire._response_length(i, row["response_length"]),
    )
