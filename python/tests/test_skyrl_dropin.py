"""The reference generator's call, with only its import replaced, against
the stages on a real broker: ``hintstream.skyrl.synthesize_hints_batch``
called exactly as SkyRL-Fleet's ``_run_hint_augmentation`` calls it
(``hint_requests`` with the reference's keys, ``model``, ``timeout``,
``static_fallback_fn``; nothing else) gets ``llm_synthesized`` hints from
the loopback LLM, in request order. Plus the drop-in's run id and step
rules, without a broker."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

import hintstream
from hintstream import dropin
from hintstream.static_hint import reference_static_hint


class FleetTaskEnv:
    """Stands in for the reference's environment class: its static hint."""

    build_hint_text = staticmethod(reference_static_hint)


def reference_hint_requests(n: int):
    """The generator's hint requests (its keys exactly), each with a token
    the loopback LLM echoes."""
    requests, tokens = [], []
    for i in range(n):
        token = f"TOKEN-{uuid.uuid4().hex}"
        tokens.append(token)
        requests.append(
            {
                "task_prompt": f"Task {i}: book a table for two at 7pm.",
                "chat_history": [
                    {"role": "user", "content": [{"type": "text", "text": f"Task {i}"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "name": "click", "input": {"y": 2, "x": 1}}]},
                ],
                "verifier_stdout": f">>> ERROR_ACCUMULATOR >>>\n['{token} not booked']\n<<< ERROR_ACCUMULATOR <<<",
                "verifier_error": None,
                "tool_error_messages": ["click: no element at (1, 2)"],
                "instance_id": f"restaurant/task-{i}",
            }
        )
    return requests, tokens


def failed_messages(bootstrap: str, topic: str, want: int, within: float = 30.0):
    """The FailedTrajectory messages on ``topic``, read from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out, deadline = [], time.monotonic() + within
        while len(out) < want and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                out.append(json.loads(m.value()))
        return out
    finally:
        consumer.close()


def test_the_reference_call_gets_llm_hints_in_request_order(make_pipeline, llm, caplog) -> None:
    pipeline = make_pipeline()
    run_id = f"skyrl-{uuid.uuid4().hex[:8]}"
    hintstream.configure(bootstrap_servers=pipeline.bootstrap, topics=pipeline.topics, run_id=run_id)
    hint_requests, tokens = reference_hint_requests(4)
    hint_model = "openrouter/anthropic/claude-sonnet-4-20250514"
    hint_timeout = 60.0
    try:
        from hintstream.skyrl import synthesize_hints_batch  # the one changed line

        async def generator_step():
            # The reference generator's call, verbatim.
            hint_results = await synthesize_hints_batch(
                hint_requests=hint_requests,
                model=hint_model,
                timeout=hint_timeout,
                static_fallback_fn=FleetTaskEnv.build_hint_text,
            )
            return hint_results

        with caplog.at_level(logging.INFO, logger="hintstream"):
            hint_results = asyncio.run(generator_step())
    finally:
        hintstream.configure()  # closes the client the drop-in made
    assert [c for _, c in hint_results] == ["llm_synthesized"] * 4, (hint_results, pipeline.logs())
    for (text, _), token in zip(hint_results, tokens):
        assert text.startswith(f"Echo {token}:"), (text, token)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Hint synthesis batch")]
    assert len(lines) == 1 and re.fullmatch(r"Hint synthesis batch: 4 total, 4 LLM-synthesized, 0 fallback, \d+\.\ds elapsed", lines[0]), lines

    # The requests went out with the model the trainer asked for, one group each.
    sent = [m for m in failed_messages(pipeline.bootstrap, pipeline.topics.failed, 4) if m["run_id"] == run_id]
    assert sorted(m["instance_id"] for m in sent) == sorted(r["instance_id"] for r in hint_requests)
    assert {m["hint_model"] for m in sent} == {hint_model}
    assert len({m["step"] for m in sent}) == 1


def test_without_a_run_id_one_is_generated_per_process_and_logged_once(monkeypatch, caplog) -> None:
    monkeypatch.delenv("HINTSTREAM_RUN_ID", raising=False)
    monkeypatch.setattr(dropin._state, "run_id", None)
    monkeypatch.setattr(dropin._state, "generated_run_id", None)
    with caplog.at_level(logging.INFO, logger="hintstream"):
        first, second = dropin._run_id(None), dropin._run_id(None)
    assert first == second and first.startswith("run-")
    assert sum(first in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setenv("HINTSTREAM_RUN_ID", "from-env")
    assert dropin._run_id(None) == "from-env"
    assert dropin._run_id("explicit") == "explicit"


def test_the_step_is_the_request_s_or_a_counter_from_the_process_start() -> None:
    now_ms = int(time.time() * 1000)
    a = dropin._steps([{}, {}], None)
    b = dropin._steps([{}, {"step": 7}], None)
    assert a[0] == a[1] and a[0] <= now_ms and a[0] > now_ms - 24 * 3600 * 1000 * 365
    assert b == [a[0] + 1, 7]
    assert dropin._steps([{"step": 7}], 3) == [3]
