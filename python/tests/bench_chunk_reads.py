"""How soon a reader holds the last of a large step's advantages chunks, by
the most its consumer asks of a partition in a fetch: librdkafka's 1 MiB
against the trainer client's ``PARTITION_FETCH_BYTES``, side by side on one
Apache Kafka node started here.

Each repeat publishes a step's chunks (by default a 1M-row step's: 100
messages of 880,000 bytes) as the worker does (idempotent, ``acks=all``, no
linger, at most ``IDEMPOTENT_IN_FLIGHT`` requests in flight), to a fresh
topic, while a consumer with the client's settings (``consumer_settings``,
the fetch size aside) reads it (with ``--behind``, the consumer is polled
only once every chunk is acknowledged, its librdkafka fetching meanwhile: a
trainer whose polling thread was held up, by the GIL or a busy host);
timed from the last
chunk's acknowledgement to the moment the consumer holds it (negative when
the reader held it before the producer heard of its acknowledgement). The two fetch sizes take turns, each first in every other
repeat. Prints a Markdown table.

    python python/tests/bench_chunk_reads.py [--repeats N] [--chunks N] [--chunk-bytes B] [--behind]

(Run it with the python scripts/python-venv.sh prints, which has this
package installed; the broker's jars come from
scripts/kafka.sh, installed on first use.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from harness import Kafka, create_topics  # noqa: E402
from hintstream.client import IDEMPOTENT_IN_FLIGHT, PARTITION_FETCH_BYTES, consumer_settings  # noqa: E402

LIBRDKAFKA_DEFAULT = 1 << 20


def read_after_ack(bootstrap: str, fetch_bytes: int, chunks: int, chunk_bytes: int, deadline_s: float, behind: bool) -> float:
    """Milliseconds from the last chunk's acknowledgement until the reader
    holds it."""
    topic = f"chunks-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], 1)
    # The trainer client's settings (hintstream/client.py), but the fetch's.
    consumer = Consumer(consumer_settings({"bootstrap.servers": bootstrap}, {"max.partition.fetch.bytes": fetch_bytes}, lambda e: print(e, file=sys.stderr)))
    consumer.assign([TopicPartition(topic, 0, 0)])
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "linger.ms": 0,
        "acks": "all",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": IDEMPOTENT_IN_FLIGHT,
    })
    # Its producer id and connection first, and the reader at the topic.
    producer.produce(topic, b"first")
    if producer.flush(deadline_s) != 0:
        raise SystemExit(f"the first message to {topic} was not acknowledged within {deadline_s} s")
    held = {}
    stop = time.monotonic() + deadline_s

    def read() -> None:
        n = 0
        while n < chunks + 1 and time.monotonic() < stop:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                n += 1
        if n == chunks + 1:
            held["at"] = time.perf_counter()

    reader = threading.Thread(target=read)
    if not behind:
        reader.start()
    payload = os.urandom(chunk_bytes)
    for _ in range(chunks):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(deadline_s) != 0:
        raise SystemExit(f"the chunks to {topic} were not acknowledged within {deadline_s} s")
    acked = time.perf_counter()
    if behind:
        reader.start()
    reader.join()
    consumer.close()
    if "at" not in held:
        raise SystemExit(f"the reader did not hold all {chunks} chunks of {topic} within {deadline_s} s")
    return (held["at"] - acked) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--chunk-bytes", type=int, default=880_000)
    parser.add_argument("--deadline-secs", type=float, default=60.0)
    parser.add_argument("--behind", action="store_true", help="start reading once every chunk is acknowledged")
    args = parser.parse_args()
    sizes = [LIBRDKAFKA_DEFAULT, PARTITION_FETCH_BYTES]
    load = os.getloadavg()[0]
    kafka = Kafka().start()
    try:
        rows = []
        for r in range(args.repeats):
            order = sizes if r % 2 == 0 else sizes[::-1]
            took = {size: read_after_ack(kafka.bootstrap, size, args.chunks, args.chunk_bytes, args.deadline_secs, args.behind) for size in order}
            rows.append(took)
            print(f"repeat {r + 1}: " + ", ".join(f"{s >> 20} MiB {took[s]:.1f} ms" for s in sizes), file=sys.stderr, flush=True)
    finally:
        kafka.kill()
    print(f"- date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; machine: {os.cpu_count()} CPUs, {platform.platform()}; "
          f"load average before the broker: {load:.2f}")
    print(f"- {args.chunks} chunks of {args.chunk_bytes:,} bytes a repeat, one partition; "
          f"{'read once all were acknowledged (--behind)' if args.behind else 'read as they were published'}\n")
    print("| repeat | " + " | ".join(f"{s >> 20} MiB fetch: last chunk read, ms after its ack" for s in sizes) + " |")
    print("|---:|" + "---:|" * len(sizes))
    for r, took in enumerate(rows, 1):
        print(f"| {r} | " + " | ".join(f"{took[s]:.1f}" for s in sizes) + " |")
    sums = [sum(t[s] for t in rows) for s in sizes]
    print("| sum | " + " | ".join(f"{v:.1f}" for v in sums) + " |")


if __name__ == "__main__":
    main()
