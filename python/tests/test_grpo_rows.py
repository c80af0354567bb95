"""The rows of a GRPO step (hintstream.grpo_rows, used by hintstream.trl),
the arithmetic task and the run report: pure Python, no broker."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from hintstream import arith_task, rl_report, wire
from hintstream.grpo_rows import (
    Rollout,
    advantages_for,
    best_of_failed_groups,
    failed_trajectory,
    group_ids,
    hinted_prompt,
    resolve_hints,
)
from hintstream.static_hint import static_hint


def rollout(iid: str, k: int, reward: float, **kw: object) -> Rollout:
    return Rollout(iid, f"{iid}/raw-{k}", [{"role": "user", "content": f"task {iid}"}], [{"role": "assistant", "content": f"try {k}"}], reward, 3, **kw)  # type: ignore[arg-type]


def test_group_ids_are_task_ids_made_distinct_within_a_step() -> None:
    assert group_ids(["a", "b", "a", "a"]) == ["a", "b", "a#1", "a#2"]


def test_only_groups_whose_best_reward_is_at_most_the_threshold_failed() -> None:
    rows = [rollout("a", 0, 0.0), rollout("a", 1, 0.0), rollout("b", 0, 0.0), rollout("b", 1, 1.0), rollout("c", 0, 0.2), rollout("c", 1, 0.1)]
    rows.append(rollout("a", 9, 1.0, is_hinted=True))  # a hinted success does not un-fail its group
    failed = best_of_failed_groups(rows, 0.0)
    assert list(failed) == ["a"] and failed["a"].trajectory_id == "a/raw-0"  # first on ties
    assert best_of_failed_groups(rows, 0.5)["c"].trajectory_id == "c/raw-0"  # the best one


def test_a_failed_groups_trajectory_carries_the_conversation_and_the_verifiers_feedback() -> None:
    best = rollout("a", 1, 0.0)
    t = failed_trajectory("run", 7, best, lambda p, c: f"wrong: {c[-1]['content']}")
    wire.check_failed(t)
    assert (t["instance_id"], t["trajectory_id"], t["step"], t["task_prompt"]) == ("a", "a/raw-1", 7, "task a")
    assert [m["role"] for m in t["chat_history"]] == ["user", "assistant"]
    assert t["verifier_error"] == "wrong: try 1" and t["group_size"] == 1


def test_a_group_without_a_hint_at_the_deadline_gets_the_static_fallback() -> None:
    a = failed_trajectory("run", 0, rollout("a", 0, 0.0), lambda p, c: "The answer 3 is wrong (too low).")
    b = failed_trajectory("run", 0, rollout("b", 0, 0.0), None)
    got = resolve_hints([a, b], {"a": {"hint": "Add first.", "category": "llm_synthesized", "hint_id": "h1"}})
    assert (got["a"].text, got["a"].category, got["a"].hint_id) == ("Add first.", "llm_synthesized", "h1")
    assert (got["b"].category, got["b"].hint_id) == ("llm_failed_static_fallback", None)
    assert got["b"].text == static_hint(None, None, None)


def test_the_hint_goes_into_the_last_user_message_as_the_reference_writes_it() -> None:
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}]
    out = hinted_prompt(prompt, "Count.")
    assert out[1]["content"] == "2+2?\n\nHere is feedback from a previous attempt to help you:\nCount."
    assert prompt[1]["content"] == "2+2?"  # a copy
    assert hinted_prompt("2+2?", "Count.").endswith("\nCount.")


def test_scored_rows_carry_the_log_probs_and_the_wire_keeps_them() -> None:
    r = rollout("a", 0, 1.0, is_hinted=True, hint_id="h1", hint_category="llm_synthesized", logprob_hinted=-4.5, logprob_unhinted=-9.0)
    row = r.scored_row()
    assert row["response_length"] == 3 and row["logprob_hinted"] == -4.5 and row["logprob_unhinted"] == -9.0
    (message,) = wire.scored_rows("run", 0, [row])
    assert (message["logprob_hinted"], message["logprob_unhinted"], message["hint_id"]) == (-4.5, -9.0, "h1")
    assert "logprob_hinted" not in rollout("a", 1, 0.0).scored_row()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.5, True, "x"])
def test_the_wire_refuses_a_log_prob_that_cannot_be_one(bad: object) -> None:
    with pytest.raises(ValueError, match="logprob_hinted"):
        wire.scored_rows("run", 0, [{"instance_id": "a", "trajectory_id": "t", "reward": 0.0, "is_hinted": True, "response_length": 2, "logprob_hinted": bad}])


def test_a_log_prob_needs_the_response_length() -> None:
    with pytest.raises(ValueError, match="response_length"):
        wire.scored_rows("run", 0, [{"instance_id": "a", "trajectory_id": "t", "reward": 0.0, "is_hinted": True, "logprob_unhinted": -1.0}])


def test_advantages_come_back_in_row_order_with_the_weight_when_sent() -> None:
    table = pa.table({"trajectory_id": ["t2", "t1"], "advantage": [0.5, -0.5]})
    assert advantages_for(table, ["t1", "t2"]) == ([-0.5, 0.5], None)
    weighted = table.append_column("weight", pa.array([0.25, 1.0]))
    assert advantages_for(weighted, ["t1", "t2"]) == ([-0.5, 0.5], [1.0, 0.25])
    with pytest.raises(ValueError, match="lack 1"):
        advantages_for(table, ["t1", "t3"])


def test_arithmetic_problems_are_seeded_and_their_answers_right() -> None:
    assert arith_task.problems(5, seed=3) == arith_task.problems(5, seed=3)
    assert arith_task.problems(5, seed=3) != arith_task.problems(5, seed=4)
    rng = random.Random(0)
    for level in (1, 2, 3):
        for _ in range(200):
            question, answer = arith_task.problem(rng, level)
            assert answer >= 0 and "?" in question


def test_the_verifier_scores_the_answer_line_and_says_what_was_wrong() -> None:
    (row,) = arith_task.problems(1, seed=1)
    answer = row["answer"]
    assert arith_task.reward_func([[{"role": "assistant", "content": f"so\nAnswer: {answer}"}]], [answer]) == [1.0]
    assert arith_task.reward(f"{answer}", answer) == 0.0  # the format is required
    verify = arith_task.Verifier([row])
    assert "no line 'Answer: <number>'" in verify(row["prompt"], f"It is {answer}.")
    assert "too high" in verify(row["prompt"], f"Answer: {answer + 5}")
    assert "too low" in verify(row["prompt"], f"Answer: {answer - 1}")
    assert str(answer) not in verify(row["prompt"], f"Answer: {answer + 5}").replace(str(answer + 5), "")


def test_a_report_entry_leaves_out_what_stage_2_did_not_define() -> None:
    record = {"step": 2, "groups": 4, "groups_failed": 1, "hints": [{"category": "static_fallback"}],
              "hints_by_category": {"static_fallback": 1}, "advantages": [1.0, -1.0, 0.0, 2.0]}
    e = rl_report.entry(2, record, {"reward/pass_at_1": 0.25, "hint/signal_rescued": 0.0}, 0.5, 12.0)
    assert (e["pass@1"], e["signal_rescued"], e["mean_abs_advantage"], e["groups_hinted"]) == (0.25, 0.0, 1.0, 1)
    assert "pass@3" not in e and "transfer" not in e and "hinted_success_rate_by_category" not in e
    html = rl_report.page([("static", [e])])
    assert "<svg" in html and "pass@1" in html
    json.dumps(e)
