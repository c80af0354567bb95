"""A run id and group ids outside ASCII go through the whole pipeline: the
stages (Rust) and the client (Python) build the same keys, so the client
finds its hints, its step's advantages and its metrics (with keys that
differed, wait_advantages and wait_metrics never found the step)."""

from __future__ import annotations

import asyncio
import random
import uuid

from loop import FAILED_GROUPS, run_step


def test_a_non_ascii_run_id_gets_its_hints_advantages_and_metrics(make_pipeline, make_client) -> None:
    pipeline = make_pipeline()
    client = make_client(pipeline.bootstrap, pipeline.topics)
    run_id = f"exp-é-实验-🚀-{uuid.uuid4().hex[:6]}"
    for arrow in (False, True):
        try:
            s = asyncio.run(run_step(client, run_id, int(arrow), random.Random(3), arrow=arrow))
        except Exception:
            print(pipeline.logs())
            raise
        assert len(s.hints) == FAILED_GROUPS
        assert all(category == "llm_synthesized" for _, category in s.hints), s.hints
        assert s.advantages.num_rows == len(s.rows)
        assert s.advantages.column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in s.rows]
        assert s.metrics["hint/prompts_hinted"] == FAILED_GROUPS
