"""Logs hintstream's step metrics (rl.metrics) to Weights & Biases: one W&B
run per trainer run_id, `wandb.log(metrics, step=step)` per message.

    python wandb_bridge.py --bootstrap 127.0.0.1:9092 [--project hintstream] [--max-messages N]

WANDB_MODE=offline writes runs locally (wandb sync uploads them later).
"""
import argparse
import json

import wandb
from confluent_kafka import Consumer


def bridge(bootstrap, topic="rl.metrics", project="hintstream", group="hintstream-wandb-bridge",
           max_messages=None, idle_seconds=None):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    consumer.subscribe([topic])
    runs, seen, idle = {}, 0, 0.0
    try:
        while max_messages is None or seen < max_messages:
            m = consumer.poll(1.0)
            if m is None or m.error():
                idle += 1.0
                if idle_seconds is not None and idle >= idle_seconds:
                    break
                continue
            idle = 0.0
            run_id, step = m.key().decode().rsplit("/", 1)
            metrics = {k: v for k, v in json.loads(m.value()).items() if k != "step"}
            if run_id not in runs:
                runs[run_id] = wandb.init(project=project, id=run_id, name=run_id, resume="allow", reinit=True)
            runs[run_id].log(metrics, step=int(step))
            seen += 1
    finally:
        for run in runs.values():
            run.finish()
        consumer.close()
    return seen


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--topic", default="rl.metrics")
    p.add_argument("--project", default="hintstream")
    p.add_argument("--max-messages", type=int)
    a = p.parse_args()
    print("logged %d steps" % bridge(a.bootstrap, a.topic, a.project, max_messages=a.max_messages))
