"""The W&B bridge, offline: one run per run_id, steps logged out of order
are all in the run (plotted against trainer/step), and a restarted bridge
resumes both its offsets and the same W&B run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka import Producer

from harness import create_topics
from hintstream import step_key
from wandb_offline import read_run

from hintstream.wandb_bridge import STEP_METRIC, bridge, wandb_run_id


def _produce(bootstrap: str, topic: str, run_id: str, steps) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for s in steps:
        metrics = {"step": s, "hint/signal_rescued": s / 100, "hint/prompts_hinted": 16, "reward/pass_at_1": 0.25}
        p.produce(topic, key=step_key(run_id, s).encode(), value=json.dumps(metrics).encode())
    assert p.flush(10) == 0


def _logged_steps(wandb_dir: Path, run_id: str) -> list:
    """Every step logged to ``run_id``'s W&B run under ``wandb_dir`` (each
    bridge process under a folder of its own there)."""
    rid = wandb_run_id(run_id)
    runs = sorted(wandb_dir.glob(f"**/wandb/offline-run-*-{rid}"))
    assert runs, f"no offline run for {run_id} in {list(wandb_dir.glob('**/wandb/*'))}"
    steps = []
    for run in runs:
        (log,) = run.glob("run-*.wandb")
        content = read_run(log)
        assert ("*", STEP_METRIC) in content["metrics"], content["metrics"]
        steps += [row[STEP_METRIC] for row in content["history"]]
        assert all("hint/signal_rescued" in row for row in content["history"])
    return steps


def test_out_of_order_steps_are_all_in_the_run(broker, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    topic = f"py-metrics-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [topic], 3)
    run_a, run_b = f"org/run-a%{uuid.uuid4().hex[:4]}", f"run-b-{uuid.uuid4().hex[:4]}"
    order = [7, 2, 9, 0, 5, 1, 8, 3, 6, 4]  # out of order, across 3 partitions
    _produce(broker.bootstrap, topic, run_a, order)
    _produce(broker.bootstrap, topic, run_b, [3, 1, 2])
    group = f"bridge-{uuid.uuid4().hex[:6]}"

    logged = bridge(broker.bootstrap, topic=topic, project="hintstream-test", group_id=group, max_messages=13, idle_seconds=60, init_kwargs={"dir": str(tmp_path)})
    assert logged == 13
    assert sorted(_logged_steps(tmp_path, run_a)) == list(range(10))
    assert sorted(_logged_steps(tmp_path, run_b)) == [1, 2, 3]

    # Restarted (as `python -m hintstream.wandb_bridge`): it resumes after
    # its committed offsets and appends to the same W&B run (the same run
    # id). Its offline files go to a folder of their own: W&B names an
    # offline run's folder by the second it started and the run id, so a
    # restart within the same second would write over the first's.
    _produce(broker.bootstrap, topic, run_a, [11, 10])
    restarted = tmp_path / "restarted"
    restarted.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(restarted)}
    out = subprocess.run(
        [sys.executable, "-m", "hintstream.wandb_bridge", "--bootstrap-servers", broker.bootstrap, "--topic", topic,
         "--project", "hintstream-test", "--group-id", group, "--max-messages", "2", "--idle-seconds", "60"],
        env=env, cwd=restarted, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "logged 2 steps" in out.stdout, out.stdout
    assert sorted(_logged_steps(tmp_path, run_a)) == list(range(12))
