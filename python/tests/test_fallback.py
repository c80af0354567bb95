"""The trainer never stalls: with the hint stage stopped, or the broker
gone, the drop-in returns a local fallback for every request within its
timeout (plus a fraction of a second)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import hintstream
from harness import Kafka, make_topics, unique_topics
from hintstream.static_hint import static_hint
from loop import hint_requests


def _drop_in(client, requests, **kwargs):
    started = time.monotonic()
    results = asyncio.run(hintstream.synthesize_hints_batch(requests, client=client, run_id=f"r-{uuid.uuid4().hex[:6]}", step=3, **kwargs))
    return results, time.monotonic() - started


def test_hint_stage_stopped_every_request_falls_back_within_four_seconds(make_pipeline, make_client) -> None:
    pipeline = make_pipeline()
    pipeline.stages["hints"].stop()  # SIGTERM: stage 1 is gone
    assert not pipeline.stages["hints"].running()
    client = make_client(pipeline.bootstrap, pipeline.topics)
    requests, _ = hint_requests(3, random.Random(1))

    results, seconds = _drop_in(client, requests, timeout=3)
    print(f"\nhint stage stopped: {len(results)} fallbacks in {seconds:.2f} s (timeout 3)")
    assert seconds < 4.0, seconds
    assert len(results) == len(requests)
    for request, (text, category) in zip(requests, results):
        assert category == "llm_failed_static_fallback"
        # The same static hint stage 1 would have built.
        assert text == static_hint(request["verifier_stdout"], request["verifier_error"], request["tool_error_messages"])

    # The reference's static_fallback_fn is called as the reference calls it.
    calls = []

    def build_hint_text(verifier_stdout, verifier_error, tool_error_messages):
        calls.append((verifier_stdout, verifier_error, tool_error_messages))
        return f"static: {verifier_error}"

    results, seconds = _drop_in(client, requests[:3], timeout=1, static_fallback_fn=build_hint_text)
    assert seconds < 2.0, seconds
    assert results == [(f"static: {r['verifier_error']}", "llm_failed_static_fallback") for r in requests[:3]]
    assert calls == [(r["verifier_stdout"], r["verifier_error"], r["tool_error_messages"]) for r in requests[:3]]


def test_broker_gone_every_request_falls_back_in_time(make_client) -> None:
    kafka = Kafka().start()
    try:
        topics = unique_topics("gone")
        make_topics(kafka.bootstrap, topics, 1)
        client = make_client(kafka.bootstrap, topics)
        kafka.kill()
        requests, _ = hint_requests(1, random.Random(2))
        results, seconds = _drop_in(client, requests, timeout=3)
        print(f"\nbroker gone: {len(results)} fallbacks in {seconds:.2f} s (timeout 3)")
        assert seconds < 4.0, seconds
        assert [c for _, c in results] == ["llm_failed_static_fallback"] * len(requests)
    finally:
        kafka.kill()
