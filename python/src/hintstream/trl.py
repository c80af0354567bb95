"""``hintstream.trl``: TRL's ``GRPOTrainer`` (TRL 1.16.0) with hintstream's
hints and advantages.

:class:`HintstreamGRPOTrainer` is a subclass that overrides
``_generate_and_score_completions``, the method that, in TRL, generates a
step's completions, scores them and computes their advantages inline. TRL
offers no other place where advantages can be replaced: ``rollout_func``
(experimental) only returns completions and extra reward inputs, and TRL
still normalises the rewards itself afterwards. The override calls TRL's
own method first (so generation, reward functions, logging and metrics stay
TRL's), then, in each training step:

1. finds the all-failed groups (best reward <= ``hint_reward_threshold``,
   the reference's rule) and publishes each one's best failed completion as
   a ``FailedTrajectory``, with the verifier feedback of ``feedback_fn``;
2. waits for the hints, at most ``hint_timeout`` seconds, and gives every
   group still without one the static fallback (``llm_failed_static_fallback``),
   as the SkyRL drop-in does at its deadline; logs the reference's batch line;
3. generates ``n_hint_samples`` completions per hinted group from the
   hinted prompt (``apply_hint``) and scores them with the same reward
   functions;
4. computes each hinted completion's ``logprob_hinted`` (its token
   log-probs summed under the hinted prompt) and ``logprob_unhinted`` (the
   same tokens under the unhinted prompt), with the current weights and no
   gradient;
5. publishes every row, raw and hinted, on the scored topic and takes the
   step's advantages (times ``weight`` where stage 2 sends one) from stage 2
   in place of TRL's; the hinted completions join the batch on the
   *unhinted* prompt (RLTF-SD, as the reference trains them).

Stage 2 turns the hinted rows' ``hint_id`` into outcomes for stage 1 by
itself. Supported: one process, transformers generation (no vLLM), text
prompts without tools, ``steps_per_generation == 1``. Needs torch and TRL
(``scripts/rl-venv.sh``)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.trainer.utils import pad

from .client import HintstreamError, TrainerClient
from .dropin import batch_log_line
from .grpo_rows import (
    FeedbackFn,
    GroupHint,
    Rollout,
    advantages_for,
    best_of_failed_groups,
    failed_trajectory,
    group_ids,
    hinted_prompt,
    resolve_hints,
    task_text,
)

log = logging.getLogger("hintstream")

#: The TRL version this adapter was written against (its private methods).
TRL_VERSION = "1.16.0"


@dataclass
class HintstreamSettings:
    """What :class:`HintstreamGRPOTrainer` does with each step.

    :param run_id: the run's id in keys and metrics.
    :param enable_hints: publish failed groups and train on hinted
        completions; off, the trainer still takes stage 2's advantages.
    :param hint_reward_threshold: a group whose best reward is at most this
        failed (the reference's ``hint_reward_threshold``).
    :param n_hint_samples: hinted completions per failed group.
    :param hint_timeout: seconds to publish the failed groups and wait for
        their hints; groups without one then get the static fallback.
    :param advantages_timeout: seconds to wait for the step's advantages.
    :param use_weight: multiply each advantage by stage 2's ``weight``
        when the table has that column.
    :param task_id_column: the data set's column naming a task (the group
        id on the wire); without it, a hash of the task's text.
    """

    run_id: str
    enable_hints: bool = True
    hint_reward_threshold: float = 0.0
    n_hint_samples: int = 2
    hint_timeout: float = 30.0
    advantages_timeout: float = 120.0
    use_weight: bool = True
    task_id_column: str = "task_id"


class HintstreamGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages come from hintstream (see the
    module's doc). Takes GRPOTrainer's arguments, plus ``client`` (a
    :class:`TrainerClient`, made before the first step), ``hintstream``
    (:class:`HintstreamSettings`) and ``feedback_fn(prompt, completion) ->
    str`` (optional: the verifier's feedback on a failed completion).

    After each training step, :attr:`hintstream_last_step` holds what the
    step did: the rows published, the advantages used, the hints, timings.
    """

    def __init__(
        self,
        *args: Any,
        client: TrainerClient,
        hintstream: HintstreamSettings,
        feedback_fn: Optional[FeedbackFn] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.hintstream_client = client
        self.hintstream = hintstream
        self.feedback_fn = feedback_fn
        self.hintstream_last_step: Dict[str, Any] = {}
        self._scored: Optional[Tuple[Any, ...]] = None
        self._check_supported()

    def _check_supported(self) -> None:
        problems = []
        if self.use_vllm:
            problems.append("use_vllm (hinted completions are generated with transformers)")
        if self.tools or self.environment_factories is not None:
            problems.append("tools and environments")
        if self.args.steps_per_generation != 1:
            problems.append(f"steps_per_generation = {self.args.steps_per_generation} (TRL would drop hinted rows when it splits the batch; use 1)")
        if self.accelerator.num_processes != 1:
            problems.append("several processes")
        if self.beta != 0.0 and self.ref_model is None:
            problems.append("beta != 0 with a PEFT model")
        if problems:
            raise ValueError("HintstreamGRPOTrainer does not support " + "; ".join(problems))

    # ------------------------------------------------------------ TRL hooks

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        """TRL's, keeping what it scored for the step (prompts,
        completions, their token ids and rewards)."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored = (inputs, prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: List[Dict[str, Any]]) -> Dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out  # evaluation keeps TRL's own advantages
        started = time.monotonic()
        step = int(self.state.global_step)
        raw, raw_prompt_ids = self._raw_rollouts(out)
        record: Dict[str, Any] = {"step": step, "groups": len(raw) // self.num_generations, "num_generations": self.num_generations}
        hinted, hinted_prompt_ids = self._hinted_rollouts(step, raw, raw_prompt_ids, record) if self.hintstream.enable_hints else ([], [])
        rows = raw + hinted
        advantages = self._stage2_advantages(step, rows, record)
        record["seconds_hintstream"] = time.monotonic() - started
        self.hintstream_last_step = record
        completion_ids = [r.completion_ids or [] for r in rows]
        return self._training_batch(out, raw_prompt_ids + hinted_prompt_ids, completion_ids, advantages)

    # ------------------------------------------------------------ the step

    def _raw_rollouts(self, out: Dict[str, Any]) -> Tuple[List[Rollout], List[List[int]]]:
        inputs, prompts, completions, completion_ids, rewards_per_func = self._scored  # type: ignore[misc]
        rewards = self._weighted(rewards_per_func)
        g = self.num_generations
        column = self.hintstream.task_id_column
        tasks = [str(inputs[i][column]) if column in inputs[i] else _text_id(task_text(prompts[i])) for i in range(0, len(prompts), g)]
        ids = group_ids(tasks)
        prompt_ids = [p[m.bool()].tolist() for p, m in zip(out["prompt_ids"], out["prompt_mask"])]
        raw = [
            Rollout(
                instance_id=ids[i // g],
                trajectory_id=f"{ids[i // g]}/raw-{i % g}",
                prompt=prompts[i],
                completion=completions[i],
                reward=rewards[i],
                response_length=max(1, len(completion_ids[i])),
                completion_ids=list(completion_ids[i]),
                source=inputs[i],
            )
            for i in range(len(prompts))
        ]
        return raw, prompt_ids

    def _weighted(self, rewards_per_func: torch.Tensor) -> List[float]:
        """The reward of each row as TRL sums it (reward weights, NaN as 0)."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        return [float(x) for x in (rewards_per_func * weights).nansum(dim=1).tolist()]

    def _hints(self, step: int, raw: Sequence[Rollout], record: Dict[str, Any]) -> Dict[str, GroupHint]:
        """The hint of each all-failed group, within ``hint_timeout``."""
        failed = best_of_failed_groups(raw, self.hintstream.hint_reward_threshold)
        record["groups_failed"] = len(failed)
        if not failed:
            return {}
        started = time.monotonic()
        deadline = started + self.hintstream.hint_timeout
        run_id = self.hintstream.run_id
        trajectories = [failed_trajectory(run_id, step, best, self.feedback_fn) for best in failed.values()]
        received: Dict[str, Dict[str, Any]] = {}
        try:
            self.hintstream_client.publish_failed(trajectories, timeout=max(0.1, deadline - time.monotonic()))
            received = self.hintstream_client.wait_hints(run_id, step, list(failed), timeout=max(0.0, deadline - time.monotonic()))
        except HintstreamError as e:
            log.warning("hintstream: hints for step %d through the pipeline failed (%s); using static fallbacks", step, e)
        hints = resolve_hints(trajectories, received)
        missing = len(failed) - len(received)
        if missing:
            log.warning("hintstream: %d of %d groups of step %d got no hint within %.1f s; they use the static fallback", missing, len(failed), step, self.hintstream.hint_timeout)
        log.info(batch_log_line([(h.text, h.category) for h in hints.values()], time.monotonic() - started))
        record["seconds_hints"] = time.monotonic() - started
        record["hints"] = [dict(instance_id=iid, hint=h.text, category=h.category, hint_id=h.hint_id) for iid, h in hints.items()]
        record["hints_by_category"] = dict(Counter(h.category for h in hints.values()))
        return hints

    def _hinted_rollouts(
        self, step: int, raw: List[Rollout], raw_prompt_ids: List[List[int]], record: Dict[str, Any]
    ) -> Tuple[List[Rollout], List[List[int]]]:
        """Hinted completions of the failed groups, scored, with both
        log-probs; and the unhinted prompt ids each is trained on."""
        hints = self._hints(step, raw, record)
        if not hints:
            return [], []
        started = time.monotonic()
        first = {r.instance_id: i for i, r in reversed(list(enumerate(raw)))}
        n = self.hintstream.n_hint_samples
        plan = [(iid, k) for iid in hints for k in range(n)]
        prompts = [hinted_prompt(raw[first[iid]].prompt, hints[iid].text) for iid, _ in plan]
        inputs = [raw[first[iid]].source for iid, _ in plan]
        hinted_ids, _, _ = self._tokenize_prompts(prompts)
        completion_ids, _ = self._generate_single_turn(hinted_ids, None, {}, 1)
        completion_ids = [list(c) for c in completion_ids]
        completions = self._decode(prompts, completion_ids)
        rewards = self._weighted(super()._calculate_rewards(inputs, prompts, completions, completion_ids))
        unhinted_ids = [raw_prompt_ids[first[iid]] for iid, _ in plan]
        logprob_hinted = self._sequence_logprobs(hinted_ids, completion_ids)
        logprob_unhinted = self._sequence_logprobs(unhinted_ids, completion_ids)
        rollouts = []
        for j, (iid, k) in enumerate(plan):
            r = Rollout(
                instance_id=iid,
                trajectory_id=f"{iid}/hint-{k}",
                prompt=prompts[j],
                completion=completions[j],
                reward=rewards[j],
                response_length=max(1, len(completion_ids[j])),
                is_hinted=True,
                hint_id=hints[iid].hint_id,
                hint_category=hints[iid].category,
                logprob_hinted=min(0.0, logprob_hinted[j]),
                logprob_unhinted=min(0.0, logprob_unhinted[j]),
                completion_ids=completion_ids[j],
            )
            rollouts.append(r)
        record["seconds_hinted_generation"] = time.monotonic() - started
        return rollouts, unhinted_ids

    def _decode(self, prompts: Sequence[Any], completion_ids: Sequence[List[int]]) -> List[Any]:
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        if is_conversational({"prompt": prompts[0]}):
            return [[{"role": "assistant", "content": t}] for t in texts]
        return list(texts)

    def _padded(self, prompt_ids: Sequence[List[int]], completion_ids: Sequence[List[int]]) -> Dict[str, torch.Tensor]:
        """Prompts left-padded and completions right-padded, as TRL pads."""
        device = self.accelerator.device
        multiple = self.pad_to_multiple_of
        pad_id = self._tokenizer.pad_token_id
        p = [torch.tensor(ids, dtype=torch.long) for ids in prompt_ids]
        c = [torch.tensor(ids, dtype=torch.long) for ids in completion_ids]
        return {
            "prompt_ids": pad(p, padding_value=pad_id, padding_side="left", pad_to_multiple_of=multiple).to(device),
            "prompt_mask": pad([torch.ones_like(t) for t in p], padding_value=0, padding_side="left", pad_to_multiple_of=multiple).to(device),
            "completion_ids": pad(c, padding_value=pad_id, padding_side="right", pad_to_multiple_of=multiple).to(device),
            "completion_mask": pad([torch.ones_like(t) for t in c], padding_value=0, padding_side="right", pad_to_multiple_of=multiple).to(device),
        }

    def _per_token_logps(self, model: Any, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, ids, mask, batch["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size
            )
        return logps

    def _sequence_logprobs(self, prompt_ids: Sequence[List[int]], completion_ids: Sequence[List[int]]) -> List[float]:
        """Each completion's log-prob under its prompt (the sum over its
        tokens), with the current weights."""
        batch = self._padded(prompt_ids, completion_ids)
        logps = self._per_token_logps(self.model, batch)
        return [float(x) for x in (logps * batch["completion_mask"]).sum(dim=1).tolist()]

    def _stage2_advantages(self, step: int, rows: Sequence[Rollout], record: Dict[str, Any]) -> List[float]:
        """Publishes the step's rows and returns stage 2's advantages (times
        ``weight`` where sent) in row order."""
        started = time.monotonic()
        run_id = self.hintstream.run_id
        scored = [r.scored_row() for r in rows]
        self.hintstream_client.publish_scored(run_id, step, scored)
        table = self.hintstream_client.wait_advantages(run_id, step, timeout=self.hintstream.advantages_timeout)
        advantages, weights = advantages_for(table, [r.trajectory_id for r in rows])
        if weights is not None and self.hintstream.use_weight:
            advantages = [a * w for a, w in zip(advantages, weights)]
        record["rows"] = scored
        record["advantages"] = advantages
        record["weights"] = weights
        record["seconds_advantages"] = time.monotonic() - started
        return advantages

    def _training_batch(
        self, out: Dict[str, Any], prompt_ids: Sequence[List[int]], completion_ids: Sequence[List[int]], advantages: Sequence[float]
    ) -> Dict[str, Any]:
        """TRL's batch for the loss, grown by the hinted rows (on their
        unhinted prompts), with stage 2's advantages."""
        batch: Dict[str, Any] = self._padded(prompt_ids, completion_ids)
        if self.mask_truncated_completions:
            ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            kept = torch.tensor([bool(ids) and ids[-1] in ends for ids in completion_ids], device=batch["completion_mask"].device)
            batch["completion_mask"] = batch["completion_mask"] * kept.unsqueeze(1).int()
        batch["advantages"] = torch.tensor(advantages, dtype=torch.float32, device=self.accelerator.device)
        batch["num_items_in_batch"] = batch["completion_mask"].sum()
        if out.get("old_per_token_logps") is not None:
            batch["old_per_token_logps"] = self._per_token_logps(self.model, batch)
        if out.get("ref_per_token_logps") is not None:
            batch["ref_per_token_logps"] = self._per_token_logps(self.ref_model, batch)
        return batch


def _text_id(text: str) -> str:
    """A task id from its text (stable over runs)."""
    return "task-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
