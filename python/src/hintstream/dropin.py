"""A drop-in for the reference trainer's hint synthesis (SkyRL-Fleet,
``skyrl_gym/envs/fleet_task/hint_synthesizer.py``): the same function, the
same arguments and defaults, the same return value and batch log line, but
the hints come from stage 1 over Kafka, and the call never outlasts its
``timeout``.

In the reference's generator, the one change is the import::

    # from skyrl_gym.envs.fleet_task.hint_synthesizer import synthesize_hints_batch
    from hintstream.skyrl import synthesize_hints_batch

    hint_results = await synthesize_hints_batch(hint_requests=hint_requests, model=hint_model,
                                                timeout=hint_timeout,
                                                static_fallback_fn=FleetTaskEnv.build_hint_text)

Where the Kafka client, the run id and the step come from (first that is
set wins):

- client: the ``client=`` argument; :func:`configure`'s ``client``; else a
  :class:`TrainerClient` made at the first call from :func:`configure`'s
  ``bootstrap_servers``, ``config`` and ``topics``, or the environment's
  ``HINTSTREAM_BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``).
- run id: ``run_id=``; :func:`configure`'s; ``HINTSTREAM_RUN_ID``; else one
  generated for the process (logged once).
- step: ``step=``; the request's ``step`` key; else a per-process counter
  that starts at the process's start time in epoch milliseconds and goes up
  by one a batch, so that a restarted trainer with a fixed run id never
  repeats a ``hint_id`` (nor gets an old cached hint).

Build each hinted prompt with :func:`apply_hint`; report what the delivered
hints did with :func:`report_hint_outcomes` (the drop-in's client by
default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import wire
from .client import TrainerClient
from .static_hint import static_hint_for
from .wire import CATEGORY_LLM, CATEGORY_LLM_FAILED, CATEGORY_STATIC, Topics

log = logging.getLogger("hintstream")

#: The reference's ``static_fallback_fn(verifier_stdout, verifier_error,
#: tool_error_messages) -> str`` (``FleetTaskEnv.build_hint_text``).
StaticFallbackFn = Callable[[Optional[str], Optional[str], Optional[List[str]]], str]

#: How much longer than ``timeout`` the call may take in the worst case (the
#: thread hand-offs around the blocking Kafka calls).
DEADLINE_MARGIN = 0.5

HINT_TEMPLATE = "{task}\n\nHere is feedback from a previous attempt to help you:\n{hint}"

#: The reference's default ``model``.
DEFAULT_MODEL = "openrouter/anthropic/claude-sonnet-4"

#: Where the Kafka client is made when nothing says otherwise.
DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"


def _process_start_ms() -> int:
    """The process's start in epoch milliseconds (from /proc where there is
    one, else now: this module's import): the first step of the per-process
    counter."""
    now_ms = int(time.time() * 1000)
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        started = now_ms - int((uptime - ticks / os.sysconf("SC_CLK_TCK")) * 1000)
        return started if 0 < started <= now_ms else now_ms
    except (OSError, ValueError, IndexError):
        return now_ms


class _DropInState:
    """What :func:`configure` set, and what the drop-in made of it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bootstrap_servers: Optional[str] = None
        self.run_id: Optional[str] = None
        self.client: Optional[TrainerClient] = None
        self.config: Optional[Mapping[str, Any]] = None
        self.topics: Union[Topics, Mapping[str, str], None] = None
        self.made: Optional["concurrent.futures.Future[TrainerClient]"] = None
        self.generated_run_id: Optional[str] = None
        self.next_step = _process_start_ms()


_state = _DropInState()


def configure(
    *,
    bootstrap_servers: Optional[str] = None,
    run_id: Optional[str] = None,
    client: Optional[TrainerClient] = None,
    config: Optional[Mapping[str, Any]] = None,
    topics: Union[Topics, Mapping[str, str], None] = None,
) -> None:
    """Sets where :func:`synthesize_hints_batch` sends its requests when its
    caller (the reference's generator) says nothing: a ``client`` made by
    the caller, or the ``bootstrap_servers``, librdkafka ``config`` and
    ``topics`` of the one the drop-in makes at its next call; and the
    ``run_id``. Each call replaces the whole configuration; a client the
    drop-in made before is closed."""
    with _state.lock:
        made, _state.made = _state.made, None
        _state.bootstrap_servers = bootstrap_servers
        _state.run_id = run_id
        _state.client = client
        _state.config = config
        _state.topics = topics
    if made is not None:
        made.add_done_callback(lambda f: f.exception() is None and f.result().close(timeout=5))


def _run_id(explicit: Optional[str]) -> str:
    with _state.lock:
        found = explicit or _state.run_id or os.environ.get("HINTSTREAM_RUN_ID")
        if found:
            return found
        if _state.generated_run_id is None:
            _state.generated_run_id = f"run-{uuid.uuid4().hex[:12]}"
            log.info("hintstream: no run id configured (hintstream.configure(run_id=...) or HINTSTREAM_RUN_ID); this process uses run_id=%s", _state.generated_run_id)
        return _state.generated_run_id


def _batch_step() -> int:
    with _state.lock:
        step = _state.next_step
        _state.next_step += 1
        return step


def _client_future(explicit: Optional[TrainerClient]) -> "concurrent.futures.Future[TrainerClient]":
    """The client to use, as a future: made once in a thread at the first
    call (a failed attempt is retried at the next call)."""
    given = explicit or _state.client
    if given is not None:
        ready: "concurrent.futures.Future[TrainerClient]" = concurrent.futures.Future()
        ready.set_result(given)
        return ready
    with _state.lock:
        made = _state.made
        if made is None or (made.done() and made.exception() is not None):
            bootstrap = _state.bootstrap_servers or os.environ.get("HINTSTREAM_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP_SERVERS
            config, topics = _state.config, _state.topics
            made = concurrent.futures.Future()
            _state.made = made

            def make(made: "concurrent.futures.Future[TrainerClient]" = made) -> None:
                try:
                    made.set_result(TrainerClient(bootstrap, config, topics))
                except BaseException as e:  # handed to the caller
                    made.set_exception(e)

            threading.Thread(target=make, name="hintstream-dropin-client", daemon=True).start()
        return made


def apply_hint(task_prompt: str, hint: Optional[str]) -> str:
    """The task prompt with the hint appended, exactly as the reference's
    environment does it (``FleetTaskEnv``); an empty hint leaves the prompt
    as it is. Train the hinted rollout on the *unhinted* prompt (RLTF-SD)."""
    if not hint:
        return task_prompt
    return HINT_TEMPLATE.format(task=task_prompt, hint=hint)


def _wire_instance_ids(requests: Sequence[Mapping[str, Any]]) -> List[str]:
    """One distinct group id per request. Requests are normally one per
    failed group, so the request's own ``instance_id`` is used; a request
    whose ``instance_id`` repeats an earlier one's (or has none) becomes its
    own group ``<instance_id>#<request index>``, so every request gets a hint
    built from its own trajectory."""
    taken = {str(r.get("instance_id")) for r in requests if r.get("instance_id") not in (None, "")}
    used: Set[str] = set()
    out = []
    for i, request in enumerate(requests):
        iid = request.get("instance_id")
        iid = str(iid) if iid not in (None, "") and not wire.blank(str(iid)) else ""
        if not iid or iid in used:
            candidate = f"{iid or 'request'}#{i}"
            while candidate in taken or candidate in used:
                candidate += "_"
            iid = candidate
        used.add(iid)
        out.append(iid)
    return out


def build_trajectories(
    hint_requests: Sequence[Mapping[str, Any]],
    run_id: str,
    step: Union[int, Sequence[int]],
    hint_model: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """The ``FailedTrajectory`` messages of a batch of hint requests (the
    reference's keys: ``task_prompt``, ``chat_history``, ``verifier_stdout``,
    ``verifier_error``, ``tool_error_messages``, ``instance_id``): reward 0,
    group_size 1, a fresh ``trajectory_id`` each, one group per request;
    ``step`` is the batch's, or one per request."""
    steps = [int(step)] * len(hint_requests) if isinstance(step, int) else [int(s) for s in step]
    out = []
    for request, iid, s in zip(hint_requests, _wire_instance_ids(hint_requests), steps):
        out.append(
            wire.failed_trajectory(
                run_id=run_id,
                step=s,
                instance_id=iid,
                task_prompt=request["task_prompt"],
                chat_history_messages=request.get("chat_history") or [],
                verifier_stdout=request.get("verifier_stdout"),
                verifier_error=request.get("verifier_error"),
                tool_error_messages=request.get("tool_error_messages"),
                reward=0.0,
                group_size=1,
                trajectory_id=wire.new_trajectory_id("hint-request"),
                hint_model=hint_model,
            )
        )
    return out


def _fallback(request: Mapping[str, Any], trajectory: Mapping[str, Any], static_fallback_fn: Optional[StaticFallbackFn]) -> str:
    if static_fallback_fn is not None:
        try:
            return static_fallback_fn(
                request.get("verifier_stdout"),
                request.get("verifier_error"),
                request.get("tool_error_messages"),
            )
        except Exception:  # the trainer must get a hint all the same
            log.exception("hintstream: static_fallback_fn raised; using the pipeline's static hint")
    return static_hint_for(trajectory)


async def synthesize_hints_batch(
    hint_requests: List[Dict[str, Any]],
    model: str = DEFAULT_MODEL,
    timeout: float = 30.0,
    max_concurrency: int = 20,
    static_fallback_fn: Optional[StaticFallbackFn] = None,
    *,
    client: Optional[TrainerClient] = None,
    run_id: Optional[str] = None,
    step: Optional[int] = None,
) -> List[Tuple[str, str]]:
    """Hints for a batch of failed groups: ``[(hint_text, category), ...]``,
    one per request, in request order, as the reference returns them. The
    reference's signature and defaults; the keyword-only arguments are ours
    and optional (see the module's doc for where they come from otherwise).

    Each request is published as a ``FailedTrajectory`` (its own group, a
    fresh ``trajectory_id``, ``hint_model`` = ``model``) to stage 1, which
    answers on the hints topic with the group's key. Whatever has no hint
    when ``timeout`` seconds have passed (stage 1 slow or down, broker
    unreachable, publish failed) gets a local fallback with category
    ``llm_failed_static_fallback``: ``static_fallback_fn(verifier_stdout,
    verifier_error, tool_error_messages)`` when given (the reference's
    signature), else the static hint stage 1 itself would have built. The
    call returns within ``timeout`` plus a fraction of a second whatever
    happens; it never raises for a pipeline failure (it logs it). It logs
    the reference's line ``Hint synthesis batch: N total, N LLM-synthesized,
    N fallback, X.Xs elapsed``.

    :param model: the model the trainer asks for, sent as the trajectories'
        ``hint_model``; stage 1 decides whether to use it (its ``[llm]``
        configuration; each hint's ``model`` says which answered).
    :param max_concurrency: accepted for the reference's signature: stage
        1's ``llm.concurrency`` bounds the concurrent LLM calls, stage-side.
    :param client: a :class:`TrainerClient` (it reads hints published after
        its creation).
    :param run_id: the training run, as used in keys and metrics.
    :param step: the training step of every request.
    """
    del max_concurrency  # documented above: stage-side
    if not hint_requests:
        return []
    started = time.monotonic()
    deadline = started + max(0.0, timeout)
    run = _run_id(run_id)
    steps = _steps(hint_requests, step)
    trajectories = build_trajectories(hint_requests, run, steps, hint_model=model)
    hints: Dict[Tuple[int, str], Dict[str, Any]] = {}

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    try:
        made = _client_future(client)
        the_client = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(made)), timeout=left() + DEADLINE_MARGIN / 4)
        await asyncio.wait_for(asyncio.to_thread(the_client.publish_failed, trajectories, left()), timeout=left() + DEADLINE_MARGIN / 4)
        for s in sorted(set(steps)):
            wanted = [t["instance_id"] for t in trajectories if t["step"] == s]
            got = await asyncio.wait_for(asyncio.to_thread(the_client.wait_hints, run, s, wanted, left()), timeout=left() + DEADLINE_MARGIN / 4)
            hints.update({(s, iid): h for iid, h in got.items()})
    except asyncio.TimeoutError:
        log.warning("hintstream: no hints within %.1f s; using fallbacks", timeout)
    except Exception as e:
        log.warning("hintstream: hint synthesis through the pipeline failed (%s: %s); using fallbacks", type(e).__name__, e)

    results: List[Tuple[str, str]] = []
    for request, trajectory in zip(hint_requests, trajectories):
        hint = hints.get((trajectory["step"], trajectory["instance_id"]))
        text = hint.get("hint") if hint is not None else None
        if isinstance(text, str) and text and hint is not None:
            results.append((text, str(hint.get("category", CATEGORY_LLM))))
        else:
            results.append((_fallback(request, trajectory, static_fallback_fn), CATEGORY_LLM_FAILED))
    n_local = sum(1 for t in trajectories if (t["step"], t["instance_id"]) not in hints)
    if n_local:
        log.debug("hintstream: %d of %d hints are local fallbacks (no answer from stage 1 in time)", n_local, len(results))
    log.info(batch_log_line(results, time.monotonic() - started))
    return results


def batch_log_line(results: Sequence[Tuple[str, str]], elapsed: float) -> str:
    """The reference's batch log line, exactly."""
    n_llm = sum(1 for _, c in results if c == CATEGORY_LLM)
    n_fallback = sum(1 for _, c in results if c in (CATEGORY_STATIC, CATEGORY_LLM_FAILED))
    return f"Hint synthesis batch: {len(results)} total, {n_llm} LLM-synthesized, {n_fallback} fallback, {elapsed:.1f}s elapsed"


def _steps(hint_requests: Sequence[Mapping[str, Any]], step: Optional[int]) -> List[int]:
    """Each request's step: ``step`` when given, else the request's ``step``
    key, else this batch's turn of the per-process counter."""
    if step is not None:
        return [int(step)] * len(hint_requests)
    counter: Optional[int] = None
    out = []
    for request in hint_requests:
        own = request.get("step")
        if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
            out.append(own)
            continue
        if counter is None:
            counter = _batch_step()
        out.append(counter)
    return out


def report_hint_outcomes(
    rows: Iterable[Mapping[str, Any]],
    *,
    success_threshold: float = 0.0,
    client: Optional[TrainerClient] = None,
    timeout: float = 30.0,
) -> int:
    """Publishes one ``HintOutcome`` per ``hint_id`` of ``rows`` (each
    ``{hint_id, reward}``, a hinted rollout's reward; a success is a reward
    over ``success_threshold``; a row whose ``is_hinted`` is false ran
    without the hint and is left out, as stage 2 leaves it out) to the
    outcomes topic and waits for delivery
    (:class:`~hintstream.DeliveryError` on failure). Run, step and group come
    from the delivered hint: an unknown ``hint_id`` raises ``ValueError``
    naming it, before anything is sent. ``client``: the client that
    delivered the hints; by default the drop-in's (:func:`hintstream.configure`).
    Returns how many outcomes were published."""
    if client is None:
        client = _client_future(None).result(timeout=timeout)
    return client.report_hint_outcomes(rows, success_threshold=success_threshold, timeout=timeout)
