"""The client never reads the topics' history: with 30,000 old hints and
2,000 old advantage messages on the topics, a step receives only its own
messages and costs what it did before (scripts/bench-trainer-client.sh
measures the ratio)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from harness import put_history
from loop import FAILED_GROUPS, run_step

STEPS = 3


def test_a_step_reads_only_its_own_messages_after_a_long_history(make_pipeline, make_client) -> None:
    pipeline = make_pipeline()
    t = pipeline.topics
    rng = random.Random(3)

    before = make_client(pipeline.bootstrap, t)
    run_id = f"py-hist-{uuid.uuid4().hex[:6]}"
    fresh = [asyncio.run(run_step(before, run_id, s, rng)).seconds["step"] for s in range(STEPS)]

    seconds = put_history(pipeline.bootstrap, t, hints=30_000, advantages=2_000)
    print(f"\nhistory: 30,000 hints + 2,000 advantage messages in {seconds:.1f} s")

    client = make_client(pipeline.bootstrap, t)
    started = time.monotonic()
    after = [asyncio.run(run_step(client, run_id, s, rng)).seconds["step"] for s in range(STEPS, 2 * STEPS)]
    print(f"per step: {sorted(fresh)[STEPS // 2]:.2f} s fresh, {sorted(after)[STEPS // 2]:.2f} s after the history ({time.monotonic() - started:.1f} s)")

    stats = client.stats
    print(f"second client's messages: {stats}")
    # Only this client's steps: 16 hints per step (a redelivered copy at
    # most), one advantages message and one metrics message per step.
    assert stats.get(t.hints, 0) <= 2 * STEPS * FAILED_GROUPS, stats
    assert stats.get(t.advantages, 0) == STEPS, stats
    assert stats.get(t.metrics, 0) == STEPS, stats
    assert stats.get("evicted", 0) == 0, stats
