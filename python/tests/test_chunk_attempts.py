"""wait_advantages gathers the chunks of each publication (header
hintstream.attempt) apart: two attempts of one step, cut at other
boundaries and interleaved on the topic, never mix; the attempt completed
last wins; an interrupted attempt does not hold back another. The rules of
``tools/reassemble.rs`` (its tests interleave the same way)."""

from __future__ import annotations

import uuid
from typing import List, Optional, Tuple

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from harness import make_topics, unique_topics
from hintstream import WaitTimeout, step_key
from hintstream.wire import ipc_stream


def _table(run_id: str, step: int, start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "run_id": [run_id] * n,
            "step": pa.array([step] * n, pa.int64()),
            "trajectory_id": [f"t{i}" for i in range(start, start + n)],
            "instance_id": [f"g{i // 4}" for i in range(start, start + n)],
            "reward": pa.array([float(i) for i in range(start, start + n)], pa.float64()),
            "is_hinted": [False] * n,
            "advantage": pa.array([float(-i) for i in range(start, start + n)], pa.float64()),
            "group_mean": pa.array([0.0] * n, pa.float64()),
            "group_std": pa.array([1.0] * n, pa.float64()),
        }
    )


class Publisher:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic = topic

    def chunk(self, run_id: str, step: int, attempt: Optional[str], index: int, count: int, rows: int, start: int, n: int) -> None:
        headers: List[Tuple[str, bytes]] = [
            ("content-type", b"application/vnd.apache.arrow.stream"),
            ("hintstream.chunk", str(index).encode()),
            ("hintstream.chunks", str(count).encode()),
            ("hintstream.rows", str(rows).encode()),
        ]
        if attempt is not None:
            headers.append(("hintstream.attempt", attempt.encode()))
        self.producer.produce(self.topic, key=step_key(run_id, step).encode(), value=ipc_stream(_table(run_id, step, start, n)), headers=headers)
        assert self.producer.flush(10) == 0


@pytest.fixture
def setup(broker, make_client):
    # One partition: a later step's arrival means every earlier message was read.
    topics = unique_topics("attempts")
    make_topics(broker.bootstrap, topics, 1)
    client = make_client(broker.bootstrap, topics)
    return client, Publisher(broker.bootstrap, topics.advantages)


def _ids(table: pa.Table) -> List[str]:
    return table.column("trajectory_id").to_pylist()


def test_interleaved_attempts_cut_at_other_boundaries_never_mix(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    # Attempt a: rows 0..30 cut at 10 and 20; attempt b: rows 100..130 cut at
    # 5 and 25. Same chunk count, same row count.
    a = [(0, 10), (10, 10), (20, 10)]
    b = [(100, 5), (105, 20), (125, 5)]
    for attempt, i in [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]:
        start, n = (a if attempt == "a" else b)[i]
        pub.chunk(run, 1, attempt, i, 3, 30, start, n)
    # A later step on the same partition: everything before it was read.
    pub.chunk(run, 2, "c", 0, 1, 3, 0, 3)
    assert _ids(client.wait_advantages(run, 2, timeout=20)) == ["t0", "t1", "t2"]
    table = client.wait_advantages(run, 1, timeout=20)
    # Whole, equal to one attempt: the one completed last (highest offset).
    assert _ids(table) == [f"t{i}" for i in range(100, 130)]
    assert table.column("advantage").to_pylist() == [float(-i) for i in range(100, 130)]


def test_an_interrupted_attempt_gives_way_to_a_whole_republication(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    # Killed after two of three chunks.
    pub.chunk(run, 3, "a", 0, 3, 30, 0, 10)
    pub.chunk(run, 3, "a", 1, 3, 30, 10, 10)
    with pytest.raises(WaitTimeout, match="2 of 3 chunks"):
        client.wait_advantages(run, 3, timeout=2)
    # Republished by another worker, cut elsewhere: that copy, whole.
    for i, (start, n) in enumerate([(0, 5), (5, 20), (25, 5)]):
        pub.chunk(run, 3, "b", i, 3, 30, start, n)
    assert _ids(client.wait_advantages(run, 3, timeout=20)) == [f"t{i}" for i in range(30)]


def test_chunks_without_an_attempt_keep_the_old_rules(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    # An older writer killed after one chunk, then republished the same way:
    # the first copy of each index is kept, the step completes once.
    pub.chunk(run, 4, None, 0, 2, 8, 0, 4)
    pub.chunk(run, 4, None, 0, 2, 8, 0, 4)
    pub.chunk(run, 4, None, 1, 2, 8, 4, 4)
    assert _ids(client.wait_advantages(run, 4, timeout=20)) == [f"t{i}" for i in range(8)]
