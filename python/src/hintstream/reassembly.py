"""Chunked steps put back together: the messages of an advantages topic
gathered into whole steps, never a partial one, by the rules of
``src/tools/reassemble.rs`` (see its module docs), so that the trainer and
``hintstream record`` / ``eval`` see the same steps; the shared vectors in
``schemas/vectors/chunks.json`` hold both readers to them.

- A step's chunks are gathered by key (``run_id/step``) and attempt (header
  ``hintstream.attempt``: one publication of the step), never mixing two
  attempts; :func:`hintstream.wire.chunk_info` reads where a message sits
  (no chunk headers: a whole step, chunk 0 of 1).
- Chunks without an attempt header (older writers) are one attempt of their
  own. Within an attempt, a chunk with another ``chunks`` or ``rows`` than
  the chunks gathered so far starts the set over (in its place among the
  attempts); a chunk index seen before keeps its first copy.
- At most :data:`MAX_ATTEMPTS_PER_STEP` attempts of a key are gathered at
  once; a further one drops the oldest (the attempt seen first).
- Once all ``chunks`` of an attempt are in, they are concatenated in index
  order and the step is returned; rows that differ from the ``rows`` header
  discard it (``ValueError``). Each attempt that completes is returned, so
  the last one returned wins.
- A message whose key, headers or Arrow payload cannot be read raises
  ``ValueError`` and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pyarrow as pa

from . import wire
from .bounded import Bounded

#: How many attempts of one step are gathered at once (a step republished
#: over and over must not grow a reader without bound); a further attempt
#: drops the oldest. The Rust reassembler (src/tools) has the same bound.
MAX_ATTEMPTS_PER_STEP = 4


@dataclass
class Step:
    """One whole step."""

    #: Its key, ``run_id/step``.
    key: str
    #: Its rows, chunk by chunk in index order.
    table: pa.Table
    #: How many messages it came in.
    chunks: int


@dataclass(frozen=True)
class Partial:
    """A step whose chunks have not all arrived: those of its attempt
    closest to complete."""

    key: str
    arrived: int
    count: int


@dataclass
class _ChunkSet:
    """The chunks of one attempt of a step received so far."""

    count: int
    rows: Optional[int]
    parts: Dict[int, pa.Table] = field(default_factory=dict)


@dataclass
class _StepAttempts:
    """The attempts of one step being gathered, by attempt header (``None``:
    chunks without one), oldest first."""

    sets: Dict[Optional[bytes], _ChunkSet] = field(default_factory=dict)
    #: An attempt of the step completed already: the others are not reported.
    completed: bool = False


class Reassembler:
    """Gathers messages into whole steps, one message at a time, in the
    order they were read. ``max_steps`` bounds the steps gathered at once
    (the oldest is dropped past it, counted in :attr:`evicted`); none by
    default."""

    def __init__(self, max_steps: Optional[int] = None) -> None:
        self._steps: Bounded = Bounded(max_steps, "incomplete advantage steps")

    @property
    def evicted(self) -> int:
        """Incomplete steps dropped at the ``max_steps`` bound."""
        return self._steps.evicted

    def push(self, key: Optional[bytes], headers: wire.Headers, payload: Optional[bytes]) -> Optional[Step]:
        """Adds one message; returns the step it completes, if any.
        ``ValueError`` when the message cannot be read (it is skipped) or
        when the step it completes disagrees with its ``rows`` header (it is
        discarded)."""
        try:
            step_key = (key or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the key is not UTF-8") from None
        info = wire.chunk_info(headers)
        try:
            table = wire.read_ipc_stream(payload or b"")
        except pa.ArrowException as e:
            raise ValueError(f"not an Arrow IPC stream: {e}") from None
        attempt = wire.header(headers, wire.ATTEMPT_HEADER)
        attempts = self._steps.get(step_key)
        if attempts is None:
            attempts = self._steps[step_key] = _StepAttempts()
            self._steps.trim()
        state = attempts.sets.get(attempt)
        if state is None or state.count != info.count or state.rows != info.rows:
            # A first chunk, or a chunk set that starts over with another
            # shape: in its place (assigning to a key keeps its position).
            if state is None and len(attempts.sets) >= MAX_ATTEMPTS_PER_STEP:
                del attempts.sets[next(iter(attempts.sets))]
            state = attempts.sets[attempt] = _ChunkSet(info.count, info.rows)
        state.parts.setdefault(info.index, table)
        if len(state.parts) < state.count:
            return None
        del attempts.sets[attempt]
        attempts.completed = True
        if not attempts.sets:
            self._steps.pop(step_key, None)
        try:
            whole = pa.concat_tables([state.parts[i] for i in range(state.count)]) if state.count > 1 else state.parts[0]
        except pa.ArrowException as e:
            raise ValueError(f"chunks of {step_key} do not share one schema ({e}); step discarded") from None
        if state.rows is not None and whole.num_rows != state.rows:
            raise ValueError(f"chunks of {step_key} hold {whole.num_rows} rows, headers say {state.rows}; step discarded")
        return Step(step_key, whole, state.count)

    def partial_of(self, key: str) -> Optional[Partial]:
        """Step ``key`` if it is incomplete: the attempt closest to complete
        (the later one on a tie), unless another attempt of it completed."""
        attempts = self._steps.get(key)
        if attempts is None or attempts.completed or not attempts.sets:
            return None
        best = None
        for s in attempts.sets.values():
            share = len(s.parts) * 1_000_000 // max(s.count, 1)
            if best is None or share >= best[0]:
                best = (share, s)
        assert best is not None  # sets is not empty
        return Partial(key, len(best[1].parts), best[1].count)

    def partial(self) -> List[Partial]:
        """Every incomplete step (:meth:`partial_of`), by key."""
        found = (self.partial_of(key) for key in list(self._steps))
        return sorted((p for p in found if p is not None), key=lambda p: p.key)
