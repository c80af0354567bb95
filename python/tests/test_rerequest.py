"""A group asked for again gets its hint again, in time: the client keeps the
hints it returned (bounded) and answers a re-request of the same (run, step,
instance) from them, also when stage 1 republishes the same hint (same
``hint_id``), which the client drops as a duplicate. The hints are produced
here as stage 1 publishes them."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict

import pytest
from confluent_kafka import Producer

from harness import make_topics, unique_topics
from hintstream import group_key


def _hint(run_id: str, step: int, instance_id: str, text: str) -> Dict[str, Any]:
    return {
        "schema_version": 1, "hint_id": uuid.uuid4().hex, "run_id": run_id, "step": step,
        "instance_id": instance_id, "trajectory_id": f"{instance_id}-t", "hint": text,
        "category": "llm_synthesized", "model": "m", "prompt_version": "v1", "latency_ms": 1,
        "usage": {"input_tokens": 1, "output_tokens": 1}, "cost_usd": 0.0, "failure_reason": None,
        "source": {"topic": "failed", "partition": 0, "offset": 0},
        "created_at": "2026-01-01T00:00:00.000Z",
    }


@pytest.fixture
def setup(broker, make_client):
    topics = unique_topics("rereq")
    make_topics(broker.bootstrap, topics, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def publish(hint: Dict[str, Any]) -> None:
        key = group_key(hint["run_id"], hint["step"], hint["instance_id"])
        producer.produce(topics.hints, key=key.encode(), value=json.dumps(hint).encode())
        assert producer.flush(10) == 0

    return make_client, broker.bootstrap, topics, publish


def test_a_group_asked_for_again_gets_its_hint_again_at_once(setup) -> None:
    make_client, bootstrap, topics, publish = setup
    client = make_client(bootstrap, topics)
    run = f"run-{uuid.uuid4().hex[:6]}"
    first = _hint(run, 3, "A", "Read the spec first.")
    publish(first)
    got = client.wait_hints(run, 3, ["A"], timeout=30)
    assert got["A"]["hint_id"] == first["hint_id"]

    # Asked again, with nothing new published: the same hint, in time.
    started = time.monotonic()
    again = client.wait_hints(run, 3, ["A"], timeout=20)
    assert time.monotonic() - started < 5, "the re-request waited for its timeout"
    assert again == got

    # Stage 1 republishes the same hint (same hint_id) for a re-request:
    # dropped as a duplicate, and the re-request is still answered.
    publish(first)
    started = time.monotonic()
    third = client.wait_hints(run, 3, ["A"], timeout=20)
    assert time.monotonic() - started < 5, "the re-request waited for its timeout"
    assert third["A"]["hint_id"] == first["hint_id"]
    assert client.stats["hints_returned_again"] >= 2


def test_a_new_hint_for_the_group_wins_over_the_one_returned_before(setup) -> None:
    make_client, bootstrap, topics, publish = setup
    client = make_client(bootstrap, topics)
    run = f"run-{uuid.uuid4().hex[:6]}"
    first = _hint(run, 1, "B", "First.")
    publish(first)
    assert client.wait_hints(run, 1, ["B"], timeout=30)["B"]["hint_id"] == first["hint_id"]
    newer = _hint(run, 1, "B", "Newer.")
    publish(newer)
    # The newer one arrives (it is buffered) before it is asked for.
    deadline = time.monotonic() + 30
    while client.stats.get(topics.hints, 0) < 2:
        assert time.monotonic() < deadline, "the newer hint never arrived"
        time.sleep(0.05)
    assert client.wait_hints(run, 1, ["B"], timeout=10)["B"]["hint_id"] == newer["hint_id"]


def test_the_kept_hints_are_bounded(setup) -> None:
    make_client, bootstrap, topics, publish = setup
    client = make_client(bootstrap, topics, max_cached_hints=2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    for iid in ["C", "D", "E"]:
        publish(_hint(run, 1, iid, f"Hint {iid}."))
    assert len(client.wait_hints(run, 1, ["C", "D", "E"], timeout=30)) == 3
    # C was returned first and is no longer kept: it gets no hint in time.
    assert client.wait_hints(run, 1, ["C"], timeout=1) == {}
    assert set(client.wait_hints(run, 1, ["D", "E"], timeout=5)) == {"D", "E"}
