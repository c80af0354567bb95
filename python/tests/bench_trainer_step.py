"""What a trainer waits for at each step: ``publish_scored`` of a step's
rows, then ``wait_advantages`` until its advantages are back, with the rows
as JSON (one ``scored_rollout`` message a row) and as Arrow (``arrow=True``),
side by side against one ``hintstream advantages`` on one Apache Kafka node.

Each step has ROWS rows in groups of 8 (a tenth of the groups hinted, their
hinted rows naming a hint). The two ways alternate step by step (JSON first
in odd rounds), on the same broker and worker, after one warm-up step of
each that is not counted; each step's rows are new. For every pair, the two
steps' advantages are checked equal row by row (the same rows, sent both
ways).

With ``--vs-client DIR`` (a directory holding another build of the
``hintstream`` package, such as a worktree's ``python/src``), that client
runs beside this one, on the same broker and worker: every round sends the
same rows four ways (each client, JSON rows and Arrow), in an order that
turns round by round, and all four steps' advantages must be equal; the
report gives this client's step against the other's.

    python python/tests/bench_trainer_step.py [--rows 10000] [--rounds 10] [--vs-client DIR] [--out FILE.md]

(scripts/bench-trainer-step.sh makes the venv, the release binary and the
broker's jars first.)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).parent))

from harness import Kafka, Pipeline, hintstream_bin  # noqa: E402
from hintstream import TrainerClient  # noqa: E402

GROUP_SIZE = 8


def step_rows(step: int, n: int, rng: random.Random) -> List[Dict[str, Any]]:
    """``n`` rows of ``step`` in groups of 8, ids like a trainer's, a tenth
    of the groups hinted (their second half of rows ran with the group's
    hint), in a shuffled order."""
    rows: List[Dict[str, Any]] = []
    for g in range(n // GROUP_SIZE):
        iid = f"swe-task-{step:05d}-{g:08d}"
        hinted = g % 10 == 0
        for r in range(GROUP_SIZE):
            row: Dict[str, Any] = {"instance_id": iid, "trajectory_id": f"{iid}-{r}", "reward": rng.choice([0.0, 0.0, 0.5, 1.0, rng.random()]), "is_hinted": hinted and r >= GROUP_SIZE // 2}
            if row["is_hinted"]:
                row.update(hint_category="wrong_file", hint_id=f"h-{step}-{g}")
            rows.append(row)
    rng.shuffle(rows)
    return rows


def one_step(client: TrainerClient, run_id: str, step: int, rows: List[Dict[str, Any]], arrow: bool) -> Tuple[float, float, Dict[str, float]]:
    """Seconds to publish, seconds from then to the advantages, and each
    row's advantage."""
    t0 = time.monotonic()
    client.publish_scored(run_id, step, rows, arrow=arrow, timeout=120)
    t1 = time.monotonic()
    table = client.wait_advantages(run_id, step, timeout=120)
    t2 = time.monotonic()
    advantages = dict(zip(table.column("trajectory_id").to_pylist(), table.column("advantage").to_pylist()))
    return t1 - t0, t2 - t1, advantages


def ms(values: List[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ({min(values) * 1000:.1f})"


def other_package(directory: str) -> ModuleType:
    """The ``hintstream`` package under ``directory``, imported as
    ``hintstream_vs`` beside this one (its modules import each other
    relatively)."""
    init = Path(directory, "hintstream", "__init__.py")
    if not init.is_file():
        raise SystemExit(f"--vs-client: no hintstream package in {directory}")
    spec = importlib.util.spec_from_file_location("hintstream_vs", init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hintstream_vs"] = module
    spec.loader.exec_module(module)
    return module


#: A way a step goes: the client's name and whether its rows go as Arrow.
Way = Tuple[str, bool]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000, help="rows a step (groups of 8: a multiple of 8)")
    p.add_argument("--rounds", type=int, default=10, help="steps of each way, counted")
    p.add_argument("--vs-client", metavar="DIR", help="another build of the hintstream package (a directory holding hintstream/), run beside this one")
    p.add_argument("--out", help="also write the report here")
    a = p.parse_args()
    if a.rows < GROUP_SIZE or a.rows % GROUP_SIZE:
        p.error(f"--rows must be a positive multiple of {GROUP_SIZE}")
    makers: Dict[str, Any] = {"this": TrainerClient}
    if a.vs_client:
        makers["vs"] = other_package(a.vs_client).TrainerClient
    ways: List[Way] = [(name, arrow) for name in makers for arrow in (False, True)]
    rng = random.Random(7)
    times: Dict[Way, List[Tuple[float, float]]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory(prefix="hs-trainer-step-") as work:
        kafka = Kafka().start()
        pipeline = Pipeline(kafka.bootstrap, None, Path(work), partitions=1, hints_stage=False)
        clients: Dict[str, Any] = {}
        try:
            # The topics as a mapping: the other build has a Topics class of its own.
            topics = dataclasses.asdict(pipeline.topics)
            for name, make in makers.items():
                clients[name] = make(kafka.bootstrap, topics=topics)
            step = 0
            for round_ in range(a.rounds + 1):
                order = ways if round_ % 2 else ways[::-1]
                seen: Dict[Way, Dict[str, float]] = {}
                base = step_rows(step, a.rows, rng)
                for way in order:
                    step += 1
                    # The same rows, under this step's number.
                    publish, wait, advantages = one_step(clients[way[0]], "bench", step, base, way[1])
                    seen[way] = advantages
                    if round_ > 0:
                        times[way].append((publish, wait))
                if any(advantages != seen[ways[0]] for advantages in seen.values()):
                    raise SystemExit(f"round {round_}: the steps' advantages differ between the ways")
        finally:
            for client in clients.values():
                client.close()
            pipeline.stop()
            kafka.kill()
    vs = f"; beside it the client in {a.vs_client}" if a.vs_client else ""
    lines = [
        "# A trainer's step: publish_scored, then wait_advantages (JSON rows against Arrow)",
        f"- date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; machine: {os.cpu_count()} CPUs, {platform.machine()}; load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- {a.rows:,} rows a step, {a.rounds} steps each way, alternated; one `hintstream advantages` ({hintstream_bin()}), Apache Kafka, 1 partition{vs}",
        f"- command: `scripts/bench-trainer-step.sh --rows {a.rows} --rounds {a.rounds}{' --vs-client ' + a.vs_client if a.vs_client else ''}`",
        "",
        "| client | rows sent as | publish_scored ms, median (min) | then wait_advantages ms, median (min) | the step ms, median (min) |",
        "|---|---|---:|---:|---:|",
    ]
    steps: Dict[Way, float] = {}
    for way in ways:
        t = times[way]
        steps[way] = statistics.median([p + w for p, w in t])
        kind = "Arrow (arrow=True)" if way[1] else "JSON, a message a row"
        lines.append(f"| {way[0]} | {kind} | {ms([p for p, _ in t])} | {ms([w for _, w in t])} | {ms([p + w for p, w in t])} |")
    lines += ["", f"JSON ÷ Arrow, the step's median: {steps[('this', False)] / steps[('this', True)]:.1f}x (this client)."]
    if a.vs_client:
        for arrow, kind in ((True, "Arrow"), (False, "JSON rows")):
            lines.append(f"This client ÷ the other, the step's median, {kind}: {steps[('this', arrow)] / steps[('vs', arrow)]:.2f}x.")
    lines.append("Each round's steps had equal advantages row by row.")
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)


if __name__ == "__main__":
    main()
