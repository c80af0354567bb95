"""The trainer side of hintstream, for Python trainers (confluent-kafka,
pyarrow).

    client = TrainerClient("127.0.0.1:9092")
    client.publish_failed(trajectories)            # FailedTrajectory dicts
    hints = client.read_hints(run_id, step, groups={"task-1", ...})
    client.publish_scored(run_id, step, rows)      # scored_rollout dicts; sends step_end
    table = client.read_advantages(run_id, step)   # pyarrow.Table, input order

Keys follow the wire contract: run_id/step/instance_id for failed
trajectories, run_id/step for scored rollouts. Topic names default to the
design's and can be passed in.
"""
import json
import time
import uuid

import pyarrow as pa
from confluent_kafka import Consumer, Producer

SCHEMA_VERSION = 1


class TrainerClient:
    def __init__(self, bootstrap, failed="rl.trajectories.failed", hints="rl.hints",
                 scored="rl.rollouts.scored", advantages="rl.advantages", metrics="rl.metrics"):
        self.bootstrap = bootstrap
        self.topics = {"failed": failed, "hints": hints, "scored": scored,
                       "advantages": advantages, "metrics": metrics}
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 5})

    def _produce(self, topic, key, value, headers=None):
        self.producer.produce(topic, key=key.encode(), value=value, headers=headers or [])
        self.producer.poll(0)

    def _flush(self):
        remaining = self.producer.flush(30)
        if remaining:
            raise RuntimeError("%d messages not delivered" % remaining)

    def publish_failed(self, trajectories):
        """Publishes FailedTrajectory dicts (schema_version is filled in)."""
        for t in trajectories:
            t = dict(t, schema_version=SCHEMA_VERSION)
            key = "%s/%s/%s" % (t["run_id"], t["step"], t["instance_id"])
            self._produce(self.topics["failed"], key, json.dumps(t).encode())
        self._flush()

    def publish_scored(self, run_id, step, rows, arrow=False):
        """Publishes a step's scored rollouts, then its step_end. With
        arrow=True the rows go as one Arrow IPC stream message."""
        key = "%s/%s" % (run_id, step)
        rows = [dict(r, run_id=run_id, step=step, schema_version=SCHEMA_VERSION, type="scored_rollout") for r in rows]
        if arrow:
            table = pa.table({
                "run_id": [r["run_id"] for r in rows],
                "step": pa.array([r["step"] for r in rows], pa.int64()),
                "instance_id": pa.array([r["instance_id"] for r in rows]).dictionary_encode(),
                "trajectory_id": [r["trajectory_id"] for r in rows],
                "reward": pa.array([float(r["reward"]) for r in rows], pa.float32()),
                "is_hinted": [bool(r["is_hinted"]) for r in rows],
                "hint_category": [r.get("hint_category") for r in rows],
            })
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            self._produce(self.topics["scored"], key, sink.getvalue().to_pybytes(),
                          [("content-type", b"application/vnd.apache.arrow.stream")])
        else:
            for r in rows:
                self._produce(self.topics["scored"], key, json.dumps(r).encode())
        end = {"type": "step_end", "schema_version": SCHEMA_VERSION, "run_id": run_id, "step": step, "count": len(rows)}
        self._produce(self.topics["scored"], key, json.dumps(end).encode())
        self._flush()

    def _consumer(self, topic):
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "trainer-%s" % uuid.uuid4(),
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([topic])
        return c

    def read_hints(self, run_id, step, groups, timeout=120.0):
        """Returns {instance_id: hint dict} once every group has a hint,
        deduplicated by hint_id (delivery is at-least-once)."""
        c = self._consumer(self.topics["hints"])
        found, deadline = {}, time.time() + timeout
        try:
            while set(found) < set(groups):
                if time.time() > deadline:
                    raise TimeoutError("hints for %d of %d groups" % (len(found), len(groups)))
                m = c.poll(1.0)
                if m is None or m.error():
                    continue
                hint = json.loads(m.value())
                if hint["run_id"] == run_id and hint["step"] == step:
                    found.setdefault(hint["instance_id"], hint)
        finally:
            c.close()
        return found

    def _read_keyed(self, topic, key, timeout):
        c = self._consumer(topic)
        deadline = time.time() + timeout
        try:
            while time.time() < deadline:
                m = c.poll(1.0)
                if m is not None and not m.error() and m.key() == key.encode():
                    return m
        finally:
            c.close()
        raise TimeoutError("nothing for %s on %s" % (key, topic))

    def read_advantages(self, run_id, step, timeout=120.0):
        """The step's advantages as a pyarrow.Table (input order)."""
        m = self._read_keyed(self.topics["advantages"], "%s/%s" % (run_id, step), timeout)
        return pa.ipc.open_stream(m.value()).read_all()

    def read_metrics(self, run_id, step, timeout=120.0):
        m = self._read_keyed(self.topics["metrics"], "%s/%s" % (run_id, step), timeout)
        return json.loads(m.value())
