"""End-to-end check of the Python side against running stages: publishes
the sample failed trajectories, reads one hint per group, publishes the
scored rollouts (as Arrow), reads the advantages table, and bridges the step
metrics to W&B (offline). Exits non-zero on any mismatch.

    python roundtrip.py --bootstrap HOST:PORT --data examples/data --topic-prefix PREFIX
"""
import argparse
import glob
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from trainer_client import TrainerClient  # noqa: E402
import wandb_bridge  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--topics", required=True, help="JSON object of topic names")
    a = p.parse_args()
    topics = json.loads(a.topics)
    client = TrainerClient(a.bootstrap, **topics)
    run_id, step = "py-%s" % uuid.uuid4().hex[:8], 12

    failed = [dict(t, run_id=run_id, step=step) for t in load(os.path.join(a.data, "failed_trajectories.jsonl"))]
    groups = {t["instance_id"] for t in failed}
    client.publish_failed(failed)
    hints = client.read_hints(run_id, step, groups)
    assert set(hints) == groups, "a hint for every group"
    assert all(h["hint"] and h["category"] in ("llm_synthesized", "static_fallback", "llm_failed_static_fallback")
               for h in hints.values())
    print("hints: %d groups, categories %s" % (len(hints), sorted({h["category"] for h in hints.values()})))

    rows = [r for r in load(os.path.join(a.data, "scored_rollouts.jsonl")) if r["type"] == "scored_rollout"]
    client.publish_scored(run_id, step, rows, arrow=True)
    table = client.read_advantages(run_id, step)
    assert table.num_rows == len(rows), (table.num_rows, len(rows))
    assert table.column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in rows], "input order"
    for name in ("advantage", "group_mean", "group_std", "is_hinted"):
        assert name in table.column_names, name
    print("advantages: %d rows, columns %s" % (table.num_rows, table.column_names))

    metrics = client.read_metrics(run_id, step)
    assert metrics["hint/total_hinted_rollouts"] == sum(1 for r in rows if r["is_hinted"])

    os.environ.setdefault("WANDB_MODE", "offline")
    logged = wandb_bridge.bridge(a.bootstrap, topic=topics["metrics"], project="hintstream-test",
                                 group="bridge-%s" % uuid.uuid4().hex[:6], max_messages=1)
    assert logged == 1
    runs = glob.glob(os.path.join(os.environ.get("WANDB_DIR", "."), "wandb", "offline-run-*%s*" % run_id))
    assert runs, "an offline W&B run was written"
    # The offline run's transaction log holds the logged history rows.
    logs = glob.glob(os.path.join(runs[0], "run-*.wandb"))
    data = open(logs[0], "rb").read()
    for name in ("hint/total_hinted_rollouts", "hint/signal_rescued", "advantage/extreme_count"):
        assert name.encode() in data, "%s was logged to W&B" % name
    print("wandb: offline run %s, %d bytes logged" % (os.path.basename(runs[0]), len(data)))
    print("roundtrip ok")


if __name__ == "__main__":
    main()
