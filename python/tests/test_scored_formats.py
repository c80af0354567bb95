"""A step's rows as ``publish_scored`` sends them: Arrow by default, a JSON
message a row with ``arrow=False``. The same rows, every field set on some,
come back from stage 2 with the same advantages either way; and a row stage 2
would refuse fails the call before anything is sent, either way."""

from __future__ import annotations

import math
import uuid
from typing import Any, Dict, List

import pytest
from confluent_kafka import Consumer, TopicPartition

from hintstream import wire
from hintstream.keys import step_key


def _rows() -> List[Dict[str, Any]]:
    """Four groups of four: raw rows, and hinted rows with their hint, a
    response length and both log-probs (every optional field set somewhere)."""
    rows: List[Dict[str, Any]] = []
    for g in range(4):
        for r in range(4):
            row: Dict[str, Any] = {"instance_id": f"task-{g}", "trajectory_id": f"task-{g}-{r}", "reward": float((g + r) % 3) / 2, "is_hinted": r >= 2}
            if row["is_hinted"]:
                row.update(hint_category="wrong_file", hint_id=f"h-{g}", response_length=10 + r, logprob_hinted=-1.0 - 0.25 * r, logprob_unhinted=-3.5 - g)
            rows.append(row)
    return rows


def _scored_messages(bootstrap: str, topic: str, want: int) -> List[Any]:
    """The first ``want`` messages of ``topic`` (one partition)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"formats-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: List[Any] = []
        while len(out) < want:
            m = consumer.poll(30)
            assert m is not None, f"{len(out)} of {want} messages on {topic}"
            assert m.error() is None, m.error()
            out.append(m)
        return out
    finally:
        consumer.close()


def test_a_step_goes_as_arrow_by_default_and_comes_back_as_json_rows_do(make_pipeline, make_client) -> None:
    pipeline = make_pipeline(partitions=1, hints_stage=False, advantages_settings={"normalize": {"hinted_weight": "ratio"}})
    client = make_client(pipeline.bootstrap, pipeline.topics)
    rows = _rows()
    assert client.publish_scored("formats", 1, rows) == len(rows)
    assert client.publish_scored("formats", 2, rows, arrow=False) == len(rows)
    # Step 1: one Arrow message and its step_end; step 2: a message a row
    # and its step_end.
    messages = _scored_messages(pipeline.bootstrap, pipeline.topics.scored, 2 + len(rows) + 1)
    arrow = messages[0]
    assert dict(arrow.headers() or [])["content-type"] == wire.ARROW_STREAM_CONTENT_TYPE.encode()
    assert wire.read_ipc_stream(arrow.value()).num_rows == len(rows)
    assert all(m.headers() is None for m in messages[2:])
    tables = [client.wait_advantages("formats", step, timeout=60) for step in (1, 2)]
    by_row = [
        {t: (a, w) for t, a, w in zip(table.column("trajectory_id").to_pylist(), table.column("advantage").to_pylist(), table.column("weight").to_pylist())}
        for table in tables
    ]
    assert by_row[0] == by_row[1]
    # The log-probs went both ways: a hinted row's weight is the ratio of them.
    hinted = rows[2]
    expected = wire.ratio(hinted["logprob_hinted"], hinted["logprob_unhinted"], hinted["response_length"])
    assert by_row[0][hinted["trajectory_id"]][1] == pytest.approx(expected, rel=1e-12)
    assert expected < 1.0


@pytest.mark.parametrize("arrow", [True, False])
def test_a_row_stage_2_would_refuse_fails_the_call_before_anything_is_sent(make_pipeline, make_client, arrow: bool) -> None:
    pipeline = make_pipeline(partitions=1, hints_stage=False)
    client = make_client(pipeline.bootstrap, pipeline.topics)
    for change, what in [
        ({"reward": math.nan}, "finite"),
        ({"reward": math.inf}, "finite"),
        ({"trajectory_id": " "}, "blank trajectory_id"),
        ({"instance_id": ""}, "blank instance_id"),
        ({"trajectory_id": "task-1-0"}, "'task-1-0' appears twice in step 1"),
    ]:
        rows = _rows()
        rows[5] = {**rows[5], **change}
        with pytest.raises(ValueError, match=what):
            client.publish_scored("refused", 1, rows, arrow=arrow)
    with pytest.raises(ValueError, match="step"):
        client.publish_scored("refused", -1, _rows(), arrow=arrow)
    # Nothing reached the topic; a good step then goes through.
    assert client.publish_scored("refused", 2, _rows(), arrow=arrow) == 16
    assert client.wait_advantages("refused", 2, timeout=60).num_rows == 16
    first = _scored_messages(pipeline.bootstrap, pipeline.topics.scored, 1)[0]
    assert first.key() == step_key("refused", 2).encode()
