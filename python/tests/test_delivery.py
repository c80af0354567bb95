"""publish_failed raises on a delivery failure instead of passing silently."""

from __future__ import annotations

import time
import uuid

import pytest

from harness import Kafka, make_topics, unique_topics
from hintstream import DeliveryError, failed_trajectory
from hintstream.wire import Topics


def _trajectories(n: int, **kwargs):
    return [
        failed_trajectory(run_id="r", step=1, instance_id=f"g{i}", task_prompt="t", verifier_error="e", **kwargs)
        for i in range(n)
    ]


def test_topic_missing(broker, make_client) -> None:
    topics = unique_topics("missing")
    make_topics(broker.bootstrap, topics, 1)
    missing = Topics(**{**topics.__dict__, "failed": f"no-such-topic-{uuid.uuid4().hex[:8]}"})
    client = make_client(broker.bootstrap, missing)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as e:
        client.publish_failed(_trajectories(3), timeout=5)
    assert time.monotonic() - started < 8
    print(e.value)


def test_broker_gone(make_client) -> None:
    kafka = Kafka().start()
    try:
        topics = unique_topics("gone")
        make_topics(kafka.bootstrap, topics, 1)
        client = make_client(kafka.bootstrap, topics)
        assert client.publish_failed(_trajectories(2), timeout=10) == 2  # delivered while it is up
        kafka.kill()
        started = time.monotonic()
        with pytest.raises(DeliveryError) as e:
            client.publish_failed(_trajectories(3), timeout=3)
        assert time.monotonic() - started < 5
        assert e.value.undelivered or e.value.failures
        with pytest.raises(DeliveryError):
            client.publish_scored("r", 1, [{"instance_id": "g", "trajectory_id": "t", "reward": 0.0, "is_hinted": False}], timeout=2)
    finally:
        kafka.kill()


def test_message_too_large(broker, make_client) -> None:
    topics = unique_topics("large")
    make_topics(broker.bootstrap, topics, 1)
    client = make_client(broker.bootstrap, topics)
    big = failed_trajectory(run_id="r", step=1, instance_id="g", task_prompt="x" * 2_000_000)
    with pytest.raises(DeliveryError):
        client.publish_failed([big], timeout=5)
    # The client is still usable afterwards.
    assert client.publish_failed(_trajectories(1), timeout=10) == 1


def test_bad_input_is_refused_before_publishing(broker, make_client) -> None:
    topics = unique_topics("bad")
    make_topics(broker.bootstrap, topics, 1)
    client = make_client(broker.bootstrap, topics)
    with pytest.raises(ValueError):
        client.publish_failed([{"run_id": "r", "step": -1, "instance_id": "g", "trajectory_id": "t", "task_prompt": "", "chat_history": []}])
    with pytest.raises(ValueError):
        rows = [{"instance_id": "g", "trajectory_id": "same", "reward": 0.0, "is_hinted": False}] * 2
        client.publish_scored("r", 1, rows)
