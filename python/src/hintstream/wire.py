"""The rest of the wire contract: topic names, message builders, header
names, Arrow encoding of scored rollouts and the chunk headers of advantages.
Field names are exactly the JSON Schemas' (schemas/ at the repository root)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import uuid
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.compute as pc

from .pyliteral import rust_trim

#: The only ``schema_version`` written and read.
SCHEMA_VERSION = 1

#: Hint categories (the reference trainer's strings).
CATEGORY_LLM = "llm_synthesized"
CATEGORY_STATIC = "static_fallback"
CATEGORY_LLM_FAILED = "llm_failed_static_fallback"
CATEGORIES = (CATEGORY_LLM, CATEGORY_STATIC, CATEGORY_LLM_FAILED)

#: ``content-type`` of an Arrow IPC stream message.
ARROW_STREAM_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
CONTENT_TYPE_HEADER = "content-type"

#: Headers of a chunked step on the advantages topic: the chunk's 0-based
#: index, the number of chunks and the step's total row count, each as
#: decimal text. A message without them is a whole step (chunk 0 of 1).
CHUNK_HEADER = "hintstream.chunk"
CHUNKS_HEADER = "hintstream.chunks"
ROWS_HEADER = "hintstream.rows"
#: Header naming the publication (attempt) of a step a chunk belongs to:
#: opaque, compared for equality only.
ATTEMPT_HEADER = "hintstream.attempt"

#: Kafka message headers as confluent-kafka gives or takes them.
Headers = Union[Sequence[Tuple[str, Union[str, bytes, None]]], Mapping[str, Union[str, bytes, None]], None]

_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Topics:
    """Topic names; the defaults are the design's."""

    failed: str = "rl.trajectories.failed"
    hints: str = "rl.hints"
    scored: str = "rl.rollouts.scored"
    advantages: str = "rl.advantages"
    metrics: str = "rl.metrics"
    #: ``HintOutcome`` messages: what each hint did for its group's retries.
    outcomes: str = "rl.hints.outcomes"

    @classmethod
    def of(cls, topics: Union["Topics", Mapping[str, str], None]) -> "Topics":
        """``topics`` as a :class:`Topics`: a mapping overrides the defaults
        it names (unknown names are an error)."""
        if topics is None:
            return cls()
        if isinstance(topics, Topics):
            return topics
        known = {f.name for f in fields(cls)}
        unknown = set(topics) - known
        if unknown:
            raise ValueError(f"unknown topic names {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(topics))


def now_rfc3339() -> str:
    """The current time as RFC 3339 (UTC)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


def new_trajectory_id(prefix: str = "traj") -> str:
    """A fresh, unique trajectory id."""
    return f"{prefix}-{uuid.uuid4().hex}"


def _content(content: Any) -> Union[str, List[Dict[str, Any]]]:
    """A chat message's content in the contract's shape: a string, or a list
    of blocks that each have a non-empty string ``type``. Other values are
    rendered as Python's ``str`` renders them (as the reference does)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        blocks: List[Dict[str, Any]] = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("type"), str) and block["type"]:
                blocks.append(block)
            else:
                blocks.append({"type": "text", "text": str(block)[:200]})
        return blocks
    return str(content)


def chat_history(messages: Optional[Iterable[Any]]) -> List[Dict[str, Any]]:
    """A trainer's chat history in the contract's shape (``role`` and
    ``content`` only; ``None`` content becomes ``"None"`` as the reference's
    ``str()`` writes it)."""
    out: List[Dict[str, Any]] = []
    for message in messages or []:
        if isinstance(message, Mapping):
            out.append({"role": str(message.get("role", "unknown")), "content": _content(message.get("content", ""))})
        else:
            out.append({"role": "unknown", "content": str(message)})
    return out


def failed_trajectory(
    *,
    run_id: str,
    step: int,
    instance_id: str,
    task_prompt: str,
    chat_history_messages: Optional[Iterable[Any]] = None,
    verifier_stdout: Optional[str] = None,
    verifier_error: Optional[str] = None,
    tool_error_messages: Optional[Sequence[Any]] = None,
    reward: float = 0.0,
    trajectory_id: Optional[str] = None,
    group_size: int = 1,
    env_class: Optional[str] = None,
    hint_model: Optional[str] = None,
) -> Dict[str, Any]:
    """A ``FailedTrajectory`` message (schema_version 1), with a fresh
    ``trajectory_id`` unless one is given. ``hint_model`` (optional) is the
    model the trainer asked for, e.g. the reference's ``model`` argument."""
    message: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "step": int(step),
        "instance_id": instance_id,
        "trajectory_id": trajectory_id or new_trajectory_id(),
        "task_prompt": task_prompt if isinstance(task_prompt, str) else str(task_prompt),
        "chat_history": chat_history(chat_history_messages),
        "verifier_stdout": None if verifier_stdout is None else str(verifier_stdout),
        "verifier_error": None if verifier_error is None else str(verifier_error),
        "tool_error_messages": None if tool_error_messages is None else [str(e) for e in tool_error_messages],
        "reward": float(reward),
        "group_size": int(group_size),
        "produced_at": now_rfc3339(),
    }
    if env_class is not None:
        message["env_class"] = env_class
    if hint_model is not None:
        message["hint_model"] = str(hint_model)
    return message


def blank(text: str) -> bool:
    """Whether ``text`` is empty once Rust's ``str::trim`` removed the
    whitespace at its ends (:func:`~hintstream.pyliteral.rust_trim`): the
    blank id both stages refuse (``schemas/vectors/blank.json``).
    ``str.strip`` also removes U+001C to U+001F, which Rust does not count
    as whitespace."""
    return not rust_trim(text)


def check_failed(message: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` when a FailedTrajectory misses what its key and
    stage 1 need (the stage would dead-letter it)."""
    for name in ("run_id", "instance_id", "trajectory_id"):
        value = message.get(name)
        if not isinstance(value, str) or blank(value):
            raise ValueError(f"FailedTrajectory.{name} must be a non-empty string, got {value!r}")
    step = message.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"FailedTrajectory.step must be an integer >= 0, got {step!r}")
    if not isinstance(message.get("task_prompt"), str):
        raise ValueError("FailedTrajectory.task_prompt must be a string")
    if not isinstance(message.get("chat_history"), list):
        raise ValueError("FailedTrajectory.chat_history must be a list")


def scored_rows(run_id: str, step: int, rows: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``scored_rollout`` messages of one step: each row needs
    ``instance_id``, ``trajectory_id``, ``reward`` and ``is_hinted``
    (``hint_category``, ``hint_id``, the hint a hinted row ran with, and
    ``response_length``, the response's length in tokens, the reference
    trainer's ``response_mask`` sum, an integer >= 1 that the
    ``reinforce_pp`` estimator reads, optional; ``logprob_hinted`` and
    ``logprob_unhinted``, the sums of the response's token log-probs under
    the hinted and the unhinted prompt, finite and at most 0 (1e-6 of
    rounding allowed), optional, and a row with either needs
    ``response_length``)."""
    _check_step(run_id, step)
    step = int(step)
    out = []
    for i, row in enumerate(rows):
        values = _checked_row(i, row)
        message: Dict[str, Any] = {
            "type": "scored_rollout",
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "step": step,
            "instance_id": values[0],
            "trajectory_id": values[1],
            "reward": values[2],
            "is_hinted": values[3],
        }
        # The optional fields a row has (_OPTIONAL_FIELDS, spelt out: a
        # loop over them took a fifth of the call's time).
        if values[4] is not None:
            message["hint_category"] = values[4]
        if values[5] is not None:
            message["hint_id"] = values[5]
        if values[6] is not None:
            message["response_length"] = values[6]
        if values[7] is not None:
            message["logprob_hinted"] = values[7]
        if values[8] is not None:
            message["logprob_unhinted"] = values[8]
        out.append(message)
    return out


def scored_step_table(run_id: str, step: int, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """The Arrow table of one step's rows, as :func:`scored_table` makes it
    from :func:`scored_rows`' messages, with the same checks and errors, but
    without a message made a row: each row's checked values go to Arrow
    in one conversion (a 10,000-row step checked and encoded in about 12
    ms against 18; docs/BENCHMARKS.md, round thirty-eight)."""
    _check_step(run_id, step)
    checked = [_checked_row(i, row) for i, row in enumerate(rows)]
    return _table(checked, [run_id] * len(checked), [int(step)] * len(checked))


def _check_step(run_id: str, step: int) -> None:
    if blank(str(run_id)):
        raise ValueError("run_id must be a non-empty string")
    if int(step) < 0:
        raise ValueError(f"step must be >= 0, got {step}")


#: A scored row's optional fields, in :func:`_checked_row`'s order after
#: the four it needs.
_OPTIONAL_FIELDS = ("hint_category", "hint_id", "response_length", "logprob_hinted", "logprob_unhinted")

#: A scored row's fields after ``run_id`` and ``step``, in
#: :func:`_checked_row`'s order.
_ROW_FIELDS = ("instance_id", "trajectory_id", "reward", "is_hinted", *_OPTIONAL_FIELDS)


def _checked_row(i: int, row: Mapping[str, Any]) -> Tuple[Any, ...]:
    """Row ``i``'s values in :data:`_ROW_FIELDS`' order (None for an
    optional one it lacks), converted, after stage 2's checks of a row, so
    that a bad row fails the call whichever way the step goes (Arrow, where
    one bad row dead-letters its whole message, or JSON)."""
    try:
        instance_id = str(row["instance_id"])
        trajectory_id = str(row["trajectory_id"])
        reward = float(row["reward"])
        is_hinted = bool(row["is_hinted"])
    except KeyError as e:
        raise ValueError(f"scored row {i} has no {e.args[0]!r}") from None
    # strip() first: a filled id (nearly all) costs no call.
    if not instance_id.strip() and blank(instance_id):
        raise ValueError(f"scored row {i} has a blank instance_id")
    if not trajectory_id.strip() and blank(trajectory_id):
        raise ValueError(f"scored row {i} has a blank trajectory_id")
    if not math.isfinite(reward):
        raise ValueError(f"scored row {i} has reward {row['reward']!r}; it must be finite")
    get = row.get
    category = get("hint_category")
    if category is not None:
        category = str(category)
    hint_id = get("hint_id")
    if hint_id is not None:
        hint_id = str(hint_id)
        if not hint_id.strip() and blank(hint_id):
            raise ValueError(f"scored row {i} has a blank hint_id")
    length = get("response_length")
    if length is not None:
        length = _response_length(i, length)
    hinted = get("logprob_hinted")
    if hinted is not None:
        hinted = _checked_logprob(i, "logprob_hinted", hinted, length)
    unhinted = get("logprob_unhinted")
    if unhinted is not None:
        unhinted = _checked_logprob(i, "logprob_unhinted", unhinted, length)
    return (instance_id, trajectory_id, reward, is_hinted, category, hint_id, length, hinted, unhinted)


def _checked_logprob(i: int, name: str, value: Any, length: Optional[int]) -> float:
    """Row ``i``'s log-prob ``name``, which needs a ``response_length``."""
    checked = _logprob(i, name, value)
    if length is None:
        raise ValueError(f"scored row {i} has {name} but no response_length (the log-probs are per token)")
    return checked


def _response_length(i: int, value: Any) -> int:
    """A row's ``response_length`` as an int from 1 to 2**32 - 1 (a bool, a
    fraction or a number out of range is an error)."""
    if isinstance(value, bool):
        raise ValueError(f"scored row {i} has a response_length that is a bool")
    try:
        length = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"scored row {i} has a response_length that is not an integer: {value!r}") from None
    if length != value or not 1 <= length <= 0xFFFFFFFF:
        raise ValueError(f"scored row {i} has response_length {value!r}; it must be an integer from 1 to 4294967295")
    return length


#: A hinted row's log-probs (the sum over the response's tokens): under the
#: hinted prompt, and the same response under the unhinted prompt with the
#: same weights.
LOGPROB_FIELDS = ("logprob_hinted", "logprob_unhinted")

#: How far above 0 a log-prob may be (rounding in the trainer's sums).
LOGPROB_ROUNDING = 1e-6


def _logprob(i: int, name: str, value: Any) -> float:
    """A row's log-prob as a finite float at most :data:`LOGPROB_ROUNDING`."""
    if isinstance(value, bool):
        raise ValueError(f"scored row {i} has a {name} that is a bool")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"scored row {i} has a {name} that is not a number: {value!r}") from None
    if not math.isfinite(v) or v > LOGPROB_ROUNDING:
        raise ValueError(f"scored row {i} has {name} {value!r}; it must be finite and at most 0 (a sum of log-probabilities)")
    return v


def ratio(logprob_hinted: float, logprob_unhinted: float, length: int) -> float:
    """ω of a hinted row: min(1, exp((logprob_unhinted - logprob_hinted) /
    length)), as stage 2 computes it (``normalize::offpolicy``)."""
    x = (logprob_unhinted - logprob_hinted) / max(1, int(length))
    return 1.0 if x >= 0.0 else math.exp(x)


def reliance(logprob_hinted: float, logprob_unhinted: float, length: int) -> float:
    """ρ of a hinted row: (logprob_hinted - logprob_unhinted) / length, the
    nats a token the hint adds."""
    return (logprob_hinted - logprob_unhinted) / max(1, int(length))


def step_end(run_id: str, step: int, count: int) -> Dict[str, Any]:
    """The ``step_end`` message that closes a step of ``count`` rows."""
    return {"type": "step_end", "schema_version": SCHEMA_VERSION, "run_id": run_id, "step": int(step), "count": int(count)}


def scored_table(messages: Sequence[Mapping[str, Any]]) -> pa.Table:
    """``scored_rollout`` messages as the Arrow table stage 2 reads
    (``instance_id`` dictionary-encoded, ``reward`` float64; a ``hint_id``
    column only when a row has one, a ``response_length`` uint32 column,
    1 where a row has none, only when a row has one)."""
    # Each message's values as a tuple first: a message without a field the
    # table needs raises KeyError, and any Mapping will do.
    values = [(m["instance_id"], m["trajectory_id"], m["reward"], m["is_hinted"], *(m.get(name) for name in _OPTIONAL_FIELDS)) for m in messages]
    return _table(values, [m["run_id"] for m in messages], [m["step"] for m in messages])


#: A row's values (:data:`_ROW_FIELDS`) as Arrow takes them.
_ROW_TYPE = pa.struct(
    list(zip(_ROW_FIELDS, (pa.string(), pa.string(), pa.float64(), pa.bool_(), pa.string(), pa.string(), pa.uint32(), pa.float64(), pa.float64())))
)


def _table(values: Sequence[Tuple[Any, ...]], run_ids: List[str], steps: List[int]) -> pa.Table:
    """:func:`scored_table`'s table of a step's rows, each its values in
    :data:`_ROW_FIELDS`' order (converted to columns in one call: for
    10,000 rows about half the time of a list a column)."""
    columns = dict(zip(_ROW_FIELDS, pa.array(values, _ROW_TYPE).flatten()))
    out: Dict[str, pa.Array] = {
        "run_id": pa.array(run_ids, pa.string()),
        "step": pa.array(steps, pa.int64()),
        "instance_id": columns["instance_id"].dictionary_encode(),
        **{name: columns[name] for name in ("trajectory_id", "reward", "is_hinted", "hint_category")},
    }
    count = len(values)
    for name in ("hint_id", "response_length", *LOGPROB_FIELDS):
        if columns[name].null_count < count:
            out[name] = columns[name]
    if "response_length" in out:
        # 1 where a row has none (or 0, which scored_rows never gives).
        out["response_length"] = pc.max_element_wise(out["response_length"], pa.scalar(1, pa.uint32()))
    return pa.table(out)


def hint_outcome(
    *,
    hint_id: str,
    run_id: str,
    step: int,
    instance_id: str,
    rewards: Sequence[float],
    success_threshold: float = 0.0,
    logprobs: Optional[Sequence[Optional[Tuple[float, float, int]]]] = None,
) -> Dict[str, Any]:
    """The ``HintOutcome`` message (schema_version 1) of one hint from the
    rewards of the rollouts that ran with it: a success is a reward over
    ``success_threshold``; ``rescued`` when any succeeded. Published under
    the hint's group key (:func:`hintstream.keys.group_key`). ``ValueError``
    without rewards or with a non-finite one."""
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError(f"hint {hint_id!r} has no hinted rollouts")
    if any(v != v or v in (float("inf"), float("-inf")) for v in values):
        raise ValueError(f"hint {hint_id!r} has a non-finite reward")
    successes = sum(1 for v in values if v > success_threshold)
    return {
        "schema_version": SCHEMA_VERSION,
        "hint_id": str(hint_id),
        "run_id": run_id,
        "step": int(step),
        "instance_id": instance_id,
        "hinted_rollouts": len(values),
        "successes": successes,
        "rescued": successes > 0,
        "mean_reward": finite_mean(values),
        **transfer_and_reliance(values, logprobs or [], success_threshold),
        "created_at": now_rfc3339(),
    }


def transfer_and_reliance(
    rewards: Sequence[float], logprobs: Sequence[Optional[Tuple[float, float, int]]], success_threshold: float = 0.0
) -> Dict[str, float]:
    """``transfer`` and ``reliance`` of one hint as stage 2 computes them
    (``advantages/outcomes.rs``): ``logprobs[i]`` is row i's
    ``(logprob_hinted, logprob_unhinted, response_length)``, or None when it
    lacks either log-prob. ``transfer``: the mean of success · ω over the
    rows with both; ``reliance``: the mean ρ over those that succeeded. Each
    is left out (never 0) when it has no row."""
    carried = [(r > success_threshold, lp) for r, lp in zip(rewards, logprobs) if lp is not None]
    out: Dict[str, float] = {}
    if carried:
        out["transfer"] = finite_mean([ratio(*lp) if ok else 0.0 for ok, lp in carried])
    succeeded = [reliance(*lp) for ok, lp in carried if ok]
    if succeeded:
        out["reliance"] = finite_mean(succeeded)
    return out


#: Values up to this (2**400) are never scaled by :func:`finite_mean`.
_SCALE_ABOVE = 2.0**400


def finite_mean(values: Sequence[float]) -> float:
    """The mean of finite ``values`` as stage 2 takes it
    (``normalize::finite::mean``), always finite: summed in order, one
    addition at a time, over their count (from Python 3.12 on, ``sum`` of
    floats compensates, and ten rewards of 0.1 would give 0.1 here and
    0.09999999999999999 there); where that sum overflows, the same on the
    values each divided by 2**floor(log2 of the largest |value|), an exact
    division, multiplied back."""
    total = 0.0
    for v in values:
        total += v
    if math.isfinite(total):
        return total / len(values)
    largest = max(abs(v) for v in values)
    scale = 1.0 if largest <= _SCALE_ABOVE else 2.0 ** (math.frexp(largest)[1] - 1)
    scaled = 0.0
    for v in values:
        scaled += v / scale
    return scaled / len(values) * scale


def ipc_stream(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


#: The largest Arrow message :meth:`TrainerClient.publish_scored` sends by
#: default: under librdkafka's and Kafka's 1,000,000-byte defaults, as stage
#: 2's ``advantages.max_message_bytes``.
DEFAULT_MAX_MESSAGE_BYTES = 900_000


def scored_chunks(messages: Sequence[Mapping[str, Any]], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> List[bytes]:
    """``scored_rollout`` messages as Arrow IPC streams of at most
    ``max_bytes`` each: :func:`table_chunks` of their :func:`scored_table`."""
    return table_chunks(scored_table(messages), max_bytes) if messages else []


def table_chunks(table: pa.Table, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> List[bytes]:
    """A step's table (:func:`scored_table`, :func:`scored_step_table`) as
    Arrow IPC streams of at most ``max_bytes`` each, rows in order: one
    stream when the step fits, else as many as it needs, each with its own
    ``instance_id`` dictionary (a slice of the whole table would carry the
    whole dictionary). Raises ``ValueError`` when one row alone is over
    ``max_bytes``."""
    count = table.num_rows
    if not count:
        return []
    whole = ipc_stream(table)
    if len(whole) <= max_bytes:
        return [whole]
    index = table.schema.get_field_index("instance_id")
    ids = table.column(index).cast(pa.string())

    def encode(start: int, rows: int) -> bytes:
        part = ids.slice(start, rows).combine_chunks().dictionary_encode()
        return ipc_stream(table.slice(start, rows).set_column(index, "instance_id", part))

    # Rows a chunk, from the whole stream's bytes a row, with room for the
    # chunk's own dictionary and framing; halved while a chunk is too big.
    rows = max(1, int(count * max_bytes * 0.8 / len(whole)))
    chunks: List[bytes] = []
    start = 0
    while start < count:
        rows = min(rows, count - start)
        payload = encode(start, rows)
        while len(payload) > max_bytes and rows > 1:
            rows = max(1, rows // 2)
            payload = encode(start, rows)
        if len(payload) > max_bytes:
            raise ValueError(f"row {start} of the step alone encodes to {len(payload)} bytes, over max_message_bytes = {max_bytes}")
        chunks.append(payload)
        start += rows
    return chunks


def chunk_headers(index: int, count: int, rows: int) -> List[Tuple[str, bytes]]:
    """The chunk headers of chunk ``index`` of ``count`` of a step of
    ``rows`` rows, as stage 2 reads them on its input and writes them on its
    output."""
    return [(CHUNK_HEADER, str(index).encode()), (CHUNKS_HEADER, str(count).encode()), (ROWS_HEADER, str(rows).encode())]


def read_ipc_stream(payload: bytes) -> pa.Table:
    """An Arrow IPC stream message as a table."""
    return pa.ipc.open_stream(payload).read_all()


def json_bytes(message: Any) -> bytes:
    """A message as compact UTF-8 JSON (NaN and infinities refused)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def header(headers: Headers, name: str) -> Optional[bytes]:
    """The first value of header ``name`` (case-sensitive), if any."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    for key, value in pairs:
        if key == name:
            if value is None:
                return b""
            return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return None


@dataclass(frozen=True)
class ChunkInfo:
    """Where one advantages message sits in its step."""

    index: int
    count: int
    #: The step's total row count, when the message says it.
    rows: Optional[int]


def chunk_info(headers: Headers) -> ChunkInfo:
    """The chunk headers of an advantages message; without them, chunk 0 of
    1. ``ValueError`` when they are present but not consistent decimals. The
    rules of ``ChunkInfo::from_headers`` (``src/batch/chunk.rs``), the
    ``rows`` header read first."""
    rows_value = header(headers, ROWS_HEADER)
    rows = None if rows_value is None else _decimal(ROWS_HEADER, rows_value)
    index, count = header(headers, CHUNK_HEADER), header(headers, CHUNKS_HEADER)
    if index is None and count is None:
        return ChunkInfo(0, 1, rows)
    if index is None or count is None:
        raise ValueError(f"{CHUNK_HEADER} and {CHUNKS_HEADER} must come together")
    info = ChunkInfo(_decimal(CHUNK_HEADER, index), _decimal(CHUNKS_HEADER, count), rows)
    if info.count < 1 or not 0 <= info.index < info.count:
        raise ValueError(f"chunk {info.index} of {info.count} is out of range")
    return info


#: The largest value a chunk header holds (Rust's ``usize``).
_MAX_HEADER_VALUE = 2**64 - 1


def _decimal(name: str, value: bytes) -> int:
    """ASCII digits in UTF-8, with whitespace around as Rust's ``str::trim``
    takes it (Unicode White_Space), at most 2**64 - 1."""
    try:
        text = rust_trim(value.decode("utf-8"))
    except UnicodeDecodeError:
        text = ""
    # (At most 20 significant digits before ``int``: a longer text is out of
    # range anyway, and ``int`` refuses texts of over 4,300 digits.)
    if not _DIGITS.fullmatch(text) or len(text.lstrip("0")) > 20 or int(text) > _MAX_HEADER_VALUE:
        raise ValueError(f"header {name} is not a decimal number: {value!r}")
    return int(text)
