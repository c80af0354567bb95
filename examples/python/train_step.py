"""One training step of a GRPO trainer wired to hintstream, with the
package in python/ (`pip install ./python`). Against running stages:

    hintstream topics create && (hintstream hints &) && (hintstream advantages &)
    python examples/python/train_step.py --bootstrap-servers 127.0.0.1:9092

The rollouts are faked from examples/data; in a real trainer they come from
the policy and the verifier.
"""

import argparse
import asyncio
import json
import random
import uuid
from collections import Counter
from pathlib import Path

import hintstream

DATA = Path(__file__).resolve().parents[1] / "data" / "failed_trajectories.jsonl"
REQUEST_KEYS = ("task_prompt", "chat_history", "verifier_stdout", "verifier_error", "tool_error_messages", "instance_id")


async def train_step(client: hintstream.TrainerClient, run_id: str, step: int) -> None:
    # 1. The step's raw rollouts; each group whose rollouts all failed needs a
    #    hint, built from its best trajectory.
    best = {}
    for line in DATA.read_text().splitlines():
        t = json.loads(line)
        if t["instance_id"] not in best or t["reward"] > best[t["instance_id"]]["reward"]:
            best[t["instance_id"]] = t
    groups = list(best.values())

    # 2. The reference's hint requests through the drop-in: one (hint, category)
    #    per request, in order; a local static hint for any still missing at
    #    the timeout, so the step never stalls.
    requests = [{k: t.get(k) for k in REQUEST_KEYS} for t in groups]
    hints = await hintstream.synthesize_hints_batch(requests, timeout=30.0, client=client, run_id=run_id, step=step)

    # 3. Hinted retries: the hint goes into the prompt (the reference's
    #    template); each retry has its own trajectory_id and carries the hint's
    #    category; train it on the unhinted prompt (RLTF-SD).
    rows = []
    for t, (hint, category) in zip(groups, hints):
        iid = t["instance_id"]
        rows += [{"instance_id": iid, "trajectory_id": f"{iid}/raw-{i}", "reward": 0.0, "is_hinted": False} for i in range(4)]
        hinted_prompt = hintstream.apply_hint(t["task_prompt"], hint)
        for i in range(2):
            reward = float(random.random() < 0.5)  # verifier(policy(hinted_prompt))
            rows.append({"instance_id": iid, "trajectory_id": f"{iid}/hinted-{i}", "reward": reward, "is_hinted": True, "hint_category": category})
        print(f"[{category}] {iid}: {hint[:100]}")

    # 4. Scored rollouts out; advantages (pyarrow.Table, input order) and the
    #    step's metrics back.
    client.publish_scored(run_id, step, rows, arrow=True)
    advantages = client.wait_advantages(run_id, step, timeout=120)
    metrics = client.wait_metrics(run_id, step, timeout=60)
    print(f"step {step}: {advantages.num_rows} advantages; hints by category {dict(Counter(c for _, c in hints))}")
    print({k: v for k, v in sorted(metrics.items()) if k.startswith(("hint/", "reward/"))})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    a = p.parse_args()
    with hintstream.TrainerClient(a.bootstrap_servers) as client:
        asyncio.run(train_step(client, f"example-{uuid.uuid4().hex[:6]}", 0))


if __name__ == "__main__":
    main()
