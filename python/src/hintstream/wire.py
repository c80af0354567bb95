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


def check_failed(message: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` when a FailedTrajectory misses what its key and
    stage 1 need (the stage would dead-letter it)."""
    for name in ("run_id", "instance_id", "trajectory_id"):
        value = message.get(name)
        if not isinstance(value, str) or not value.strip():
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
    if not str(run_id).strip():
        raise ValueError("run_id must be a non-empty string")
    if int(step) < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    out = []
    for i, row in enumerate(rows):
        try:
            message: Dict[str, Any] = {
                "type": "scored_rollout",
                "schema_version": SCHEMA_VERSION,
                "run_id": run_id,
                "step": int(step),
                "instance_id": str(row["instance_id"]),
                "trajectory_id": str(row["trajectory_id"]),
                "reward": float(row["reward"]),
                "is_hinted": bool(row["is_hinted"]),
            }
        except KeyError as e:
            raise ValueError(f"scored row {i} has no {e.args[0]!r}") from None
        # Stage 2's checks of a row, here, so that a bad row fails the call
        # whichever way the step goes (Arrow, where one bad row dead-letters
        # its whole message, or JSON).
        for name in ("instance_id", "trajectory_id"):
            if not message[name].strip():
                raise ValueError(f"scored row {i} has a blank {name}")
        if not math.isfinite(message["reward"]):
            raise ValueError(f"scored row {i} has reward {row['reward']!r}; it must be finite")
        if row.get("hint_category") is not None:
            message["hint_category"] = str(row["hint_category"])
        if row.get("hint_id") is not None:
            hint_id = str(row["hint_id"])
            if not hint_id.strip():
                raise ValueError(f"scored row {i} has a blank hint_id")
            message["hint_id"] = hint_id
        if row.get("response_length") is not None:
            message["response_length"] = _response_length(i, row["response_length"])
        for name in LOGPROB_FIELDS:
            if row.get(name) is not None:
                message[name] = _logprob(i, name, row[name])
                if "response_length" not in message:
                    raise ValueError(f"scored row {i} has {name} but no response_length (the log-probs are per token)")
        out.append(message)
    return out


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
    columns: Dict[str, pa.Array] = {
        "run_id": pa.array([m["run_id"] for m in messages], pa.string()),
        "step": pa.array([m["step"] for m in messages], pa.int64()),
        "instance_id": pa.array([m["instance_id"] for m in messages], pa.string()).dictionary_encode(),
        "trajectory_id": pa.array([m["trajectory_id"] for m in messages], pa.string()),
        "reward": pa.array([m["reward"] for m in messages], pa.float64()),
        "is_hinted": pa.array([m["is_hinted"] for m in messages], pa.bool_()),
        "hint_category": pa.array([m.get("hint_category") for m in messages], pa.string()),
    }
    if any(m.get("hint_id") is not None for m in messages):
        columns["hint_id"] = pa.array([m.get("hint_id") for m in messages], pa.string())
    if any(m.get("response_length") is not None for m in messages):
        columns["response_length"] = pa.array([m.get("response_length") or 1 for m in messages], pa.uint32())
    for name in ("logprob_hinted", "logprob_unhinted"):
        if any(m.get(name) is not None for m in messages):
            columns[name] = pa.array([m.get(name) for m in messages], pa.float64())
    return pa.table(columns)


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
    ``max_bytes`` each, rows in order: one stream when the step fits, else
    as many as it needs, each with its own ``instance_id`` dictionary (a
    slice of the whole table would carry the whole dictionary). Raises
    ``ValueError`` when one row alone is over ``max_bytes``."""
    if not messages:
        return []
    # The table is built once (from Python objects: the costly part); each
    # chunk is a slice of it whose ids are dictionary-encoded anew.
    table = scored_table(messages)
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
    rows = max(1, int(len(messages) * max_bytes * 0.8 / len(whole)))
    chunks: List[bytes] = []
    start = 0
    while start < len(messages):
        rows = min(rows, len(messages) - start)
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
