"""A drop-in for the reference trainer's hint synthesis (SkyRL-Fleet,
``skyrl_gym/envs/fleet_task/hint_synthesizer.py``): same arguments, same
return value, but the hints come from stage 1 over Kafka, and the call never
outlasts its ``timeout``.

In the reference's generator, replace::

    from skyrl_gym.envs.fleet_task.hint_synthesizer import synthesize_hints_batch
    hint_results = await synthesize_hints_batch(hint_requests=..., model=..., timeout=...,
                                                static_fallback_fn=FleetTaskEnv.build_hint_text)

with::

    import hintstream
    hint_results = await hintstream.synthesize_hints_batch(hint_requests=..., model=..., timeout=...,
                                                           static_fallback_fn=FleetTaskEnv.build_hint_text,
                                                           client=client, run_id=run_id, step=global_step)

and build each hinted prompt with :func:`apply_hint`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import wire
from .client import TrainerClient
from .static_hint import static_hint_for
from .wire import CATEGORY_LLM, CATEGORY_LLM_FAILED

log = logging.getLogger("hintstream")

#: The reference's ``static_fallback_fn(verifier_stdout, verifier_error,
#: tool_error_messages) -> str`` (``FleetTaskEnv.build_hint_text``).
StaticFallbackFn = Callable[[Optional[str], Optional[str], Optional[List[str]]], str]

#: How much longer than ``timeout`` the call may take in the worst case (the
#: thread hand-offs around the blocking Kafka calls).
DEADLINE_MARGIN = 0.5

HINT_TEMPLATE = "{task}\n\nHere is feedback from a previous attempt to help you:\n{hint}"


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
        iid = str(iid) if iid not in (None, "") and str(iid).strip() else ""
        if not iid or iid in used:
            candidate = f"{iid or 'request'}#{i}"
            while candidate in taken or candidate in used:
                candidate += "_"
            iid = candidate
        used.add(iid)
        out.append(iid)
    return out


def build_trajectories(hint_requests: Sequence[Mapping[str, Any]], run_id: str, step: int) -> List[Dict[str, Any]]:
    """The ``FailedTrajectory`` messages of a batch of hint requests (the
    reference's keys: ``task_prompt``, ``chat_history``, ``verifier_stdout``,
    ``verifier_error``, ``tool_error_messages``, ``instance_id``): reward 0,
    group_size 1, a fresh ``trajectory_id`` each, one group per request."""
    out = []
    for request, iid in zip(hint_requests, _wire_instance_ids(hint_requests)):
        out.append(
            wire.failed_trajectory(
                run_id=run_id,
                step=step,
                instance_id=iid,
                task_prompt=request["task_prompt"],
                chat_history_messages=request.get("chat_history") or [],
                verifier_stdout=request.get("verifier_stdout"),
                verifier_error=request.get("verifier_error"),
                tool_error_messages=request.get("tool_error_messages"),
                reward=0.0,
                group_size=1,
                trajectory_id=wire.new_trajectory_id("hint-request"),
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
    hint_requests: Sequence[Mapping[str, Any]],
    model: Optional[str] = None,
    timeout: float = 30.0,
    max_concurrency: int = 20,
    static_fallback_fn: Optional[StaticFallbackFn] = None,
    *,
    client: TrainerClient,
    run_id: str,
    step: int,
) -> List[Tuple[str, str]]:
    """Hints for a batch of failed groups: ``[(hint_text, category), ...]``,
    one per request, in request order, as the reference returns them.

    Each request is published as a ``FailedTrajectory`` (its own group, a
    fresh ``trajectory_id``) to stage 1, which answers on the hints topic
    with the group's key. Whatever has no hint when ``timeout``
    seconds have passed (stage 1 slow or down, broker unreachable, publish
    failed) gets a local fallback with category
    ``llm_failed_static_fallback``: ``static_fallback_fn(verifier_stdout,
    verifier_error, tool_error_messages)`` when given (the reference's
    signature), else the static hint stage 1 itself would have built. The
    call returns within ``timeout`` plus a fraction of a second whatever
    happens; it never raises for a pipeline failure (it logs it).

    :param model: accepted for signature compatibility and not sent anywhere:
        stage 1's ``[llm]`` configuration chooses the model (each hint's
        ``model`` field says which answered).
    :param max_concurrency: accepted for signature compatibility: concurrent
        LLM calls are bounded by stage 1's ``llm.concurrency``.
    :param client: a :class:`TrainerClient` created before this call (it
        reads hints published after its creation).
    :param run_id: the training run, as used in keys and metrics.
    :param step: the training step.
    """
    del model, max_concurrency  # documented above: the pipeline decides both
    if not hint_requests:
        return []
    started = time.monotonic()
    deadline = started + max(0.0, timeout)
    trajectories = build_trajectories(hint_requests, run_id, step)
    hints: Dict[str, Dict[str, Any]] = {}
    try:
        await asyncio.wait_for(
            asyncio.to_thread(client.publish_failed, trajectories, max(0.0, deadline - time.monotonic())),
            timeout=max(0.0, deadline - time.monotonic()) + DEADLINE_MARGIN / 2,
        )
        wanted = [t["instance_id"] for t in trajectories]
        hints = await asyncio.wait_for(
            asyncio.to_thread(client.wait_hints, run_id, step, wanted, max(0.0, deadline - time.monotonic())),
            timeout=max(0.0, deadline - time.monotonic()) + DEADLINE_MARGIN / 2,
        )
    except asyncio.TimeoutError:
        log.warning("hintstream: no hints within %.1f s; using fallbacks", timeout)
    except Exception as e:
        log.warning("hintstream: hint synthesis through the pipeline failed (%s: %s); using fallbacks", type(e).__name__, e)

    results: List[Tuple[str, str]] = []
    for request, trajectory in zip(hint_requests, trajectories):
        hint = hints.get(trajectory["instance_id"])
        text = hint.get("hint") if hint is not None else None
        if isinstance(text, str) and text and hint is not None:
            results.append((text, str(hint.get("category", CATEGORY_LLM))))
        else:
            results.append((_fallback(request, trajectory, static_fallback_fn), CATEGORY_LLM_FAILED))
    n_llm = sum(1 for _, c in results if c == CATEGORY_LLM)
    n_local = sum(1 for t in trajectories if t["instance_id"] not in hints)
    log.info(
        "Hint synthesis batch: %d total, %d LLM-synthesized, %d fallback (%d local), %.1fs elapsed",
        len(results),
        n_llm,
        len(results) - n_llm,
        n_local,
        time.monotonic() - started,
    )
    return results
