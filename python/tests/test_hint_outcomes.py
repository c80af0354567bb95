"""Outcomes from the trainer's side, on a real broker with both stages: the
client fills ``hint_id`` on hinted rows of groups whose hint it delivered
(through the drop-in), stage 2 counts them in its per-arm step metrics, and
``hintstream.report_hint_outcomes`` publishes one ``HintOutcome`` per
``hint_id`` as stage 1 reads them (keyed by the group, the schema's fields)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness import create_topics

import hintstream
from hintstream import group_key, step_key

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "hint_outcome.schema.json").read_text())


def read_all(bootstrap: str, topic: str, want: int, within: float = 30.0):
    """(key, value) of the messages on ``topic``, read from the start until
    ``want`` arrived or ``within`` passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out, deadline = [], time.monotonic() + within
        while len(out) < want and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                out.append((m.key().decode(), json.loads(m.value())))
        return out
    finally:
        consumer.close()


def requests_for(n: int):
    return [
        {
            "task_prompt": f"Task {i}",
            "chat_history": [{"role": "user", "content": f"Task {i}"}],
            "verifier_stdout": f">>> ERROR_ACCUMULATOR >>>\n['TOKEN-{uuid.uuid4().hex} failed']\n<<< ERROR_ACCUMULATOR <<<",
            "verifier_error": None,
            "tool_error_messages": None,
            "instance_id": f"task-{i}",
        }
        for i in range(n)
    ]


def test_delivered_hints_fill_hint_id_and_report_hint_outcomes_publishes_them(make_pipeline, make_client) -> None:
    pipeline = make_pipeline()
    topics = dataclasses.replace(pipeline.topics, outcomes=f"{pipeline.topics.hints}.outcomes")
    create_topics(pipeline.bootstrap, [topics.outcomes], 1)
    client = make_client(pipeline.bootstrap, topics)
    run_id, step = f"outcomes-{uuid.uuid4().hex[:8]}", 3
    results = asyncio.run(hintstream.synthesize_hints_batch(requests_for(2), timeout=60.0, client=client, run_id=run_id, step=step))
    assert [c for _, c in results] == [hintstream.CATEGORY_LLM] * 2, pipeline.logs()
    hints = {h["instance_id"]: h for _, h in read_all(pipeline.bootstrap, topics.hints, 2)}
    ids = {iid: hints[iid]["hint_id"] for iid in ("task-0", "task-1")}

    # Hinted rows without hint_id: the client fills in the delivered hint's.
    rows = []
    for i, iid in enumerate(("task-0", "task-1")):
        rows.append({"instance_id": iid, "trajectory_id": f"{iid}-raw", "reward": 0.0, "is_hinted": False})
        for k in range(2):
            reward = 1.0 if (i == 0 and k == 0) else 0.0
            rows.append({"instance_id": iid, "trajectory_id": f"{iid}-hint{k}", "reward": reward, "is_hinted": True, "hint_category": hintstream.CATEGORY_LLM})
    # As JSON rows, read back here one by one.
    client.publish_scored(run_id, step, rows, arrow=False)
    scored = [m for k, m in read_all(pipeline.bootstrap, topics.scored, 7) if k == step_key(run_id, step) and m["type"] == "scored_rollout"]
    assert {m["trajectory_id"]: m.get("hint_id") for m in scored} == {
        "task-0-raw": None,
        "task-0-hint0": ids["task-0"],
        "task-0-hint1": ids["task-0"],
        "task-1-raw": None,
        "task-1-hint0": ids["task-1"],
        "task-1-hint1": ids["task-1"],
    }
    metrics = client.wait_metrics(run_id, step, timeout=120.0)
    assert metrics["hint/arm/default/count"] == 2, metrics
    assert metrics["hint/arm/default/rescue_rate"] == 0.5, metrics

    # A trainer with its own advantages reports the outcomes itself.
    reported = [
        {"hint_id": ids["task-0"], "reward": 0.2},
        {"hint_id": ids["task-0"], "reward": 0.9},
        {"hint_id": ids["task-1"], "reward": 0.4},
    ]
    assert hintstream.report_hint_outcomes(reported, success_threshold=0.5, client=client) == 2
    outcomes = dict(read_all(pipeline.bootstrap, topics.outcomes, 2))
    want = {
        "task-0": (2, 1, True, 0.55),
        "task-1": (1, 0, False, 0.4),
    }
    assert set(outcomes) == {group_key(run_id, step, iid) for iid in want}
    for iid, (hinted, successes, rescued, mean) in want.items():
        o = outcomes[group_key(run_id, step, iid)]
        assert set(SCHEMA["required"]) <= set(o), o
        if SCHEMA.get("additionalProperties") is False:
            assert set(o) <= set(SCHEMA["properties"]), o
        assert (o["hint_id"], o["run_id"], o["step"], o["instance_id"]) == (ids[iid], run_id, step, iid)
        assert (o["hinted_rollouts"], o["successes"], o["rescued"]) == (hinted, successes, rescued)
        assert o["mean_reward"] == pytest.approx(mean)
        assert o["schema_version"] == 1 and o["created_at"].endswith("Z")

    # An unknown hint_id is named, and nothing is sent.
    with pytest.raises(ValueError, match="never-delivered"):
        hintstream.report_hint_outcomes([{"hint_id": ids["task-1"], "reward": 1.0}, {"hint_id": "never-delivered", "reward": 1.0}], client=client)
    assert len(read_all(pipeline.bootstrap, topics.outcomes, 3, within=3.0)) == 2


def delivered_hint(hint_id: str, instance_id: str, run_id: str = "r", step: int = 1):
    return {"hint_id": hint_id, "run_id": run_id, "step": step, "instance_id": instance_id, "hint": "h"}


def test_hint_ids_are_filled_only_on_hinted_rows_of_delivered_groups() -> None:
    from hintstream.outcomes import DeliveredHints, fill_hint_ids

    delivered = DeliveredHints(10)
    delivered.add(delivered_hint("ha", "a"))
    rows = [
        {"instance_id": "a", "trajectory_id": "t1", "reward": 0.0, "is_hinted": False},
        {"instance_id": "a", "trajectory_id": "t2", "reward": 1.0, "is_hinted": True},
        {"instance_id": "a", "trajectory_id": "t3", "reward": 1.0, "is_hinted": True, "hint_id": "mine"},
        {"instance_id": "b", "trajectory_id": "t4", "reward": 1.0, "is_hinted": True},
    ]
    filled = fill_hint_ids(delivered, "r", 1, rows)
    assert [r.get("hint_id") for r in filled] == [None, "ha", "mine", None]
    assert "hint_id" not in rows[1], "the caller's rows are not changed"
    assert [r.get("hint_id") for r in fill_hint_ids(delivered, "r", 2, rows)] == [None, None, "mine", None], "another step's group"


def test_delivered_hints_are_bounded_oldest_first() -> None:
    from hintstream.outcomes import DeliveredHints, outcome_messages

    delivered = DeliveredHints(2)
    for i in range(3):
        delivered.add(delivered_hint(f"h{i}", f"g{i}"))
    assert len(delivered) == 2
    assert delivered.group_of("h0") is None and delivered.group_of("h2") == ("r", 1, "g2")
    with pytest.raises(ValueError, match="'h0'"):
        outcome_messages(delivered, [{"hint_id": "h0", "reward": 1.0}])
    [(key, message)] = outcome_messages(delivered, [{"hint_id": "h2", "reward": 1.0}, {"hint_id": "h2", "reward": -1.0}])
    assert key == group_key("r", 1, "g2")
    assert (message["hinted_rollouts"], message["successes"], message["rescued"], message["mean_reward"]) == (2, 1, True, 0.0)
    with pytest.raises(ValueError, match="reward"):
        outcome_messages(delivered, [{"hint_id": "h2"}])
