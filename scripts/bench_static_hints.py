"""Stage 1's static-hint path against a consume->produce passthrough, side by
side on one broker (scripts/bench-static-hints.sh runs it; see there).

N small failed trajectories of group_size 1 go to an input topic once; then,
each alone, (a) a passthrough in Python (confluent-kafka, batches of 1,000,
no parsing, an offset commit a batch) copies them to a topic of its own, and
(b) `hintstream hints` with no model API (static hints) turns them into
hints. Each side is timed from its start (process or consumer created) to
the moment its output topic holds N messages (high watermarks polled every
20 ms), start-up included. Prints one Markdown table to stdout, then the
steady rates: each side's messages a second on its output topic between 10%
and 90% of N, its start-up and its tail left out. The passthrough's and the floor's consumers
pause a full prefetch queue's fetching 10 ms, as the worker's do (until
2026-12-06 librdkafka's 1000 ms, which stopped them for the rest of a second
in many runs), and ask up to 16 MiB of a partition in a fetch, as the
worker's do with its 64 MiB queue.

Before the first side, a throwaway consumer group commits an offset: the
broker's first group creates its offsets topic and loads its coordinator
(3-4 s on a fresh node), which would otherwise be timed in whichever side
ran first (the passthrough, until 2026-12-03). The warm-up's producer is
idempotent: the broker's first producer id is refused while its coordinator
loads ("Coordinator load in progress"), and librdkafka asks again 500 ms
later, which the worker, the first idempotent producer otherwise, paid
(until 2026-12-05).

With `--cached D`, the cached path instead: the N inputs are D distinct
trajectories, each sent N / D times (message i is trajectory i mod D), and
the worker has a model, a loopback Anthropic Messages server in this
process: the first of each trajectory's copies costs one model call, every
later copy (a redelivery or a late member, to the worker) is answered from
the hint cache. With a model the worker's readers run (the hints and
outcomes topics read back), as they do in a trainer's run. The table then
also says when the model answered its last call and how quickly the cache
served the rest.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def log(*args):
    print("bench-static-hints:", *args, file=sys.stderr, flush=True)


def trajectory(i):
    instance = f"task-{i:08d}"
    return json.dumps({
        "schema_version": 1, "run_id": "bench", "step": i // 1000, "instance_id": instance,
        "trajectory_id": f"{instance}-r0", "task_prompt": f"Solve {instance}", "reward": 0.0,
        "group_size": 1, "env_class": "swe",
        "chat_history": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": "done"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }).encode(), f"bench/{i // 1000}/{instance}".encode()


def create_topics(bootstrap, names, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=60)
    for future in futures.values():
        future.result(timeout=90)


class ModelServer:
    """A loopback Anthropic Messages endpoint (`POST /v1/messages`) that
    answers every request with one hint and counts the requests."""

    REPLY = json.dumps({
        "id": "msg", "type": "message", "role": "assistant", "model": "claude-sonnet-4-20250514",
        "content": [{"type": "text", "text": "Print the result in the format check_output expects."}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 900, "output_tokens": 40},
    }).encode()

    def __init__(self):
        self.requests = 0
        # When the last request was answered (time.monotonic()).
        self.last_answer = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer's headers and body go out in two writes; with Nagle's
            # algorithm the body waited for the client's delayed ACK of the
            # headers, 40 ms an answer (until 2026-12-05: 1,000 calls at
            # llm.concurrency 20 took 2-3 s of the run).
            disable_nagle_algorithm = True

            def do_GET(self):
                # The stage's start-up probe asks for the model list.
                body = b'{"data":[{"type":"model","id":"claude-sonnet-4-20250514"}],"has_more":false}'
                self.send_response(200 if self.path.startswith("/v1/models") else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/messages":
                    self.send_error(404)
                    return
                server.requests += 1
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(ModelServer.REPLY)))
                self.end_headers()
                self.wfile.write(ModelServer.REPLY)
                server.last_answer = time.monotonic()

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def url(self):
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self):
        self.http.shutdown()


def warm_up(bootstrap, tag):
    """Creates the broker's offsets topic and loads its group coordinator
    (one group's first commit), and has the broker hand out its first
    producer id (an idempotent producer's), so that neither side pays for
    them."""
    started = time.monotonic()
    topic = f"warm-{tag}"
    create_topics(bootstrap, [topic], 1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topic, b"warm")
    if producer.flush(60):
        raise SystemExit("warm-up: the broker did not acknowledge a message in 60 s")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = started + 120
    while True:
        msg = consumer.poll(1.0)
        if msg is not None and not msg.error():
            break
        if time.monotonic() > deadline:
            raise SystemExit("warm-up: no message read back in 120 s")
    consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    log(f"broker warmed up (offsets topic, group coordinator) in {time.monotonic() - started:.1f} s")


def fill(bootstrap, topic, n, distinct=0):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": "none"})
    started = time.monotonic()
    for i in range(n):
        value, key = trajectory(i % distinct if distinct else i)
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise SystemExit(f"{left} input messages not acknowledged after 120 s")
    log(f"{n} inputs produced in {time.monotonic() - started:.1f} s")


def count(watcher, topic, partitions):
    total = 0
    for p in range(partitions):
        low, high = watcher.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
        total += high
    return total


def wait_for(watcher, topic, partitions, n, deadline_s, what, alive=lambda: True, progress=None):
    """Polls `topic` until it holds N messages; each (time, count) polled
    goes into `progress` when given."""
    deadline = time.monotonic() + deadline_s
    while True:
        have = count(watcher, topic, partitions)
        if progress is not None:
            progress.append((time.monotonic(), have))
        if have >= n:
            return
        if not alive():
            raise SystemExit(f"{what} exited with {have} of {n} messages on {topic}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {have} of {n} messages on {topic} after {deadline_s} s")
        time.sleep(0.02)


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy():
    """(busy, total) jiffies of all CPUs so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


class Side:
    """The broker's CPU seconds and the machine's busy share over one side's span."""

    def __init__(self, broker_pid):
        self.broker_pid = broker_pid
        self.broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
        self.busy_before = machine_busy()

    def end(self):
        broker = cpu_seconds(self.broker_pid) - self.broker_before if self.broker_pid else float("nan")
        busy, total = machine_busy()
        share = (busy - self.busy_before[0]) / max(1, total - self.busy_before[1])
        return broker, share


def passthrough(bootstrap, source, sink, n, partitions, watcher, deadline_s, progress):
    """Moves N messages from `source` to `sink`; returns the seconds from
    its start to N on `sink` and its CPU seconds (the counting thread's
    own left out). A thread of this process counts `sink` meanwhile, with
    `wait_for` as the other sides are counted, each (time, count) into
    `progress`, its start first."""
    started, cpu_before = time.monotonic(), cpu_seconds(os.getpid())
    progress.append((started, 0))
    counted = {}

    def count_to_n():
        try:
            wait_for(watcher, sink, partitions, n, deadline_s, "passthrough", progress=progress)
        except BaseException as e:  # its deadline's SystemExit too, raised again below
            counted["error"] = e
        counted["cpu"] = time.thread_time()

    counting = threading.Thread(target=count_to_n, daemon=True)
    counting.start()
    consumer = move(bootstrap, source, sink, n, started + deadline_s, deadline_s)
    counting.join()
    if "error" in counted:
        raise SystemExit(f"passthrough: counting {sink} failed: {counted['error']}")
    took = time.monotonic() - started
    cpu = cpu_seconds(os.getpid()) - cpu_before - counted["cpu"]
    consumer.close()
    return took, cpu


def move(bootstrap, source, sink, n, deadline, deadline_s):
    """The passthrough itself: N messages consumed from `source` in batches
    of 1,000 and produced to `sink`, flushed; returns its consumer, still
    open."""
    # The worker's fetch backoff (src/kafka/settings.rs): with librdkafka's
    # 1000 ms, a passthrough that drains its prefetch queue quicker than the
    # broker fills it stopped for the rest of a second in many runs
    # (docs/BENCHMARKS.md, round thirty-two). And the worker's fetch of a
    # partition: a quarter of its 64 MiB queue (round thirty-three).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"pt-{sink}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "fetch.queue.backoff.ms": 10,
                         "max.partition.fetch.bytes": 16 << 20})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    consumer.subscribe([source])
    moved = 0
    while moved < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"passthrough: {moved} of {n} moved after {deadline_s} s")
        batch = consumer.consume(1000, 1.0)
        for msg in batch:
            if msg.error():
                continue
            while True:
                try:
                    producer.produce(sink, msg.value(), msg.key())
                    break
                except BufferError:
                    producer.poll(0.05)
            moved += 1
        producer.poll(0)
        if batch:
            consumer.commit(asynchronous=True)
    producer.flush(60)
    return consumer


def worker_topics(tag, outcomes):
    """The topics a worker of `tag` writes or reads back (config_text names
    them) besides its input, on the input's partitions, and its spend topic
    (one partition)."""
    return [f"hints-{tag}", f"dlq-{tag}"] + ([f"outcomes-{tag}"] if outcomes else []), f"spend-{tag}"


def config_text(bootstrap, tag, partitions, model, input_tag=None):
    """The worker's config: its topics named by `tag`, its input by
    `input_tag` (`tag` when None)."""
    source = f"in-{input_tag or tag}"
    return f"""bootstrap_servers = "{bootstrap}"
[topics]
failed = "{source}"
hints = "hints-{tag}"
outcomes = "outcomes-{tag}"
spend = "spend-{tag}"
partitions = {partitions}
replication_factor = 1
[hints]
group_id = "hints-{tag}"
input_topic = "{source}"
output_topic = "hints-{tag}"
dlq_topic = "dlq-{tag}"
metrics_addr = "127.0.0.1:0"
[llm]
""" + (LLM_MODEL if model else 'provider = "none"\n')


LLM_MODEL = """provider = "anthropic"
requests_per_minute = 0
"""


def hintstream(binary, bootstrap, tag, n, partitions, watcher, deadline_s, perf_out, model, progress,
               input_tag=None):
    work = tempfile.mkdtemp(prefix="bench-static-hints-")
    config = os.path.join(work, "hintstream.toml")
    with open(config, "w") as f:
        f.write(config_text(bootstrap, tag, partitions, model, input_tag))
    env = dict(os.environ)
    if model:
        env.update(ANTHROPIC_API_KEY="sk-bench", ANTHROPIC_BASE_URL=model.url())
    command = [binary, "hints", "--config", config]
    if perf_out:
        command = ["perf", "record", "-e", "cpu-clock", "-F", "499", "-g", "-o", perf_out, "--"] + command
    # Under perf, the worker is timed and stopped, and perf writes its file
    # as the worker exits.
    return timed(command, os.path.join(work, "hints.log"), watcher, f"hints-{tag}", partitions, n,
                 deadline_s, "hintstream hints", env=env, pid_of=lambda p: worker_pid(p, perf_out),
                 progress=progress)


def timed(command, logpath, watcher, topic, partitions, n, deadline_s, what, env=None,
          pid_of=lambda process: process.pid, progress=None):
    """Runs `command` (its output to `logpath`) until `topic` holds N
    messages, then stops it (SIGTERM to `pid_of` it); returns the seconds
    from its start and the CPU seconds of `pid_of` it. On a failure, the
    log's tail is printed."""
    logfile = open(logpath, "w")
    started = time.monotonic()
    if progress is not None:
        # Nothing is out before the launch: the count the others start from.
        progress.append((started, 0))
    process = subprocess.Popen(command, stdout=logfile, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(watcher, topic, partitions, n, deadline_s, what, alive=lambda: process.poll() is None,
                 progress=progress)
        took = time.monotonic() - started
        cpu = cpu_seconds(pid_of(process))
    except SystemExit:
        logfile.flush()
        log(open(logpath).read()[-4000:])
        raise
    finally:
        os.kill(pid_of(process), signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    return took, cpu


def sample_hint(bootstrap, topic, partitions):
    """One hint from `topic`: its bytes and its headers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sample-{topic}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                return msg.value(), msg.headers() or []
    finally:
        consumer.close()
    raise SystemExit(f"no hint read back from {topic} in 60 s")


def floor(binary, bootstrap, tag, n, partitions, watcher, deadline_s, hint, progress, hint_work=False):
    """The floor (examples/static_floor.rs) from start to N outputs; with
    `hint_work`, the floor doing stage 1's hint work (`--hint-work`: each
    output the hint made from its input, not a copy of `hint`'s bytes), on
    its own group and output topic."""
    payload, headers = hint
    work = tempfile.mkdtemp(prefix="bench-static-floor-")
    path = os.path.join(work, "hint.json")
    with open(path, "wb") as f:
        f.write(payload)
    output = worked_floor_topic(tag) if hint_work else f"floor-{tag}"
    command = [binary, "--bootstrap", bootstrap, "--group", output, "--input", f"in-{tag}",
               "--output", output, "--payload", path] + (["--hint-work"] if hint_work else [])
    for name, value in headers:
        text = (value or b"").decode()
        if name == "traceparent":
            # Each hint's own in the worker: a fixed one of the same length here.
            text = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
        command += ["--header", f"{name}={text}"]
    return timed(command, os.path.join(work, "floor.log"), watcher, output, partitions, n,
                 deadline_s, "the floor with the hint work" if hint_work else "the floor", progress=progress)


def worked_floor_topic(tag):
    return f"wfloor-{tag}"


def check_worked_floor(worker, worked):
    """Refuses a run where the floor's hint work wrote something else than
    the worker's hints: each (bytes, headers), one of each, must hold the
    same fields, the same static hint text and the same labels (its id is
    made from them and the input's group)."""
    ours, its = json.loads(worker[0]), json.loads(worked[0])
    same = ("hint", "category", "arm", "prompt_version", "schema_version")
    if sorted(ours) != sorted(its) or any(ours.get(k) != its.get(k) for k in same):
        raise SystemExit(f"the floor's hint work wrote {worked[0][:300]!r}, unlike the worker's "
                         f"{worker[0][:300]!r}")


def worker_pid(process, perf_out):
    if not perf_out:
        return process.pid
    with open(f"/proc/{process.pid}/task/{process.pid}/children") as f:
        children = f.read().split()
    return int(children[0]) if children else process.pid


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--hintstream", required=True)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--deadline-secs", type=int, default=900)
    parser.add_argument("--perf", default="", help="record hintstream with perf into this file")
    parser.add_argument("--broker-pid", type=int, default=0,
                        help="the broker's process, whose CPU seconds each side is given")
    parser.add_argument("--no-outcomes-topic", action="store_true",
                        help="leave the outcomes topic out: the worker then reads neither it nor the "
                             "hints topic, and no step waits for the learning read barrier")
    parser.add_argument("--floor", default="", metavar="PATH",
                        help="run the floor (examples/static_floor.rs, this binary) as a third side")
    parser.add_argument("--worked-floor", action="store_true",
                        help="with --floor, run it a second time doing stage 1's hint work on each input "
                             "(--hint-work: the best a worker built like the floor could do) as one more side")
    parser.add_argument("--vs", default="", metavar="PATH",
                        help="another hintstream binary, run the same way on the same input (its own "
                             "group and output topic) beside --hintstream, after it in odd-numbered repeats "
                             "(the first, the third, ...) and before it in the others; the report adds its "
                             "side and the two workers' CPU ratio")
    parser.add_argument("--cached", type=int, default=0, metavar="D",
                        help="the cached path: D distinct trajectories, each sent N / D times, and a "
                             "loopback model that the first copy of each calls")
    args = parser.parse_args()
    if args.vs and args.cached:
        parser.error("--vs compares static paths; leave --cached out")
    if args.vs and args.perf:
        parser.error("--perf would slow one side of a --vs comparison; run them apart")
    if args.worked_floor and not args.floor:
        parser.error("--worked-floor runs the floor's binary: give --floor")
    if args.worked_floor and args.cached:
        parser.error("--worked-floor does the static path's hint work; leave --cached out")
    if args.cached and args.no_outcomes_topic:
        parser.error("--cached reads the outcomes topic back; leave --no-outcomes-topic out")
    n, parts = args.messages, args.partitions
    rows = []
    warm_up(args.bootstrap, f"sh{os.getpid()}")
    for r in range(args.repeats):
        tag = f"sh{os.getpid()}r{r}"
        topics, spend = worker_topics(tag, not args.no_outcomes_topic)
        topics += [f"in-{tag}", f"pass-{tag}", f"floor-{tag}"] + ([worked_floor_topic(tag)] if args.worked_floor else [])
        spend = [spend]
        if args.vs:
            # The --vs side's own, made with the others: before the input is written.
            own, own_spend = worker_topics(versus_tag(tag), not args.no_outcomes_topic)
            topics += own
            spend.append(own_spend)
        create_topics(args.bootstrap, topics, parts)
        create_topics(args.bootstrap, spend, 1)
        fill(args.bootstrap, f"in-{tag}", n, args.cached)
        watcher = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"watch-{tag}"})
        side = Side(args.broker_pid)
        base_progress = []
        base, base_cpu = passthrough(args.bootstrap, f"in-{tag}", f"pass-{tag}", n, parts, watcher, args.deadline_secs,
                                     base_progress)
        base_broker, base_busy = side.end()
        log(f"passthrough: {n / base:,.0f} msg/s")
        other, other_steady = None, None
        if args.vs and r % 2 == 1:
            other, other_steady = versus(args, tag, n, parts, watcher)
        model = ModelServer() if args.cached else None
        side = Side(args.broker_pid)
        progress = []
        try:
            hs, hs_cpu = hintstream(args.hintstream, args.bootstrap, tag, n, parts, watcher,
                                    args.deadline_secs, args.perf if r == 0 else "", model, progress)
        finally:
            if model:
                model.close()
        hs_broker, hs_busy = side.end()
        if args.vs and r % 2 == 0:
            other, other_steady = versus(args, tag, n, parts, watcher)
        log(f"hintstream: {n / hs:,.0f} hints/s"
            + (f" ({model.requests} model calls for {args.cached} distinct trajectories)" if model else ""))
        if model and model.requests < min(args.cached, n):
            raise SystemExit(f"the model was called {model.requests} times for {args.cached} distinct "
                             "trajectories: some hints were not the model's")
        low, low_steady = None, None
        if args.floor:
            hint = sample_hint(args.bootstrap, f"hints-{tag}", parts)
            side = Side(args.broker_pid)
            floor_progress = []
            fl, fl_cpu = floor(args.floor, args.bootstrap, tag, n, parts, watcher, args.deadline_secs, hint,
                               floor_progress)
            low = (fl, fl_cpu, *side.end())
            low_steady = steady(floor_progress, n)
            log(f"floor: {n / fl:,.0f} msg/s ({len(hint[0])}-byte outputs, {len(hint[1])} headers)")
        worked, worked_steady = None, None
        if args.worked_floor:
            side = Side(args.broker_pid)
            worked_progress = []
            wf, wf_cpu = floor(args.floor, args.bootstrap, tag, n, parts, watcher, args.deadline_secs, hint,
                               worked_progress, hint_work=True)
            worked = (wf, wf_cpu, *side.end())
            worked_steady = steady(worked_progress, n)
            check_worked_floor(hint, sample_hint(args.bootstrap, worked_floor_topic(tag), parts))
            log(f"floor with the hint work: {n / wf:,.0f} msg/s")
        watcher.close()
        after = after_model(progress, model.last_answer) if model else None
        rows.append(((base, base_cpu, base_broker, base_busy), (hs, hs_cpu, hs_broker, hs_busy), low, after,
                     other, (steady(base_progress, n), steady(progress, n), low_steady, other_steady, worked_steady),
                     worked))
    spans = "s (CPU s; broker CPU s; machine busy)"
    head = f"| repeat | messages | passthrough {spans} | passthrough msg/s | hintstream {spans} | hints/s | ratio |"
    rule = "|---:|---:|---:|---:|---:|---:|---:|"
    if args.floor:
        head += f" floor {spans} | floor ÷ passthrough | hintstream ÷ floor |"
        rule += "---:|---:|---:|"
    if args.worked_floor:
        head += f" floor with the hint work {spans} | it ÷ passthrough | hintstream ÷ it |"
        rule += "---:|---:|---:|"
    if args.cached:
        head += " the model's last answer, s (hints out) | hints/s after it | after it ÷ passthrough |"
        rule += "---:|---:|---:|"
    if args.vs:
        head += f" --vs {spans} | --vs ÷ passthrough | hintstream CPU ÷ --vs CPU |"
        rule += "---:|---:|---:|"
    print(head)
    print(rule)
    for r, (pt, hs, low, after, other, _, worked) in enumerate(rows):
        line = (f"| {r + 1} | {n:,} | {cell(pt)} | {n / pt[0]:,.0f} | {cell(hs)} | {n / hs[0]:,.0f} "
                f"| {pt[0] / hs[0]:.2f} |")
        if low:
            line += f" {cell(low)} | {pt[0] / low[0]:.2f} | {low[0] / hs[0]:.2f} |"
        if worked:
            line += f" {cell(worked)} | {pt[0] / worked[0]:.2f} | {worked[0] / hs[0]:.2f} |"
        if after:
            at, out, rate = after
            line += f" {at:.2f} ({out:,}) | {rate:,.0f} | {rate / (n / pt[0]):.2f} |"
        elif args.cached:
            line += " - | - | - |"
        if other:
            line += f" {cell(other)} | {pt[0] / other[0]:.2f} | {hs[1] / other[1]:.2f} |"
        print(line)
    rates = [row[5] for row in rows]
    print("\nSteady rates, start-ups left out: messages a second on each side's output topic between 10% and "
          "90% of N (counted about every 20 ms; - where a side leapt over that middle between two counts), and in "
          "brackets the seconds from the side's start to its first message there.\n")

    def rate_cell(rate):
        return f"{rate[0]:,.0f} ({rate[1]:.2f})" if rate else "-"

    head, rule = "| repeat | passthrough msg/s (first s) | hintstream hints/s (first s) | ratio |", "|---:|---:|---:|---:|"
    if args.floor:
        head, rule = head + " floor msg/s (first s) | floor ÷ passthrough |", rule + "---:|---:|"
    if args.worked_floor:
        head, rule = head + " floor with the hint work msg/s (first s) | it ÷ passthrough |", rule + "---:|---:|"
    if args.vs:
        head, rule = head + " --vs hints/s (first s) | --vs ÷ passthrough |", rule + "---:|---:|"
    print(head)
    print(rule)

    def against(rate, pt):
        return f" {rate_cell(rate)} | {rate[0] / pt[0]:.2f} |" if rate and pt else f" {rate_cell(rate)} | - |"

    for r, (pt, hs, low, vs, worked) in enumerate(rates):
        line = f"| {r + 1} | {rate_cell(pt)} |" + against(hs, pt)
        if args.floor:
            line += against(low, pt)
        if args.worked_floor:
            line += against(worked, pt)
        if args.vs:
            line += against(vs, pt)
        print(line)
    both = [(pt, hs) for pt, hs, *_ in rates if pt and hs]
    if both:
        print(f"\nSteady ratio summed over the {len(both)} repeats with both rates (the passthrough's seconds for "
              f"the middle 80% against hintstream's): {sum(1 / pt[0] for pt, _ in both) / sum(1 / hs[0] for _, hs in both):.2f}")
    if args.worked_floor:
        def cpu_us(side):
            """Side `side`'s CPU a message over the repeats, in us."""
            return sum(row[side][1] for row in rows) / (n * len(rows)) * 1e6

        print(f"\nThe floor with the hint work ÷ the passthrough, summed over the repeats: "
              f"{sum(row[0][0] for row in rows) / sum(row[6][0] for row in rows):.2f}; its CPU a message: "
              f"{cpu_us(6):.1f} us, the worker's {cpu_us(1):.1f} us, the floor's {cpu_us(2):.1f} us")
    if args.vs:
        def summed(chosen):
            return sum(row[1][1] for row in chosen) / sum(row[4][1] for row in chosen)
        print(f"\nhintstream CPU ÷ --vs CPU, summed over the repeats: {summed(rows):.3f}; over the "
              f"odd-numbered ones, where --vs ran after hintstream: {summed(rows[0::2]):.3f}"
              + (f"; over the even-numbered ones, where it ran before: {summed(rows[1::2]):.3f}"
                 if len(rows) > 1 else ""))
    if args.cached:
        print("\nThe model's last answer: seconds from the worker's launch until the loopback model answered its "
              "last call, and the hints on the output topic at the first count after it (counts about every "
              "20 ms); after it every hint comes from the cache, and its rate (to N hints) is set against the "
              "passthrough's msg/s.")


def versus_tag(tag):
    return f"{tag}vs"


def versus(args, tag, n, parts, watcher):
    """The --vs binary on repeat `tag`'s input, with its own group and
    output topic: ((s, CPU s, broker CPU s, machine busy), its steady
    rate)."""
    own = versus_tag(tag)
    side = Side(args.broker_pid)
    progress = []
    took, cpu = hintstream(args.vs, args.bootstrap, own, n, parts, watcher, args.deadline_secs, "", None, progress,
                           input_tag=tag)
    log(f"--vs: {n / took:,.0f} hints/s")
    return (took, cpu, *side.end()), steady(progress, n)


def steady(progress, n):
    """(messages a second between the first count at or over 10% of N and
    the last at or under 90%: the middle of a side's run, its start-up and
    its tail left out; seconds from its launch to its first count over 0),
    from its (time, count)s, the first of them its launch; None when the
    middle has fewer than two counts, or no messages between them (a side
    that leapt over it between two counts)."""
    middle = [(t, have) for t, have in progress if 0.1 * n <= have <= 0.9 * n]
    if len(middle) < 2 or middle[-1][0] <= middle[0][0] or middle[-1][1] <= middle[0][1]:
        return None
    first = next(t for t, have in progress if have > 0)
    return (middle[-1][1] - middle[0][1]) / (middle[-1][0] - middle[0][0]), first - progress[0][0]


def after_model(progress, last_answer):
    """(seconds from the worker's launch to the model's last answer, hints
    out at the first count after it, hints/s from then to N) from the side's
    (time, count)s, the first of them its launch; None when the model never
    answered or the last answer came after N."""
    if last_answer is None or len(progress) < 2:
        return None
    started, (ended, total) = progress[0][0], progress[-1]
    at = next(((t, have) for t, have in progress if t >= last_answer), None)
    if at is None or ended <= at[0]:
        return None
    return last_answer - started, at[1], (total - at[1]) / (ended - at[0])


def cell(side):
    took, cpu, broker, busy = side
    return f"{took:.2f} ({cpu:.1f}; {broker:.1f}; {busy:.0%})"


if __name__ == "__main__":
    main()
