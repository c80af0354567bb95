"""publish_failed raises on a delivery failure instead of passing silently."""

from __future__ import annotations

import time
import uuid

import pytest

from harness import Kafka, make_topics, unique_topics
from hintstream import DeliveryError, failed_trajectory
from hintstream.client import IDEMPOTENT_IN_FLIGHT
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
        # A step's chunks held at the window until the deadline: the ones
        # never handed over count as undelivered, and nothing waits longer.
        rows = [{"instance_id": f"g{i // 4}", "trajectory_id": f"t{i:06d}", "reward": 0.0, "is_hinted": False} for i in range(5_000)]
        started = time.monotonic()
        with pytest.raises(DeliveryError) as e:
            client.publish_scored("r", 2, rows, arrow=True, timeout=2, max_message_bytes=16_384)
        assert time.monotonic() - started < 5
        assert e.value.undelivered > IDEMPOTENT_IN_FLIGHT, e.value
        assert "never handed to the producer" in str(e.value)
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


class _Outstanding:
    """The client's producer, recording how many messages it held each time
    one was handed over."""

    def __init__(self, producer) -> None:
        self._producer = producer
        self.held: list = []

    def produce(self, *args, **kwargs):
        self.held.append(len(self._producer))
        return self._producer.produce(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._producer)

    def __getattr__(self, name: str):
        return getattr(self._producer, name)


def test_a_steps_chunks_go_a_few_at_a_time(broker, make_client) -> None:
    topics = unique_topics("window")
    make_topics(broker.bootstrap, topics, 1)
    client = make_client(broker.bootstrap, topics)
    recorder = _Outstanding(client._producer)
    client._producer = recorder
    rows = [{"instance_id": f"g{i // 4}", "trajectory_id": f"trajectory-{i:06d}", "reward": 0.5, "is_hinted": False} for i in range(20_000)]
    assert client.publish_scored("r", 1, rows, arrow=True, timeout=30, max_message_bytes=32_768) == len(rows)
    chunks = len(recorder.held) - 1  # the step_end after them
    assert chunks > 3 * IDEMPOTENT_IN_FLIGHT, chunks
    # Never more than the idempotent producer sends at once (more spin its
    # broker thread), and every chunk and the step_end delivered.
    assert max(recorder.held) < IDEMPOTENT_IN_FLIGHT, recorder.held
    # and the window is used (linger.ms keeps the first ones queued).
    assert IDEMPOTENT_IN_FLIGHT - 1 in recorder.held, recorder.held
    assert len(recorder) == 0
