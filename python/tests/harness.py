"""What the integration tests and the benchmark run against: an Apache Kafka
node (or ``HINTSTREAM_TEST_BOOTSTRAP``), both hintstream stages as processes,
and a loopback OpenAI-compatible LLM server that echoes a token found in the
request. Not part of the package.

Binaries: ``CARGO_BIN_EXE_hintstream`` (else ``hintstream`` on PATH, else the
workspace's ``target/debug/hintstream``); the broker's jars from
``scripts/kafka.sh libs`` (Java 17+ and Maven)."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional

from confluent_kafka.admin import AdminClient, NewTopic

from hintstream import Topics

ROOT = Path(__file__).resolve().parents[2]

#: The loopback LLM answers with the first such token of the request.
TOKEN_RE = re.compile(r"TOKEN-[0-9a-f]{8,}")

#: Ports :func:`free_port` has given in this process.
_GIVEN: set = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port of 127.0.0.1, free now and never given before in this process,
    picked as the Rust suite's ``common::free_port`` picks: below the kernel's
    ephemeral range when it leaves room, so that no outgoing connection takes
    it before its server binds it. (Port 0 alone gave a node's broker and
    controller listeners the same port once: the kernel hands a released port
    out again.)"""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            below = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768
    lowest = 10_000
    if below > lowest + 1000:
        for _ in range(200):
            port = random.randrange(lowest, below)
            if port not in _GIVEN and _bindable(port):
                _GIVEN.add(port)
                return port
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free port of 127.0.0.1 that was not given already in 400 tries")


def _binary(env: str, name: str, fallbacks: List[Path]) -> str:
    if os.environ.get(env):
        return os.environ[env]
    found = shutil.which(name)
    if found:
        return found
    for path in fallbacks:
        if path.is_file():
            return str(path)
    raise RuntimeError(f"{name} not found: set {env}")


def hintstream_bin() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return _binary("CARGO_BIN_EXE_hintstream", "hintstream", [target / "debug" / "hintstream", target / "release" / "hintstream"])


def kafka_libs() -> str:
    """The broker's jar folder: ``scripts/kafka.sh libs`` resolves the jars
    with Maven the first time (about a minute), at once later."""
    out = subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "libs"], stdout=subprocess.PIPE, check=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def jvm_options() -> List[str]:
    """The JVM options every node runs with (``scripts/kafka/jvm.options``,
    as scripts/kafka.sh and the Rust harness read them)."""
    text = (ROOT / "scripts" / "kafka" / "jvm.options").read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def wait_for_broker(bootstrap: str, within: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + within
    while True:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: The JVM's guard: it SIGKILLs the JVM once the test process is gone, then
#: removes the node's folder (as tests/it/common/kafka.rs does).
_GUARD = """
"$@" >>"$NODE_DIR/kafka.log" 2>&1 </dev/null &
jvm=$!
echo "$jvm" >"$NODE_DIR/pid"
( while kill -0 "$TEST_PID" 2>/dev/null; do sleep 1; done; kill -9 "$jvm" 2>/dev/null ) &
watcher=$!
wait "$jvm"
kill "$watcher" 2>/dev/null
kill -0 "$TEST_PID" 2>/dev/null || rm -rf "$NODE_DIR"
"""


class Kafka:
    """An Apache Kafka node (KRaft: broker and controller in one JVM) on free
    ports of 127.0.0.1, with ``scripts/kafka/node.properties`` as its base
    settings. :meth:`kill` SIGKILLs it; its folder goes with this object."""

    def __init__(self) -> None:
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="hintstream-kafka-py-")
        self.dir = Path(self._dir.name)
        self.log = self.dir / "kafka.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Kafka":
        libs = kafka_libs()
        log4j = ROOT / "scripts" / "kafka" / "log4j2.properties"
        properties = self.dir / "server.properties"
        c = self.controller_port
        properties.write_text(
            (ROOT / "scripts" / "kafka" / "node.properties").read_text()
            + "\n".join([
                "process.roles=broker,controller",
                "node.id=1",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{c}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                f"controller.quorum.voters=1@127.0.0.1:{c}",
                f"log.dirs={self.dir / 'data'}",
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
            ])
            + "\n"
        )
        java = ["java", f"-Dlog4j2.configurationFile={log4j}"]
        cluster_id = "-"
        while cluster_id.startswith("-"):  # StorageTool would read it as an option
            cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        subprocess.run(
            java + ["-Dhintstream.kafka.log.level=WARN", "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env = {**os.environ, "NODE_DIR": str(self.dir), "TEST_PID": str(os.getpid())}
        self.proc = subprocess.Popen(
            ["sh", "-c", _GUARD, "kafka-node", *java, *jvm_options(), "-cp", f"{libs}/*", "kafka.Kafka", str(properties)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_broker(self.bootstrap, within=120)
        return self

    def kill(self) -> None:
        """SIGKILL: the node stops at once."""
        if self.proc is not None and self.proc.poll() is None:
            pid = (self.dir / "pid").read_text().strip()
            os.kill(int(pid), signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def create_topics(bootstrap: str, names: List[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names], operation_timeout=30)
    for name, future in futures.items():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while set(names) - set(admin.list_topics(timeout=5).topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {names} did not appear")
        time.sleep(0.1)


def unique_topics(prefix: str = "py", outcomes: bool = False) -> Topics:
    """Fresh topic names; with ``outcomes`` an outcomes topic of their own
    too (hints that learn then run: stage 1 reads it and ``rl.hints`` back,
    with a read barrier before each step), else the design's name, which
    these tests' brokers do not hold."""
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return Topics(
        failed=f"{tag}.failed",
        hints=f"{tag}.hints",
        scored=f"{tag}.scored",
        advantages=f"{tag}.advantages",
        metrics=f"{tag}.metrics",
        **({"outcomes": f"{tag}.outcomes"} if outcomes else {}),
    )


def make_topics(bootstrap: str, topics: Topics, partitions: int = 3) -> None:
    names = [topics.failed, topics.hints, topics.scored, topics.advantages, topics.metrics]
    if topics.outcomes != Topics().outcomes:
        names.append(topics.outcomes)
    create_topics(bootstrap, names, partitions)
    create_topics(bootstrap, [topics.failed + ".dlq", topics.scored + ".dlq"], 1)


class _LlmHandler(BaseHTTPRequestHandler):
    server: "LlmServer"
    # Keep-alive, as real APIs do: clients reuse their connections.
    protocol_version = "HTTP/1.1"
    # The headers and the body are two writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK, 40 ms an answer.
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        found = TOKEN_RE.search(prompt)
        self.server.requests += 1
        if self.server.delay:
            time.sleep(self.server.delay)
        text = f"Echo {found.group(0)}: re-run the failing check before finishing." if found else "No token in the request."
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "test-model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 12, "total_tokens": len(prompt) // 4 + 12},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class LlmServer(ThreadingHTTPServer):
    """``POST /v1/chat/completions`` on 127.0.0.1: answers with the first
    ``TOKEN-<hex>`` of the request's messages, each answer ``delay`` seconds
    after its request (a model's own time)."""

    daemon_threads = True

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _LlmHandler)
        self.requests = 0
        self.delay = delay
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # strings and lists of them: valid TOML too


class Stage:
    """A ``hintstream hints`` or ``hintstream advantages`` process.

    :param settings: extra keys by section (``{"advantages":
        {"max_message_bytes": 65536}, "kafka.producer": {"linger.ms": "400"}}``),
        over the defaults below.
    :param tag: names its config, log and consumer group; a stage started
        again with the same tag rejoins the same group."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        topics: Topics,
        llm_base_url: Optional[str],
        workdir: Path,
        settings: Optional[Dict[str, Dict[str, Any]]] = None,
        tag: Optional[str] = None,
    ) -> None:
        self.name = name
        tag = tag or uuid.uuid4().hex[:8]
        self.tag = tag
        sections: Dict[str, Dict[str, Any]] = {
            # Test latency: fetch without waiting out librdkafka's 500 ms
            # default (a consumer's setting: in the shared table librdkafka
            # would warn of it in every producer).
            "kafka.consumer": {"fetch.wait.max.ms": "50"},
            "topics": {k: getattr(topics, k) for k in ("failed", "hints", "scored", "advantages", "metrics", "outcomes")},
            "hints": {
                "group_id": f"py-hints-{tag}",
                "input_topic": topics.failed,
                "output_topic": topics.hints,
                "dlq_topic": f"{topics.failed}.dlq",
                "metrics_addr": "127.0.0.1:0",
                "group_wait_ms": 200,
            },
            "advantages": {
                "group_id": f"py-advantages-{tag}",
                "input_topic": topics.scored,
                "output_topic": topics.advantages,
                "dlq_topic": f"{topics.scored}.dlq",
                "metrics_addr": "127.0.0.1:0",
                "step_timeout_secs": 120,
            },
            "llm": {
                "provider": "openai" if llm_base_url else "none",
                "models": ["loopback-model"],
                "timeout_secs": 10.0,
            },
            "normalize": {"device": "cpu"},
        }
        for section, values in (settings or {}).items():
            sections.setdefault(section, {}).update(values)
        lines = [f'bootstrap_servers = "{bootstrap}"']
        for section, values in sections.items():
            lines.append(f"[{section}]")
            lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in values.items())
        config = workdir / f"{name}-{tag}-{uuid.uuid4().hex[:4]}.toml"
        config.write_text("\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "OPENROUTER_", "HINTSTREAM_"))}
        if llm_base_url:
            env["OPENAI_BASE_URL"] = llm_base_url
        env.setdefault("RUST_LOG", "info")
        self.log = workdir / f"{config.stem}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([hintstream_bin(), name, "--config", str(config)], env=env, stdout=subprocess.DEVNULL, stderr=log)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no drain, no commit."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class Pipeline:
    """Fresh topics on ``bootstrap`` with both stages running on them."""

    def __init__(
        self,
        bootstrap: str,
        llm: Optional[LlmServer],
        workdir: Path,
        partitions: int = 3,
        hints_stage: bool = True,
        advantages_settings: Optional[Dict[str, Dict[str, Any]]] = None,
        outcomes: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = unique_topics(outcomes=outcomes)
        make_topics(bootstrap, self.topics, partitions)
        self.stages: Dict[str, Stage] = {}
        if hints_stage:
            self.stages["hints"] = Stage("hints", bootstrap, self.topics, llm.base_url if llm else None, workdir)
        self.stages["advantages"] = Stage("advantages", bootstrap, self.topics, None, workdir, advantages_settings)

    def stop(self) -> None:
        for stage in self.stages.values():
            stage.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{s.log_text()[-4000:]}" for n, s in self.stages.items())


def put_history(bootstrap: str, topics: Topics, hints: int, advantages: int) -> float:
    """Publishes ``hints`` old hints and ``advantages`` old advantage
    messages (other runs' steps) on the topics, batched; returns seconds."""
    import pyarrow as pa
    from confluent_kafka import Producer

    from hintstream import group_key, step_key
    from hintstream.wire import ipc_stream, json_bytes

    started = time.monotonic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "none", "queue.buffering.max.messages": 200000})
    for i in range(hints):
        run, step, iid = f"old-run-{i % 7}", i // 16, f"old/task-{i % 16}"
        hint = {
            "schema_version": 1, "hint_id": f"old-{i}", "run_id": run, "step": step, "instance_id": iid,
            "trajectory_id": f"old-t-{i}", "hint": "Re-run the failing check before finishing. " * 4,
            "category": "llm_synthesized", "model": "loopback-model", "prompt_version": "v1", "latency_ms": 5,
            "usage": {"input_tokens": 900, "output_tokens": 40}, "cost_usd": 0.0, "failure_reason": None,
            "source": {"topic": topics.failed, "partition": 0, "offset": i}, "created_at": "2026-01-01T00:00:00Z",
        }
        producer.produce(topics.hints, key=group_key(run, step, iid).encode(), value=json_bytes(hint))
        if i % 1000 == 0:
            producer.poll(0)
    n = 112
    for i in range(advantages):
        run, step = f"old-run-{i % 7}", i
        table = pa.table({
            "run_id": [run] * n, "step": pa.array([step] * n, pa.int64()),
            "trajectory_id": [f"t{j}" for j in range(n)], "instance_id": [f"g{j // 6}" for j in range(n)],
            "reward": pa.array([0.5] * n, pa.float64()), "is_hinted": [j % 6 > 3 for j in range(n)],
            "advantage": pa.array([0.1] * n, pa.float64()), "group_mean": pa.array([0.0] * n, pa.float64()),
            "group_std": pa.array([1.0] * n, pa.float64()),
        })
        producer.produce(topics.advantages, key=step_key(run, step).encode(), value=ipc_stream(table),
                         headers=[("content-type", b"application/vnd.apache.arrow.stream")])
        if i % 200 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} history messages not delivered")
    return time.monotonic() - started
