"""The reference algorithm (hint-augmented GRPO advantages) in pure Python and
in numpy, timed on the same rows the Rust compute path is timed on.

    python scripts/bench_python.py generate ROWS.jsonl N
    python scripts/bench_python.py time ROWS.jsonl OUT_PREFIX

`time` prints python_ms and numpy_ms (median of 3) and writes each version's
advantages, one per line, to OUT_PREFIX.python.txt / OUT_PREFIX.numpy.txt.
"""
import json
import math
import random
import statistics
import sys
import time

EPS = 1e-6
GROUP = 8


def generate(path, n):
    rng = random.Random(42)
    order = list(range(n))
    rng.shuffle(order)
    with open(path, "w") as f:
        for i in order:
            hinted = rng.random() < 0.1
            reward = 1.0 if rng.random() < 0.3 else rng.random() * 0.5
            row = {"type": "scored_rollout", "schema_version": 1, "run_id": "run-1", "step": 12,
                   "instance_id": "swe-task-%08d" % (i // GROUP), "trajectory_id": "traj-%d" % i,
                   "reward": reward, "is_hinted": hinted}
            if hinted:
                row["hint_category"] = "llm_synthesized"
            f.write(json.dumps(row) + "\n")


def load(path):
    ids, rewards, hinted = [], [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            ids.append(r["instance_id"])
            rewards.append(float(r["reward"]))
            hinted.append(bool(r["is_hinted"]))
    return ids, rewards, hinted


def python_loop(ids, rewards, hinted):
    """The reference's loop: per-group lists, mean and unbiased std."""
    first_turn = any(hinted)
    scores = {}
    for i, idx in enumerate(ids):
        if not first_turn or not hinted[i]:
            scores.setdefault(idx, []).append(rewards[i])
    mean, std = {}, {}
    for idx, xs in scores.items():
        if len(xs) == 1:
            mean[idx], std[idx] = 0.0, 1.0
        else:
            m = sum(xs) / len(xs)
            mean[idx] = m
            std[idx] = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    out = []
    for i, idx in enumerate(ids):
        m, s = mean.get(idx, 0.0), std.get(idx, 1.0)
        out.append((rewards[i] - m) / (s + EPS))
    return out


def numpy_version(np, ids, rewards, hinted):
    _, groups = np.unique(ids, return_inverse=True)
    r = np.asarray(rewards, dtype=np.float64)
    h = np.asarray(hinted, dtype=bool)
    base = ~h if h.any() else np.ones_like(h)
    n = groups.max() + 1
    count = np.bincount(groups[base], minlength=n)
    total = np.bincount(groups[base], weights=r[base], minlength=n)
    mean = np.where(count >= 2, total / np.maximum(count, 1), 0.0)
    dev = r[base] - mean[groups[base]]
    sq = np.bincount(groups[base], weights=dev * dev, minlength=n)
    std = np.where(count >= 2, np.sqrt(sq / np.maximum(count - 1, 1)), 1.0)
    return (r - mean[groups]) / (std[groups] + EPS)


def median_ms(fn, runs=3):
    times, result = [], None
    for _ in range(runs):
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), result


def main():
    if sys.argv[1] == "generate":
        generate(sys.argv[2], int(sys.argv[3]))
        return
    import numpy as np
    ids, rewards, hinted = load(sys.argv[2])
    prefix = sys.argv[3]
    py_ms, py = median_ms(lambda: python_loop(ids, rewards, hinted))
    np_ms, nv = median_ms(lambda: numpy_version(np, ids, rewards, hinted))
    with open(prefix + ".python.txt", "w") as f:
        f.writelines("%.17e\n" % a for a in py)
    with open(prefix + ".numpy.txt", "w") as f:
        f.writelines("%.17e\n" % a for a in nv)
    print("python_ms %.3f" % py_ms)
    print("numpy_ms %.3f" % np_ms)


if __name__ == "__main__":
    main()
