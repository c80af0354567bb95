"""Chunked steps end to end, stage 2 as a ``hintstream advantages`` process:
a 1,000,000-row step published with ``publish_scored(..., arrow=True)``
under the default message limits (so in chunks both ways) comes back from
``wait_advantages`` whole and equal to a float64 reference;
and a worker killed (SIGKILL) between two chunks never makes
``wait_advantages`` return a partial step: the restarted worker publishes
it whole."""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict, List

from confluent_kafka import Consumer, TopicPartition

from harness import Pipeline, Stage, free_port, make_topics, unique_topics
from hintstream import WaitTimeout
from reference import grpo_advantages

def _rows(n: int) -> List[Dict[str, Any]]:
    """8 rows a group; every fifth group all 0 (std 0); the last row of
    every third group hinted and successful."""

    def reward(i: int) -> float:
        if i % 8 == 7 and (i // 8) % 3 == 0:
            return 1.0
        return 0.0 if (i // 8) % 5 == 0 else float((i * 2654435761) % 1000) / 1000.0

    return [
        {
            "instance_id": f"task/{i // 8}",
            "trajectory_id": f"t{i}",
            "reward": reward(i),
            "is_hinted": i % 8 == 7 and (i // 8) % 3 == 0,
            "hint_category": "llm_synthesized" if i % 8 == 7 and (i // 8) % 3 == 0 else None,
        }
        for i in range(n)
    ]


def _metric(port: int, name: str) -> float:
    """The sum of ``name``'s series on a stage's ``/metrics``; 0 while
    nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] == name
    )


def _messages_on(bootstrap: str, topic: str, partitions: int) -> int:
    """How many messages ``topic`` holds (the sum of its end offsets)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"py-ends-{uuid.uuid4().hex[:8]}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def _assert_close(got: List[float], want: List[float]) -> None:
    assert len(got) == len(want)
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        err = abs(g - w) / max(abs(w), 1.0)
        assert err < 1e-9, f"row {i}: got {g}, want {w}"
        worst = max(worst, err)
    print(f"{len(got)} advantages, worst relative error {worst:g}")


def test_a_million_row_step_comes_back_whole_and_exact(broker, make_pipeline, make_client) -> None:
    n = 1_000_000
    started = time.monotonic()
    # Every limit at its default: the ~45 MB step goes in as Arrow chunks
    # of at most 900,000 bytes (one message would exceed librdkafka's
    # message.max.bytes and fail to deliver) and comes back the same way.
    pipeline: Pipeline = make_pipeline(hints_stage=False)
    client = make_client(broker.bootstrap, pipeline.topics)
    run = f"py-1m-{uuid.uuid4().hex[:6]}"
    rows = _rows(n)
    assert client.publish_scored(run, 7, rows, arrow=True, timeout=60) == n
    published = time.monotonic()
    try:
        table = client.wait_advantages(run, 7, timeout=120)
    except WaitTimeout:
        raise AssertionError(pipeline.logs()) from None
    arrived = time.monotonic()
    assert table.num_rows == n
    assert table.column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in rows]
    _assert_close(table.column("advantage").to_pylist(), grpo_advantages(rows))
    metrics = client.wait_metrics(run, 7, timeout=30)
    assert metrics["advantage/rows"] == n
    print(f"1M rows: published in {published - started:.1f} s, advantages back {arrived - published:.1f} s later, {time.monotonic() - started:.1f} s in all")


def test_a_worker_killed_between_chunks_never_yields_a_partial_step(broker, make_client, tmp_path: Path) -> None:
    n = 16_000
    topics = unique_topics("py-kill")
    make_topics(broker.bootstrap, topics, 2)
    client = make_client(broker.bootstrap, topics)
    common: Dict[str, Dict[str, Any]] = {
        # Chunks of 64 KiB: about 20 for this step.
        "advantages": {"max_message_bytes": 65536, "drain_timeout_secs": 2},
        # The restarted worker waits out the killed member's session (and
        # every drain must be shorter than a session).
        "kafka.consumer": {"session.timeout.ms": "6000"},
        "hints": {"drain_timeout_secs": 2},
    }
    # The first worker's producer holds each record 400 ms (pacing, not a
    # wait): its chunks go out slowly enough to be killed between two.
    port = free_port()
    slow = {
        **common,
        "kafka.producer": {"linger.ms": "400"},
        "advantages": {**common["advantages"], "metrics_addr": f"127.0.0.1:{port}"},
    }
    first = Stage("advantages", broker.bootstrap, topics, None, tmp_path, slow)
    second = None
    try:
        run = f"py-kill-{uuid.uuid4().hex[:6]}"
        rows = _rows(n)
        client.publish_scored(run, 3, rows, arrow=True)
        # Kill it once the broker acknowledged two chunks: the stage counts them.
        deadline = time.monotonic() + 90
        while _metric(port, "hintstream_advantages_chunks_published_total") < 2:
            assert first.running() and time.monotonic() < deadline, first.log_text()[-4000:]
            time.sleep(0.1)
        first.kill()
        # What the killed worker got out is all the topic will hold from it;
        # once the client received every one of those chunks, it must not
        # make a step of them.
        on_topic = _messages_on(broker.bootstrap, topics.advantages, 2)
        assert on_topic >= 2, on_topic
        deadline = time.monotonic() + 60
        while client.stats.get(topics.advantages, 0) < on_topic:
            assert time.monotonic() < deadline, f"the client received {client.stats} of {on_topic} chunks"
            time.sleep(0.1)
        try:
            client.wait_advantages(run, 3, timeout=0)
            raise AssertionError(f"a step of the {on_topic} chunks on the topic at the kill")
        except WaitTimeout:
            pass
        # It rejoins the group and gets the partitions once the killed
        # member's session (6 s) expired.
        second = Stage("advantages", broker.bootstrap, topics, None, tmp_path, common, tag=first.tag)
        try:
            table = client.wait_advantages(run, 3, timeout=90)
        except WaitTimeout:
            raise AssertionError(second.log_text()[-4000:]) from None
        assert table.num_rows == n
        assert table.column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in rows]
        _assert_close(table.column("advantage").to_pylist(), grpo_advantages(rows))
        assert client.wait_metrics(run, 3, timeout=30)["advantage/rows"] == n
    finally:
        first.stop()
        if second is not None:
            second.stop()
