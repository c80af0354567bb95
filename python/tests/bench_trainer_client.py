"""Per-step time of the trainer loop before and after the topics' history
grew: N steps (16 failed groups through the drop-in, scored rows, advantages,
metrics) on fresh topics; then 30,000 old hints and 2,000 old advantage
messages are put on the same topics and a new client runs N more steps. For
contrast, what the old client did per read (a new consumer group from the
start of the topic) is timed on the same history.

Each step's hint phase (from publishing its failed trajectories to its last
hint) is reported too. With ``--outcomes`` the pipeline has an outcomes
topic, so stage 1 learns (it reads the hints and outcomes topics back, with
a read barrier before each step's first choice); ``--llm-delay-ms`` makes the
loopback LLM take that long per answer.

    python python/tests/bench_trainer_client.py [--steps N] [--outcomes] [--llm-delay-ms MS] [--out FILE.md]

(scripts/bench-trainer-client.sh makes the venv and the binary first.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from confluent_kafka import Consumer  # noqa: E402

from harness import Kafka, LlmServer, Pipeline, put_history, wait_for_broker  # noqa: E402
from hintstream import TrainerClient  # noqa: E402
from loop import FAILED_GROUPS, run_step  # noqa: E402


def steps(client: TrainerClient, run_id: str, first: int, n: int, rng: random.Random) -> list:
    """Each step's seconds (``step``, ``hints``, ...), after one warm-up
    step that is not counted."""
    asyncio.run(run_step(client, run_id, first, rng))
    return [asyncio.run(run_step(client, run_id, s, rng)).seconds for s in range(first + 1, first + 1 + n)]


def ms(values: list) -> str:
    """median (min-max) in milliseconds."""
    return f"{statistics.median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"


def rescan_seconds(bootstrap: str, topic: str, expected: int) -> float:
    """The old client's read: a new consumer group from the earliest offset,
    reading until it has seen the topic's ``expected`` messages."""
    started = time.monotonic()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rescan-{uuid.uuid4().hex}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    seen = 0
    while seen < expected and time.monotonic() - started < 300:
        for m in c.consume(1000, 0.5):
            if m.error() is None:
                seen += 1
    c.close()
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hints", type=int, default=30_000)
    p.add_argument("--advantages", type=int, default=2_000)
    p.add_argument("--outcomes", action="store_true", help="give the pipeline an outcomes topic (stage 1 learns)")
    p.add_argument("--llm-delay-ms", type=float, default=0.0, help="the loopback LLM's time per answer")
    p.add_argument("--out", default="/tmp/hs-notes/python-bench.md")
    a = p.parse_args()

    kafka = None
    if os.environ.get("HINTSTREAM_TEST_BOOTSTRAP"):
        bootstrap = os.environ["HINTSTREAM_TEST_BOOTSTRAP"]
        wait_for_broker(bootstrap)
    else:
        kafka = Kafka().start()
        bootstrap = kafka.bootstrap
    llm = LlmServer(delay=a.llm_delay_ms / 1000)
    work = Path(tempfile.mkdtemp(prefix="bench-trainer-client-"))
    pipeline = Pipeline(bootstrap, llm, work, outcomes=a.outcomes)
    try:
        rng = random.Random(11)
        run_id = f"bench-{uuid.uuid4().hex[:6]}"
        with TrainerClient(bootstrap, topics=pipeline.topics) as client:
            fresh = steps(client, run_id, 0, a.steps, rng)
        history_s = put_history(bootstrap, pipeline.topics, a.hints, a.advantages)
        with TrainerClient(bootstrap, topics=pipeline.topics) as client:
            after = steps(client, run_id, 100, a.steps, rng)
            stats = client.stats
        rescan = rescan_seconds(bootstrap, pipeline.topics.hints, a.hints)
    finally:
        pipeline.stop()
        llm.stop()
        if kafka:
            kafka.kill()
        shutil.rmtree(work, ignore_errors=True)

    step_fresh, step_after = [s["step"] for s in fresh], [s["step"] for s in after]
    hints_fresh, hints_after = [s["hints"] for s in fresh], [s["hints"] for s in after]
    ratio = statistics.median(step_after) / statistics.median(step_fresh)
    learning = "an outcomes topic (stage 1 learns: read barrier before each step)" if a.outcomes else "no outcomes topic (stage 1 does not learn)"
    lines = [
        "# Trainer client: per-step time against topic history",
        "",
        f"`scripts/bench-trainer-client.sh {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, Apache Kafka 4.1.1 (one node), both stages as debug-build processes, "
        f"loopback LLM answering in {a.llm_delay_ms:.0f} ms, {learning}).",
        "",
        f"One step = {FAILED_GROUPS} failed groups through `synthesize_hints_batch` (stage 1 → loopback LLM → hints), "
        f"112 scored rows published, the step's advantages and metrics awaited. {a.steps} steps each (median (min-max); one warm-up step not counted). "
        "The hint phase: from publishing the step's failed trajectories to its last hint.",
        "",
        "| topics | per step | hint phase |",
        "|---|---|---|",
        f"| fresh | {ms(step_fresh)} | {ms(hints_fresh)} |",
        f"| after {a.hints:,} old hints + {a.advantages:,} old advantage messages | {ms(step_after)} | {ms(hints_after)} |",
        "",
        f"**Ratio after / fresh: {ratio:.2f}** (1.0 = history costs nothing). The second client received "
        f"{stats.get(pipeline.topics.hints, 0)} hint and {stats.get(pipeline.topics.advantages, 0)} advantage messages: its own steps only.",
        "",
        f"For contrast, the old client's read (a new consumer group from the start of the topic, every call) takes "
        f"{rescan:.1f} s to get through the {a.hints:,} hints once, per step. Putting the history on the topics took {history_s:.1f} s.",
    ]
    text = "\n".join(lines) + "\n"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
