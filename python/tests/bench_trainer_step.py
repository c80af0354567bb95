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

    python python/tests/bench_trainer_step.py [--rows 10000] [--rounds 10] [--out FILE.md]

(scripts/bench-trainer-step.sh makes the venv, the release binary and the
broker's jars first.)
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000, help="rows a step (groups of 8: a multiple of 8)")
    p.add_argument("--rounds", type=int, default=10, help="steps of each way, counted")
    p.add_argument("--out", help="also write the report here")
    a = p.parse_args()
    if a.rows < GROUP_SIZE or a.rows % GROUP_SIZE:
        p.error(f"--rows must be a positive multiple of {GROUP_SIZE}")
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="hs-trainer-step-") as work:
        kafka = Kafka().start()
        pipeline = Pipeline(kafka.bootstrap, None, Path(work), partitions=1, hints_stage=False)
        times: Dict[bool, List[Tuple[float, float]]] = {False: [], True: []}
        try:
            with TrainerClient(kafka.bootstrap, topics=pipeline.topics) as client:
                step = 0
                for round_ in range(a.rounds + 1):
                    order = (False, True) if round_ % 2 else (True, False)
                    seen: Dict[bool, Dict[str, float]] = {}
                    base = step_rows(step, a.rows, rng)
                    for arrow in order:
                        step += 1
                        # The same rows, under this step's number.
                        publish, wait, advantages = one_step(client, "bench", step, base, arrow)
                        seen[arrow] = advantages
                        if round_ > 0:
                            times[arrow].append((publish, wait))
                    if seen[False] != seen[True]:
                        raise SystemExit(f"round {round_}: the JSON step's advantages differ from the Arrow step's")
        finally:
            pipeline.stop()
            kafka.kill()
    lines = [
        "# A trainer's step: publish_scored, then wait_advantages (JSON rows against Arrow)",
        f"- date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; machine: {os.cpu_count()} CPUs, {platform.machine()}; load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- {a.rows:,} rows a step, {a.rounds} steps each way, alternated; one `hintstream advantages` ({hintstream_bin()}), Apache Kafka, 1 partition",
        f"- command: `scripts/bench-trainer-step.sh --rows {a.rows} --rounds {a.rounds}`",
        "",
        "| rows sent as | publish_scored ms, median (min) | then wait_advantages ms, median (min) | the step ms, median (min) |",
        "|---|---:|---:|---:|",
    ]
    totals = {}
    for arrow, name in ((False, "JSON, a message a row"), (True, "Arrow (arrow=True)")):
        t = times[arrow]
        totals[arrow] = [p + w for p, w in t]
        lines.append(f"| {name} | {ms([p for p, _ in t])} | {ms([w for _, w in t])} | {ms(totals[arrow])} |")
    ratio = statistics.median(totals[False]) / statistics.median(totals[True])
    lines += ["", f"JSON ÷ Arrow, the step's median: {ratio:.1f}x. Each pair's advantages were equal row by row."]
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)


if __name__ == "__main__":
    main()
