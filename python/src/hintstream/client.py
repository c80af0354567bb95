"""``TrainerClient``: the trainer's side of the pipeline over Kafka.

One producer publishes failed trajectories and scored rollouts; delivery is
checked (any failed or still-queued message raises). One long-lived consumer,
created with the client, reads the hints, advantages and metrics topics from
their ends at that moment: partitions are assigned explicitly (no consumer
group, no rebalances, no commits), and a background thread buffers what
arrives by key. Waiting for step N is then a dictionary look-up, whatever the
topics' history: step 10,000 costs what step 10 does.

What a ``wait_*`` call returns is handed over and forgotten (buffers stay
bounded over a long run), except the last hints returned, kept to answer a
group asked for again; redelivered hints are deduplicated by
``hint_id``, and a step's advantages are returned whole or not at all
(chunked steps are reassembled in chunk order).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import uuid
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from . import wire
from .keys import decode_id, group_key, step_key
from .bounded import Bounded
from .outcomes import DeliveredHints, fill_hint_ids, outcome_messages
from .reassembly import Reassembler
from .wire import Topics

log = logging.getLogger("hintstream")

#: librdkafka's idempotent producer sends no new request for a partition
#: while this many of its messages or more are in flight
#: (``RD_KAFKA_IDEMP_MAX_INFLIGHT``). A batch ready meanwhile waits, and
#: librdkafka's broker thread polls for it without sleeping until an
#: acknowledgement frees a place. A step's chunks (one request each, at about
#: 900 KB against ``batch.size``'s 1 MB) therefore go at most this many at a
#: time: handing a step's 100 chunks over at once kept half a core busy for
#: the whole publish (the worker's own chunks go the same way: its
#: ``kafka::IDEMPOTENT_IN_FLIGHT``).
IDEMPOTENT_IN_FLIGHT = 5

#: The most the client's consumer asks of one partition in a fetch, as the
#: worker's readers ask (``kafka::settings``, a quarter of librdkafka's 64 MiB
#: prefetch queue; of a smaller queue the user sets, a quarter of it, and at
#: least 1 MiB: :func:`partition_fetch_bytes`). librdkafka's 1 MiB holds one advantages chunk (about
#: 900 KB), so a reader behind a step's chunks catches up one round trip a
#: chunk. Read as they were published, the last of a 1M-row step's 100
#: chunks came -5.2 to 1.1 ms after its acknowledgement, against -0.8 to
#: 31.7 ms with 1 MiB (eight steps); read once all were published, 18-32 ms
#: against 23-53 ms (python/tests/bench_chunk_reads.py, ``--behind``).
#: ``config`` or ``consumer_config`` may set its own.
PARTITION_FETCH_BYTES = 16 << 20

#: How long the consumer waits before fetching a partition again once its
#: prefetch queue is full (librdkafka's 64 MiB, less than a 1M-row step's
#: chunks), as the worker's readers wait (``kafka::settings``). librdkafka's
#: default, 1000 ms, held a reader polled only once a 1M-row step's 100
#: chunks were all published for about a second before it had the last one:
#: in 5 of 8 steps with 1 MiB fetches, 8 of 8 with ``PARTITION_FETCH_BYTES``
#: (a full queue sooner). With 10 ms it had it 18-32 ms after the last
#: acknowledgement (python/tests/bench_chunk_reads.py ``--behind``).
FETCH_QUEUE_BACKOFF_MS = 10

#: Messages the background reader takes from the consumer at most at a time
#: (the first waited for, the rest only those already fetched).
POLL_BATCH = 1000

T = TypeVar("T")


def partition_fetch_bytes(queue_kbytes: Any = None) -> int:
    """What the consumer asks of a partition in a fetch: a quarter of its
    prefetch queue (``queued.max.messages.kbytes``, when the user sets it;
    librdkafka's 64 MiB otherwise), within 1 MiB and
    ``PARTITION_FETCH_BYTES``, as the worker's readers ask (both test
    suites read ``schemas/vectors/fetch.json``). A queue that is not a
    whole number is left to librdkafka to refuse."""
    try:
        queue = int(queue_kbytes) * 1024 if queue_kbytes is not None else 64 << 20
    except (TypeError, ValueError):
        return PARTITION_FETCH_BYTES
    return max(1 << 20, min(PARTITION_FETCH_BYTES, queue // 4))


def consumer_settings(
    base: Mapping[str, Any], consumer_config: Optional[Mapping[str, Any]], error_cb: Callable[[KafkaError], None]
) -> Dict[str, Any]:
    """The client's consumer settings: its own defaults, then ``base`` (the
    client's ``config``, bootstrap servers included) and ``consumer_config``
    over them, then the settings its reads rest on, which neither may
    change."""
    own: Dict[str, Any] = {
        "group.id": f"hintstream-trainer-{uuid.uuid4().hex}",
        "auto.offset.reset": "latest",
        # A step waits on these reads: fetch with little delay, and a
        # step's chunks many at a time.
        "fetch.wait.max.ms": 100,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }
    given = {**base, **dict(consumer_config or {})}
    # Not when the fetch is set under librdkafka's other name for it: both
    # keys would reach librdkafka, the later one winning.
    if "fetch.message.max.bytes" not in given:
        own["max.partition.fetch.bytes"] = partition_fetch_bytes(given.get("queued.max.messages.kbytes"))
    return {
        **own,
        **given,
        # Only committed transactional records (the stages under
        # kafka.delivery = "exactly_once"): librdkafka's default, set after
        # consumer_config so that it cannot change it.
        "isolation.level": "read_committed",
        # Offsets are assigned explicitly and never committed.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "error_cb": error_cb,
    }


#: Producer errors that no retry fixes: publishing fails at once.
_FAIL_FAST = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}


def _refuse_repeated_ids(ids: Union[Sequence[str], pa.Array, pa.ChunkedArray], step: int) -> None:
    """``ValueError`` naming a ``trajectory_id`` that ``ids`` (a step's)
    has twice: stage 2 would drop the copy, and the step would never have
    its count of rows."""
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        if pc.count_distinct(ids).as_py() == len(ids):
            return
        ids = ids.to_pylist()
    elif len(set(ids)) == len(ids):
        return
    # The first id, in the step's order, that appears again.
    counts = collections.Counter(ids)
    repeated = next(trajectory_id for trajectory_id in ids if counts[trajectory_id] > 1)
    raise ValueError(f"trajectory_id {repeated!r} appears twice in step {step}: stage 2 would drop the copy and the step would never complete")


class HintstreamError(Exception):
    """Base class of this package's errors."""


class DeliveryError(HintstreamError):
    """Some messages were not delivered: ``failures`` holds (topic, key,
    error) of those that failed, ``undelivered`` how many were still queued
    at the deadline (then purged, so they are not sent later)."""

    def __init__(self, message: str, failures: Sequence[Tuple[str, Optional[bytes], KafkaError]] = (), undelivered: int = 0):
        super().__init__(message)
        self.failures = list(failures)
        self.undelivered = undelivered


class ConsumeError(HintstreamError):
    """The consumer reported an error (anything but partition EOF)."""

    def __init__(self, error: KafkaError, topic: Optional[str] = None, partition: Optional[int] = None):
        where = f" on {topic}[{partition}]" if topic is not None else ""
        super().__init__(f"consumer error{where}: {error}")
        self.error = error


class WaitTimeout(HintstreamError, TimeoutError):
    """Nothing complete arrived for a step before the timeout."""


class TrainerClient:
    """The trainer's connection to hintstream.

    :param bootstrap_servers: Kafka bootstrap servers, comma-separated.
    :param config: librdkafka properties for both the producer and the
        consumer, passed through as they are (``security.protocol``,
        ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
        ``ssl.ca.location``, ...).
    :param topics: topic names (:class:`~hintstream.wire.Topics` or a mapping
        overriding some of ``failed``, ``hints``, ``scored``, ``advantages``,
        ``metrics``); the design's defaults otherwise.
    :param producer_config: extra librdkafka properties for the producer only
        (over ``config``).
    :param consumer_config: extra librdkafka properties for the consumer only
        (over ``config``). Both go over the consumer's own defaults (a 100 ms
        fetch wait, a partition's fetch of ``PARTITION_FETCH_BYTES``, a full
        prefetch queue's pause of ``FETCH_QUEUE_BACKOFF_MS``) and
        under the settings its reads rest on (:func:`consumer_settings`).
    :param start_timeout: seconds to find the end of the topics at start.
    :param max_buffered_steps: unread steps kept per kind (advantages,
        metrics) before the oldest are dropped.
    :param max_buffered_groups: unread groups' hints kept before the oldest
        are dropped.
    :param max_cached_hints: hints already returned that are kept (the most
        recently returned first) to be returned again when their group is
        asked for again.

    Creating the client fixes where reading starts: messages published to the
    hints, advantages and metrics topics before it exists are never read.
    Create it before publishing a step's input. The hints, advantages and
    metrics topics must exist.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        config: Optional[Mapping[str, Any]] = None,
        topics: Union[Topics, Mapping[str, str], None] = None,
        *,
        producer_config: Optional[Mapping[str, Any]] = None,
        consumer_config: Optional[Mapping[str, Any]] = None,
        start_timeout: float = 30.0,
        max_buffered_steps: int = 1024,
        max_buffered_groups: int = 100_000,
        max_cached_hints: int = 10_000,
    ) -> None:
        self.topics = Topics.of(topics)
        base: Dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **dict(config or {})}
        user_error_cb = base.pop("error_cb", None)

        self._lock = threading.Condition()
        self._publish_lock = threading.Lock()
        self._pending: Deque[Exception] = collections.deque()
        self._producer_fatal: List[KafkaError] = []
        self._hints: Bounded = Bounded(max_buffered_groups, "groups' hints")
        self._returned_hint_ids: Deque[str] = collections.deque()
        self._returned_hint_set: Set[str] = set()
        self._max_returned = max(10 * max_buffered_groups, 1000)
        # Hints returned, by hint_id, and the group each was returned for:
        # a group asked for again gets its hint again at once.
        self._cached_hints: "collections.OrderedDict[str, Dict[str, Any]]" = collections.OrderedDict()
        self._cached_groups: Dict[str, str] = {}
        self._max_cached = max(max_cached_hints, 0)
        # Hints handed over, for hint_id on hinted rows and outcomes (outcomes.py).
        self._delivered = DeliveredHints(max_buffered_groups)
        self._chunks = Reassembler(max_buffered_steps)
        self._advantages: Bounded = Bounded(max_buffered_steps, "advantage steps")
        self._metrics: Bounded = Bounded(max_buffered_steps, "metric steps")
        self._unreadable: Bounded = Bounded(max_buffered_steps, "unreadable-message notes")
        self._received: Dict[str, int] = collections.Counter()
        self._last_offsets: Dict[Tuple[str, Optional[int]], int] = {}
        self._closed = False
        self._stop = threading.Event()

        def producer_error(err: KafkaError) -> None:
            if user_error_cb is not None:
                user_error_cb(err)
            if err.fatal() or err.code() in _FAIL_FAST:
                self._producer_fatal.append(err)
            else:
                log.debug("hintstream producer: %s", err)

        def consumer_error(err: KafkaError) -> None:
            if user_error_cb is not None:
                user_error_cb(err)
            if err.fatal() or err.code() in _FAIL_FAST:
                with self._lock:
                    self._pending.append(ConsumeError(err))
                    self._lock.notify_all()
            else:
                log.debug("hintstream consumer: %s", err)

        self._producer = Producer(
            {
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                **base,
                **dict(producer_config or {}),
                "error_cb": producer_error,
            }
        )
        self._consumer = Consumer(consumer_settings(base, consumer_config, consumer_error))
        try:
            self._consumer.assign(self._ends(start_timeout))
        except BaseException:
            self._consumer.close()
            raise
        self._thread = threading.Thread(target=self._poll_loop, name="hintstream-consumer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ start

    def _ends(self, timeout: float) -> List[TopicPartition]:
        """Every partition of the read topics at its current end offset."""
        deadline = time.monotonic() + timeout
        assignment = []
        for topic in (self.topics.hints, self.topics.advantages, self.topics.metrics):
            metadata = self._consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                reason = info.error if info is not None else "absent from metadata"
                raise HintstreamError(f"topic {topic!r} is not readable ({reason}); create it (hintstream topics create) or pass topics=")
            for partition in sorted(info.partitions):
                tp = TopicPartition(topic, partition)
                _, high = self._consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()), cached=False)
                # The high watermark, resolved now: whatever is published
                # from here on is read (OFFSET_END would be resolved later,
                # racing with a fast stage).
                assignment.append(TopicPartition(topic, partition, high))
        return assignment

    # ------------------------------------------------------------ background

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._next_messages()
            except KafkaException as e:
                self._push_error(ConsumeError(e.args[0]))
                continue
            except RuntimeError:  # closed under us
                return
            if not messages:
                continue
            with self._lock:
                for m in messages:
                    self._route(m)
                self._lock.notify_all()

    def _next_messages(self) -> List[Message]:
        """The next message (waited for up to 0.1 s), and those ready behind
        it (up to ``POLL_BATCH`` in all). ``consume(n, timeout)`` alone waits
        until it has ``n`` messages or the timeout passed, so a step's few
        advantages chunks or a group's hint waited out the whole timeout:
        50 ms a read on average."""
        first = self._consumer.poll(0.1)
        if first is None:
            return []
        try:
            rest = self._consumer.consume(num_messages=POLL_BATCH - 1, timeout=0)
        except KafkaException as e:
            # The first is kept: raised here, it would be lost.
            self._push_error(ConsumeError(e.args[0]))
            rest = []
        return [first, *rest]

    def _push_error(self, error: Exception) -> None:
        with self._lock:
            self._pending.append(error)
            self._lock.notify_all()

    def _route(self, m: Message) -> None:
        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                self._pending.append(ConsumeError(err, m.topic(), m.partition()))
            return
        topic = m.topic() or ""
        # Offsets only grow on an assigned partition that is never sought,
        # so a message at or below the last one is a repeat the broker sent
        # again (some brokers re-send a record batch when a fetch starts
        # inside it): dropped, and counted.
        position = (topic, m.partition())
        offset = m.offset()
        last = self._last_offsets.get(position)
        if offset is not None and last is not None and offset <= last:
            self._received["repeated"] += 1
            return
        if offset is not None:
            self._last_offsets[position] = offset
        self._received[topic] += 1
        try:
            if topic == self.topics.hints:
                self._add_hint(m.value())
            elif topic == self.topics.advantages:
                self._add_advantages(m)
            elif topic == self.topics.metrics:
                key = (m.key() or b"").decode("utf-8")
                value = json.loads(m.value() or b"")
                if not isinstance(value, dict):
                    raise ValueError("metrics message is not a JSON object")
                self._metrics[key] = value
                self._metrics.trim()
        except Exception as e:  # a bad message must not stop the client
            key_text = (m.key() or b"").decode("utf-8", errors="replace")
            log.warning("hintstream: unreadable message on %s[%d]@%d (key %r): %s", topic, m.partition(), m.offset(), key_text, e)
            self._received["unreadable"] += 1
            self._unreadable[(topic, key_text)] = f"{topic}[{m.partition()}]@{m.offset()}: {e}"
            self._unreadable.trim()

    def _add_hint(self, payload: Optional[bytes]) -> None:
        hint = json.loads(payload or b"")
        if not isinstance(hint, dict):
            raise ValueError("hint is not a JSON object")
        hint_id = str(hint["hint_id"])
        if hint_id in self._returned_hint_set:
            self._received["duplicate_hints"] += 1
            return
        key = group_key(hint["run_id"], hint["step"], hint["instance_id"])
        entry = self._hints.get(key)
        if entry is None:
            entry = self._hints[key] = {}
            self._hints.trim()
        if hint_id in entry:
            self._received["duplicate_hints"] += 1
        else:
            entry[hint_id] = hint

    def _add_advantages(self, m: Message) -> None:
        """Gathers one advantages message into its step (``reassembly.py``:
        by key and attempt, never mixing two attempts, by the rules of
        ``tools/reassemble.rs``); each attempt that completes replaces the
        step buffered under its key, so the last completed (highest offset)
        wins."""
        step = self._chunks.push(m.key(), m.headers(), m.value())
        if step is not None:
            self._advantages[step.key] = step.table
            self._advantages.trim()

    # ------------------------------------------------------------------ waits

    def _wait(self, ready: Callable[[], Optional[T]], timeout: float) -> Optional[T]:
        """Calls ``ready`` (under the lock) until it returns something or the
        timeout passes; raises the consumer's errors as they come."""
        self._check_open()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            while True:
                if self._pending:
                    raise self._pending.popleft()
                result = ready()
                if result is not None:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(min(remaining, 1.0))


    def _remember_returned(self, hint_id: str) -> None:
        if hint_id in self._returned_hint_set:
            return
        self._returned_hint_ids.append(hint_id)
        self._returned_hint_set.add(hint_id)
        while len(self._returned_hint_ids) > self._max_returned:
            self._returned_hint_set.discard(self._returned_hint_ids.popleft())

    def _cache_returned(self, key: str, hint: Dict[str, Any]) -> None:
        """Keeps ``hint``, returned for group ``key``, to return it again
        (bounded: the least recently returned go first)."""
        if self._max_cached == 0:
            return
        hint_id = str(hint["hint_id"])
        self._cached_hints[hint_id] = hint
        self._cached_hints.move_to_end(hint_id)
        self._cached_groups[key] = hint_id
        while len(self._cached_hints) > self._max_cached:
            old_id, old = self._cached_hints.popitem(last=False)
            old_key = group_key(old["run_id"], old["step"], old["instance_id"])
            if self._cached_groups.get(old_key) == old_id:
                del self._cached_groups[old_key]

    def _cached(self, key: str) -> Optional[Dict[str, Any]]:
        """The hint returned before for group ``key``, if still kept."""
        hint_id = self._cached_groups.get(key)
        return None if hint_id is None else self._cached_hints.get(hint_id)

    def wait_hints(self, run_id: str, step: int, instance_ids: Iterable[str], timeout: float = 60.0) -> Dict[str, Dict[str, Any]]:
        """The hints of step ``step``'s groups, ``{instance_id: hint}`` (the
        ``Hint`` message as a dict: ``hint``, ``category``, ``hint_id``,
        ``trajectory_id``, ``level`` for a graded hint, ...), once every
        group has one or at the timeout, whichever comes first: a group
        missing from the result got no hint in time. Hints published twice
        (redelivery) are buffered once.

        A group asked for again (the same run, step and instance) gets the
        hint it got before, at once, while the client keeps it (the last
        ``max_cached_hints`` returned), unless a new hint for it has arrived
        since: that one is returned.

        Only hints published after the client was created are seen; when a
        group has several (stage 1 restarted with another model chain), the
        first to arrive is returned."""
        keys = {iid: group_key(run_id, step, iid) for iid in instance_ids}
        found: Dict[str, Dict[str, Any]] = {}
        fresh: Set[str] = set()

        def ready() -> Optional[bool]:
            for iid, key in keys.items():
                if iid not in found:
                    entry = self._hints.get(key)
                    if entry:
                        found[iid] = next(iter(entry.values()))
                        fresh.add(iid)
                    else:
                        cached = self._cached(key)
                        if cached is not None:
                            found[iid] = cached
                            self._received["hints_returned_again"] += 1
            return True if len(found) == len(keys) else None

        try:
            self._wait(ready, timeout)
        finally:
            with self._lock:
                for iid, hint in found.items():
                    self._delivered.add(hint)
                    if iid in fresh:
                        for hint_id in self._hints.pop(keys[iid], {}):
                            self._remember_returned(hint_id)
                    self._cache_returned(keys[iid], hint)
        return found

    def wait_advantages(self, run_id: str, step: int, timeout: float = 300.0) -> pa.Table:
        """The step's advantages as one ``pyarrow.Table`` in input order
        (``run_id, step, trajectory_id, instance_id, reward, is_hinted,
        advantage, group_mean, group_std``, and ``weight``, the off-policy
        weight of each row, when stage 2 runs with ``[normalize]
        hinted_weight = "ratio"``: multiply each sample's policy-gradient
        term by it), chunks reassembled. Never a
        partial step: raises :class:`WaitTimeout` when the whole step has not
        arrived in time."""
        key = step_key(run_id, step)
        table: Optional[pa.Table] = self._wait(lambda: self._advantages.pop(key, None), timeout)
        if table is None:
            raise WaitTimeout(self._timeout_text("advantages", self.topics.advantages, key, timeout))
        return table

    def wait_metrics(self, run_id: str, step: int, timeout: float = 60.0) -> Dict[str, Any]:
        """The step's metrics (``rl.metrics``: metric name → number); raises
        :class:`WaitTimeout` when none arrived in time."""
        key = step_key(run_id, step)
        metrics: Optional[Dict[str, Any]] = self._wait(lambda: self._metrics.pop(key, None), timeout)
        if metrics is None:
            raise WaitTimeout(self._timeout_text("metrics", self.topics.metrics, key, timeout))
        return metrics

    def _timeout_text(self, what: str, topic: str, key: str, timeout: float) -> str:
        text = f"no complete {what} for {key!r} on {topic!r} within {timeout:g} s"
        with self._lock:
            partial = self._chunks.partial_of(key) if what == "advantages" else None
            note = self._unreadable.get((topic, key))
            buffered = self._advantages if what == "advantages" else self._metrics
            # The same step under a key whose ids are not percent-encoded.
            unencoded = [k for k in buffered if k != key and decode_id(k) == decode_id(key)]
        if unencoded:
            text += f"; it arrived under the key {unencoded[0]!r}, whose ids are not percent-encoded (a publisher older than the key encoding?)"
        if partial is not None:
            text += f" ({partial.arrived} of {partial.count} chunks arrived)"
        if note is not None:
            text += f"; a message for it could not be read: {note}"
        return text

    # -------------------------------------------------------------- publish

    def publish_failed(self, trajectories: Iterable[Mapping[str, Any]], timeout: float = 30.0) -> int:
        """Publishes ``FailedTrajectory`` dicts (``schema_version`` filled in
        when absent), keyed ``run_id/step/instance_id``, and waits until the
        broker acknowledged every one. Raises :class:`DeliveryError` when any
        delivery failed or is still pending after ``timeout`` seconds, and
        ``ValueError`` for a trajectory stage 1 would reject. Returns how many
        were published."""
        items = []
        for t in trajectories:
            message = dict(t)
            message.setdefault("schema_version", wire.SCHEMA_VERSION)
            wire.check_failed(message)
            key = group_key(message["run_id"], message["step"], message["instance_id"])
            items.append((key, wire.json_bytes(message), None))
        self._produce_all(self.topics.failed, items, timeout)
        return len(items)

    def publish_scored(
        self,
        run_id: str,
        step: int,
        rows: Iterable[Mapping[str, Any]],
        arrow: bool = True,
        timeout: float = 30.0,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> int:
        """Publishes a step's scored rollouts, keyed ``run_id/step``, then its
        ``step_end`` with the row count, and waits for delivery as
        :meth:`publish_failed` does. Each row: ``instance_id``,
        ``trajectory_id`` (unique in the step: hinted rows need their own),
        ``reward``, ``is_hinted`` and optionally ``hint_category`` and
        ``hint_id`` (a hinted row without one gets the id of the hint this
        client delivered for its group, if any), ``response_length``,
        ``logprob_hinted`` and ``logprob_unhinted``. The rows go as Arrow IPC
        stream messages (header ``content-type:
        application/vnd.apache.arrow.stream``): one when the step encodes to
        at most ``max_message_bytes``, else as many as it needs, in row
        order, with the chunk headers (``hintstream.chunk``, ``.chunks``,
        ``.rows``), so a step of any size passes the broker's message limit.
        With ``arrow=False`` they go as one JSON ``scored_rollout`` message a
        row, as a producer without Arrow would send them: stage 2 reads both
        the same, but a step of 10,000 rows took about 4x as long, publishing
        and waiting for its advantages (docs/BENCHMARKS.md,
        ``scripts/bench-trainer-step.sh``). A row stage 2 would refuse (a
        blank id, a reward that is not finite) raises ``ValueError`` before
        anything is sent. Returns the row count."""
        filled = fill_hint_ids(self._delivered, run_id, step, rows)
        key = step_key(run_id, step)
        items: List[Tuple[str, bytes, Optional[List[Tuple[str, Union[str, bytes, None]]]]]] = []
        if arrow:
            # No message made a row: each row's checked values go to Arrow
            # in one conversion (for 10,000 rows 0.7x the client's time of
            # messages made first and then put in a table).
            table = wire.scored_step_table(run_id, step, filled)
            count = table.num_rows
            _refuse_repeated_ids(table.column("trajectory_id"), step)
            content_type = (wire.CONTENT_TYPE_HEADER, wire.ARROW_STREAM_CONTENT_TYPE.encode())
            chunks = wire.table_chunks(table, max_message_bytes)
            if len(chunks) == 1:
                items.append((key, chunks[0], [content_type]))
            else:
                items.extend((key, payload, [content_type, *wire.chunk_headers(i, len(chunks), count)]) for i, payload in enumerate(chunks))
        else:
            messages = wire.scored_rows(run_id, step, filled)
            count = len(messages)
            _refuse_repeated_ids([m["trajectory_id"] for m in messages], step)
            items.extend((key, wire.json_bytes(m), None) for m in messages)
        items.append((key, wire.json_bytes(wire.step_end(run_id, step, count)), None))
        # A step's chunks (up to max_message_bytes each) go a few at a time:
        # see IDEMPOTENT_IN_FLIGHT.
        window = IDEMPOTENT_IN_FLIGHT if arrow else None
        self._produce_all(self.topics.scored, items, timeout, window)
        return count

    def report_hint_outcomes(self, rows: Iterable[Mapping[str, Any]], *, success_threshold: float = 0.0, timeout: float = 30.0) -> int:
        """Publishes one ``HintOutcome`` per ``hint_id`` of ``rows``
        (``{hint_id, reward}``) to the outcomes topic and waits for delivery;
        see :func:`hintstream.report_hint_outcomes`. Returns the count."""
        items = [(key, wire.json_bytes(m), None) for key, m in outcome_messages(self._delivered, rows, success_threshold)]
        self._produce_all(self.topics.outcomes, items, timeout)
        return len(items)

    def _produce_all(
        self,
        topic: str,
        items: Sequence[Tuple[str, bytes, Optional[List[Tuple[str, Union[str, bytes, None]]]]]],
        timeout: float,
        window: Optional[int] = None,
    ) -> None:
        """Produces ``items`` to ``topic`` and waits for every delivery, all
        within ``timeout``. ``window``: fewer than that many messages in the
        producer (queued or awaiting their acknowledgement) when the next is
        handed over, so at most that many after; ``None``: no bound but the
        producer's queue. A window still full at the deadline raises
        :class:`DeliveryError`, counting the items never handed over as
        undelivered."""
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self._check_open()
        failures: List[Tuple[str, Optional[bytes], KafkaError]] = []

        def on_delivery(err: Optional[KafkaError], msg: Message) -> None:
            if err is not None:
                failures.append((msg.topic() or topic, msg.key(), err))

        with self._publish_lock:
            deadline = time.monotonic() + max(0.0, timeout)
            try:
                for handed, (key, value, headers) in enumerate(items):
                    while window is not None and len(self._producer) >= window and not failures:
                        self._raise_producer_fatal()
                        if time.monotonic() >= deadline:
                            never = len(items) - handed
                            queued = len(self._producer)
                            raise DeliveryError(
                                f"publishing {len(items)} messages to {topic!r}: {queued} still undelivered and {never} "
                                f"never handed to the producer after {timeout:g} s (broker unreachable or topic missing?)",
                                list(failures),
                                queued + never,
                            )
                        self._producer.poll(0.05)
                    if failures:
                        break
                    while True:
                        self._raise_producer_fatal()
                        try:
                            self._producer.produce(topic, value=value, key=key.encode("utf-8"), headers=headers, on_delivery=on_delivery)
                            break
                        except BufferError:  # local queue full: let it drain
                            if time.monotonic() >= deadline:
                                raise DeliveryError(f"the producer queue stayed full for {timeout:g} s") from None
                            self._producer.poll(0.05)
                    self._producer.poll(0)
                    if failures:
                        break
                while not failures:
                    remaining = self._producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
                    self._raise_producer_fatal()
                    if remaining == 0 or time.monotonic() >= deadline:
                        break
                left = len(self._producer)
            except KafkaException as e:
                self._purge()
                raise DeliveryError(f"publishing to {topic!r} failed: {e.args[0]}") from e
            except DeliveryError:
                self._purge()
                raise
            if failures or left:
                failed = list(failures)  # before the purge adds its own callbacks
                self._purge()
                first = failed[0][2] if failed else None
                reason = f"{len(failed)} failed (first: {first})" if failed else ""
                if left:
                    reason += ("; " if reason else "") + f"{left} still undelivered after {timeout:g} s (broker unreachable or topic missing?)"
                raise DeliveryError(f"publishing {len(items)} messages to {topic!r}: {reason}", failed, left)

    def _raise_producer_fatal(self) -> None:
        if self._producer_fatal:
            err = self._producer_fatal.pop(0)
            raise DeliveryError(f"producer error: {err}")

    def _purge(self) -> None:
        """Drops whatever is still queued, so a failed publish is not sent
        later behind the caller's back. Nothing to drop (a message refused
        by ``produce`` itself, e.g. over ``message.max.bytes``): no purge, so
        it cannot reach into the next publish."""
        if len(self._producer) == 0:
            return
        try:
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
            self._producer.poll(0)
        except KafkaException as e:  # pragma: no cover - purge itself failing
            log.warning("hintstream: purging the producer queue failed: %s", e)

    # --------------------------------------------------------------- close

    @property
    def stats(self) -> Dict[str, int]:
        """Messages received per topic since start; also ``unreadable``,
        ``duplicate_hints`` (same ``hint_id``), ``hints_returned_again`` (a
        group asked for again, answered from the hints already returned),
        ``repeated`` (a partition's
        offset seen again: dropped) and ``evicted`` (unread entries dropped
        at the buffer bounds)."""
        with self._lock:
            out = dict(self._received)
            out["evicted"] = self._hints.evicted + self._advantages.evicted + self._metrics.evicted + self._chunks.evicted
            return out

    def _check_open(self) -> None:
        if self._closed:
            raise HintstreamError("the TrainerClient is closed")

    def close(self, timeout: float = 10.0) -> None:
        """Stops the consumer and flushes the producer (bounded by
        ``timeout``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as e:  # pragma: no cover
            log.debug("hintstream: closing the consumer: %s", e)
        if self._producer.flush(timeout):
            self._purge()
        with self._lock:
            self._lock.notify_all()

    def __enter__(self) -> "TrainerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            if not self._closed:
                self._stop.set()
        except AttributeError:
            pass
