"""Logs hintstream's per-step metrics (the metrics topic, ``rl.metrics``) to
Weights & Biases.

    python -m hintstream.wandb_bridge --bootstrap-servers HOST:PORT [--project hintstream]

- One W&B run per trainer ``run_id`` (``wandb.init(reinit="create_new")``,
  several runs open at once), whose id is derived from the run_id, opened
  with ``resume="allow"``: a restarted bridge appends to the same run.
- Every metric is plotted against ``trainer/step`` (``define_metric``), and
  each message is logged with ``trainer/step`` set to its step rather than
  as W&B's own ``step=``: steps arrive out of order across partitions, and
  W&B drops a ``step=`` lower than one already logged.
- The bridge reads as a consumer group (``--group-id``) and commits what it
  logged, so a restart resumes where it stopped (at least once: a step may be
  logged twice after a crash).

``WANDB_MODE=offline`` writes the runs locally (``wandb sync`` uploads them).
Needs the ``wandb`` extra: ``pip install 'hintstream[wandb]'``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import sys
import time
from typing import Any, Dict, Mapping, Optional, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException

from .keys import parse_step_key

log = logging.getLogger("hintstream.wandb_bridge")

#: The step metric every other metric is plotted against.
STEP_METRIC = "trainer/step"


def wandb_run_id(run_id: str) -> str:
    """A W&B run id for a trainer run_id: its safe characters (at most 48)
    and a hash of the whole, so different run_ids never share a W&B run and
    the same run_id always maps to the same one."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", run_id).strip("-")[:48] or "run"
    return f"{slug}-{hashlib.sha256(run_id.encode('utf-8')).hexdigest()[:12]}"


class WandbBridge:
    """Logs step-metrics messages to W&B, one run per run_id.

    :param project: W&B project.
    :param entity: W&B entity (team or user), default the account's.
    :param init_kwargs: more ``wandb.init`` arguments (``dir``, ``tags``, ...).
    """

    def __init__(self, project: str = "hintstream", entity: Optional[str] = None, init_kwargs: Optional[Mapping[str, Any]] = None) -> None:
        import wandb  # the [wandb] extra

        self._wandb = wandb
        self.project = project
        self.entity = entity
        self.init_kwargs = dict(init_kwargs or {})
        self.runs: Dict[str, Any] = {}

    def run_for(self, run_id: str) -> Any:
        """The open W&B run of ``run_id`` (created or resumed on first use)."""
        run = self.runs.get(run_id)
        if run is None:
            run = self._wandb.init(
                project=self.project,
                entity=self.entity,
                id=wandb_run_id(run_id),
                name=run_id,
                resume="allow",
                reinit="create_new",
                config={"hintstream_run_id": run_id},
                **self.init_kwargs,
            )
            run.define_metric(STEP_METRIC)
            run.define_metric("*", step_metric=STEP_METRIC)
            self.runs[run_id] = run
        return run

    def log(self, run_id: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Logs one step's metrics (numbers only; ``step`` becomes
        ``trainer/step``)."""
        row: Dict[str, Any] = {
            k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        row[STEP_METRIC] = int(step)
        self.run_for(run_id).log(row)

    def log_message(self, key: Optional[bytes], value: Optional[bytes]) -> bool:
        """Logs one metrics-topic message (key ``run_id/step``, value a JSON
        object); returns False (and logs why) for one it cannot read."""
        try:
            run_id, step = parse_step_key((key or b"").decode("utf-8"))
            metrics = json.loads(value or b"")
            if not isinstance(metrics, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("skipping a metrics message (key %r): %s", key, e)
            return False
        self.log(run_id, int(metrics.get("step", step)), metrics)
        return True

    def finish(self) -> None:
        """Finishes every open run."""
        for run in self.runs.values():
            run.finish()
        self.runs.clear()


def bridge(
    bootstrap_servers: str,
    topic: str = "rl.metrics",
    project: str = "hintstream",
    group_id: str = "hintstream-wandb-bridge",
    config: Optional[Mapping[str, Any]] = None,
    entity: Optional[str] = None,
    max_messages: Optional[int] = None,
    idle_seconds: Optional[float] = None,
    init_kwargs: Optional[Mapping[str, Any]] = None,
) -> int:
    """Reads ``topic`` as consumer group ``group_id`` (from the earliest
    offset the first time, from its commits afterwards) and logs every
    message to W&B; stops after ``max_messages`` messages or ``idle_seconds``
    without one (runs forever otherwise). Offsets are committed after the
    message was logged. Returns how many messages were logged. ``config``:
    librdkafka properties (SASL, TLS) passed through."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            **dict(config or {}),
            # Only committed transactional records (see client.py).
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    sink = WandbBridge(project=project, entity=entity, init_kwargs=init_kwargs)
    logged = 0
    last = time.monotonic()
    try:
        while max_messages is None or logged < max_messages:
            m = consumer.poll(0.5)
            if m is None:
                if idle_seconds is not None and time.monotonic() - last >= idle_seconds:
                    break
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            last = time.monotonic()
            if sink.log_message(m.key(), m.value()):
                logged += 1
            consumer.store_offsets(message=m)
    finally:
        sink.finish()
        consumer.close()
    return logged


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hintstream.wandb_bridge``."""
    p = argparse.ArgumentParser(prog="python -m hintstream.wandb_bridge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    p.add_argument("--topic", default="rl.metrics")
    p.add_argument("--project", default="hintstream")
    p.add_argument("--entity")
    p.add_argument("--group-id", default="hintstream-wandb-bridge")
    p.add_argument("--kafka", action="append", default=[], metavar="NAME=VALUE", help="a librdkafka property (repeatable), e.g. security.protocol=SASL_SSL")
    p.add_argument("--max-messages", type=int)
    p.add_argument("--idle-seconds", type=float, help="stop after this long without a message")
    a = p.parse_args(argv)
    config = {}
    for item in a.kafka:
        name, sep, value = item.partition("=")
        if not sep:
            p.error(f"--kafka takes NAME=VALUE, got {item!r}")
        config[name] = value
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    n = bridge(
        a.bootstrap_servers,
        topic=a.topic,
        project=a.project,
        group_id=a.group_id,
        config=config,
        entity=a.entity,
        max_messages=a.max_messages,
        idle_seconds=a.idle_seconds,
    )
    print(f"logged {n} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
