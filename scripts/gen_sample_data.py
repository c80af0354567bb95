"""Writes the quick start's sample training step (examples/data/): failed
trajectories of agent tasks (tool calls, tool errors, verifier accumulators)
and the scored rollouts of the step, hinted retries included. Deterministic:
running it again gives the same files.

    python3 scripts/gen_sample_data.py
"""
import json
import random

rng = random.Random(7)
RUN, STEP = "sample-run", 12

TASKS = [
    ("swe", "Fix `parse_iso_week` in utils/dates.py so that ISO week dates like 2024-W05-2 parse.",
     [("bash", {"cmd": "pytest -x tests/test_dates.py"}, "E   ValueError: unconverted data remains: W05-2"),
      ("edit", {"path": "utils/date.py", "old": "%Y-%m-%d", "new": "%G-W%V-%u"}, "error: utils/date.py: no such file"),
      ("bash", {"cmd": "pytest tests/test_dates.py"}, "2 failed, 1 passed")],
     ["test_iso_week", "test_roundtrip: expected '2024-W05-2'"], ["test_plain_date"]),
    ("swe", "Make `Cache.get` return None instead of raising KeyError for expired entries.",
     [("bash", {"cmd": "grep -n 'def get' cache.py"}, "41:    def get(self, key):"),
      ("edit", {"path": "cache.py", "old": "raise KeyError(key)", "new": "return None"}, "ok"),
      ("bash", {"cmd": "python -m pytest -q"}, "FAILED tests/test_cache.py::test_expired_returns_none - KeyError: 'a'")],
     ["test_expired_returns_none: KeyError raised from _evict", "test_ttl_zero"], ["test_get_fresh", "test_set"]),
    ("booking", "Book the cheapest refundable hotel room in Lisbon for 2 adults, 14-16 March.",
     [("browser.goto", {"url": "https://hotels.example/search?city=Lisbon"}, "loaded 24 results"),
      ("browser.click", {"selector": "#filter-refundable"}, "error: element #filter-refundable not found"),
      ("browser.click", {"selector": "text=Book now"}, "booked: Hotel Miradouro, non-refundable, 2 nights")],
     ["booking must be refundable", "price 212.00 is not the cheapest refundable (184.50)"], ["dates 14-16 March", "2 adults"]),
    ("sql", "Return the top 5 customers by total order value in 2023 (customer_id, total).",
     [("sql.query", {"q": "SELECT customer_id, SUM(amount) FROM orders GROUP BY customer_id LIMIT 5"}, "5 rows"),
      ("sql.query", {"q": "SELECT * FROM order WHERE year = 2023"}, "ERROR: relation \"order\" does not exist")],
     ["result not filtered to 2023", "rows not ordered by total desc"], ["columns customer_id, total"]),
    ("github", "Open an issue in acme/widgets titled 'Crash on empty config' with the stack trace from logs/crash.txt.",
     [("bash", {"cmd": "cat logs/crash.txt"}, "Traceback (most recent call last): ... KeyError: 'plugins'"),
      ("github.create_issue", {"repo": "acme/widget", "title": "Crash on empty config"}, "error: 404 Not Found: repository acme/widget"),
      ("github.create_issue", {"repo": "acme/widgets", "title": "crash on empty config"}, "created issue #88")],
     ["title must be exactly 'Crash on empty config'", "body must include the stack trace"], ["repository acme/widgets"]),
    ("swe", "Add a `--dry-run` flag to scripts/deploy.sh that prints the commands without running them.",
     [("bash", {"cmd": "bash scripts/deploy.sh --dry-run"}, "error: unknown option --dry-run"),
      ("edit", {"path": "scripts/deploy.sh", "old": "case $1 in", "new": "case $1 in\n  --dry-run) DRY=1;;"}, "ok")],
     ["dry run still executed 'kubectl apply'", "test_help_mentions_dry_run"], []),
    ("email", "Reply to Dana's latest email accepting the Thursday 3pm meeting and CC her assistant.",
     [("mail.search", {"from": "dana"}, "3 results"),
      ("mail.reply", {"id": "m-102", "body": "Thursday 3pm works."}, "sent")],
     ["reply sent to the oldest thread, not the latest (m-117)", "assistant not in CC"], ["accepts Thursday 3pm"]),
    ("data", "Compute the 7-day rolling mean of daily signups from data/signups.csv and save it to out/rolling.csv.",
     [("python", {"code": "df = pd.read_csv('data/signups.csv'); df.rolling(7).mean().to_csv('out/rolling.csv')"}, "error: No such file or directory: 'out/rolling.csv'"),
      ("bash", {"cmd": "mkdir -p out && python make_rolling.py"}, "TypeError: unsupported operand type(s) for +: 'int' and 'str'")],
     ["out/rolling.csv missing", "date column not parsed as dates"], []),
    ("swe", "Fix the off-by-one in `paginate(items, page, per_page)` so page 1 returns the first items.",
     [("bash", {"cmd": "pytest tests/test_paginate.py -q"}, "1 failed, 3 passed"),
      ("edit", {"path": "paginate.py", "old": "start = page * per_page", "new": "start = page * per_page + 1"}, "ok"),
      ("bash", {"cmd": "pytest tests/test_paginate.py -q"}, "3 failed, 1 passed")],
     ["test_first_page: expected [1, 2, 3], got [5, 6, 7]", "test_last_page_partial", "test_page_zero_rejected"], ["test_empty"]),
    ("booking", "Cancel the 19:30 restaurant reservation at Casa Nova for Friday and rebook it for 20:30 the same day.",
     [("browser.goto", {"url": "https://tables.example/reservations"}, "2 reservations"),
      ("browser.click", {"selector": "text=Cancel"}, "cancelled reservation at Tasca Velha 18:00"),
      ("browser.click", {"selector": "text=Book 20:30"}, "error: timeout waiting for selector text=Book 20:30")],
     ["wrong reservation cancelled (Tasca Velha)", "no booking at 20:30"], []),
]


def history(task, calls, turns_out):
    h = [{"role": "system", "content": "You are an agent with tools. Finish with a short summary."},
         {"role": "user", "content": task}]
    for i, (tool, args, result) in enumerate(calls):
        h.append({"role": "assistant", "content": [
            {"type": "text", "text": "Next I will use %s." % tool},
            {"type": "tool_use", "id": "call_%d" % i, "name": tool, "input": args}]})
        h.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_%d" % i, "content": result}]})
    if turns_out:
        h.append({"role": "assistant", "content": "I ran out of turns before verifying the result."})
    else:
        h.append({"role": "assistant", "content": "Done. The task is complete."})
    return h


def stdout(errors, successes):
    return ("running verifier\n>>> ERROR_ACCUMULATOR >>>\n%r\n<<< ERROR_ACCUMULATOR <<<\n"
            ">>> SUCCESS_ACCUMULATOR >>>\n%r\n<<< SUCCESS_ACCUMULATOR <<<\n" % (errors, successes))


failed, scored = [], []
groups = 20
for g in range(groups):
    env, task, calls, errors, successes = TASKS[g % len(TASKS)]
    instance = "%s-task-%03d" % (env, g)
    size = 3 if g % 2 == 0 else 2
    for k in range(size):
        errs = errors[: max(1, len(errors) - (k % 2))]
        tool_errors = [r for (_, _, r) in calls if r.startswith("error") or "Error" in r]
        # Failed groups only (best reward <= hints.reward_threshold, 0): the
        # trainer publishes a group when every rollout failed; penalties below 0.
        reward = round(rng.choice([0.0, 0.0, -0.1, -0.25]), 2)
        failed.append({
            "schema_version": 1, "run_id": RUN, "step": STEP, "instance_id": instance,
            "trajectory_id": "%s-r%d" % (instance, k), "task_prompt": task,
            "chat_history": history(task, calls, turns_out=(k == 1)),
            "verifier_stdout": stdout(errs, successes),
            "verifier_error": ("AssertionError: %s" % errs[0]) if k == 0 else None,
            "tool_error_messages": tool_errors or None, "reward": reward, "group_size": size,
            "env_class": env, "produced_at": "2026-11-29T10:%02d:%02dZ" % (g, k),
        })
    # The step's scored rollouts: 4 raw for the failed group (all 0) and 2
    # hinted retries; plus healthy groups with mixed rewards.
    for k in range(4):
        scored.append({"type": "scored_rollout", "schema_version": 1, "run_id": RUN, "step": STEP,
                       "instance_id": instance, "trajectory_id": "%s-raw%d" % (instance, k),
                       "reward": 0.0, "is_hinted": False})
    for k in range(2):
        cat = "static_fallback" if g % 3 == 0 else "llm_synthesized"
        scored.append({"type": "scored_rollout", "schema_version": 1, "run_id": RUN, "step": STEP,
                       "instance_id": instance, "trajectory_id": "%s-hint%d" % (instance, k),
                       "reward": 1.0 if rng.random() < 0.45 else 0.0, "is_hinted": True, "hint_category": cat})
for g in range(30):
    instance = "mixed-task-%03d" % g
    for k in range(4):
        scored.append({"type": "scored_rollout", "schema_version": 1, "run_id": RUN, "step": STEP,
                       "instance_id": instance, "trajectory_id": "%s-raw%d" % (instance, k),
                       "reward": rng.choice([0.0, 1.0, 1.0, 0.5]), "is_hinted": False})
rng.shuffle(scored)
scored.append({"type": "step_end", "schema_version": 1, "run_id": RUN, "step": STEP, "count": len(scored)})

with open("examples/data/failed_trajectories.jsonl", "w") as f:
    f.writelines(json.dumps(t) + "\n" for t in failed)
with open("examples/data/scored_rollouts.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in scored)
print("%d failed trajectories in %d groups, %d scored rows" % (len(failed), groups, len(scored) - 1))
