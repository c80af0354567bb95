"""wait_advantages reassembles a step published as several Arrow IPC
messages (headers hintstream.chunk / hintstream.chunks / hintstream.rows) in
chunk order, and never returns a partial step. The messages are produced
here as stage 2 publishes them."""

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

    def chunk(self, run_id: str, step: int, index: Optional[int], count: Optional[int], rows: Optional[int], start: int, n: int) -> None:
        headers: List[Tuple[str, bytes]] = [("content-type", b"application/vnd.apache.arrow.stream")]
        if index is not None:
            headers += [("hintstream.chunk", str(index).encode()), ("hintstream.chunks", str(count).encode())]
        if rows is not None:
            headers.append(("hintstream.rows", str(rows).encode()))
        self.producer.produce(self.topic, key=step_key(run_id, step).encode(), value=ipc_stream(_table(run_id, step, start, n)), headers=headers)
        assert self.producer.flush(10) == 0


@pytest.fixture
def setup(broker, make_client):
    topics = unique_topics("chunks")
    make_topics(broker.bootstrap, topics, 3)
    client = make_client(broker.bootstrap, topics)
    return client, Publisher(broker.bootstrap, topics.advantages)


def _ids(table: pa.Table) -> List[str]:
    return table.column("trajectory_id").to_pylist()


def test_whole_and_chunked_steps(setup) -> None:
    client, pub = setup
    run = f"org/run%{uuid.uuid4().hex[:6]}"  # '/' and '%' in the run_id
    pub.chunk(run, 1, None, None, None, 0, 5)
    assert _ids(client.wait_advantages(run, 1, timeout=20)) == [f"t{i}" for i in range(5)]

    # Out of order, a chunk repeated: reassembled in chunk order, once.
    for index in (2, 0, 0, 1):
        pub.chunk(run, 2, index, 3, 12, index * 4, 4)
    table = client.wait_advantages(run, 2, timeout=20)
    assert _ids(table) == [f"t{i}" for i in range(12)]
    assert table.column("advantage").to_pylist() == [float(-i) for i in range(12)]


def test_never_a_partial_step(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    pub.chunk(run, 3, 0, 3, 9, 0, 3)
    pub.chunk(run, 3, 1, 3, 9, 3, 3)
    with pytest.raises(WaitTimeout, match="2 of 3 chunks"):
        client.wait_advantages(run, 3, timeout=2)
    pub.chunk(run, 3, 2, 3, 9, 6, 3)
    assert _ids(client.wait_advantages(run, 3, timeout=20)) == [f"t{i}" for i in range(9)]


def test_a_chunk_set_that_restarts_with_another_count_starts_over(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    pub.chunk(run, 4, 0, 3, 9, 0, 3)
    pub.chunk(run, 4, 1, 3, 9, 3, 3)
    # Republished as 2 chunks: the 3-chunk set is dropped, not mixed in.
    pub.chunk(run, 4, 0, 2, 9, 100, 5)
    pub.chunk(run, 4, 1, 2, 9, 105, 4)
    assert _ids(client.wait_advantages(run, 4, timeout=20)) == [f"t{i}" for i in range(100, 109)]


def test_chunks_whose_rows_disagree_with_the_header_are_not_returned(setup) -> None:
    client, pub = setup
    run = f"run-{uuid.uuid4().hex[:6]}"
    pub.chunk(run, 5, 0, 2, 10, 0, 3)
    pub.chunk(run, 5, 1, 2, 10, 3, 3)
    with pytest.raises(WaitTimeout, match="could not be read"):
        client.wait_advantages(run, 5, timeout=3)
