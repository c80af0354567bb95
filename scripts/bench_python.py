"""The reference algorithms (hint-augmented advantages) in pure Python and in
numpy, timed on the same rows the Rust paths are timed on.

    python scripts/bench_python.py generate ROWS.jsonl N
    python scripts/bench_python.py time ROWS.jsonl OUT_PREFIX [ESTIMATOR...]
    python scripts/bench_python.py report TIMES.txt OUT_PREFIX ESTIMATOR...

`time` prints `python <estimator> <ms>` and `numpy <estimator> <ms>` (median
of 3) and writes each version's advantages, one per line, to
OUT_PREFIX.python.<estimator>.txt / OUT_PREFIX.numpy.<estimator>.txt.

The pure-Python loops follow the reference trainer's structure (per-group
lists in a dict, then one pass over the rows): `grpo` is its
compute_grpo_outcome_advantage with the first-turn baseline, `drgrpo` the
same with grpo_norm_by_std=False, `rloo` its compute_rloo_outcome_advantage
with the hint rule of this project, `batch_whiten` the outcome form of its
REINFORCE++ whitening. `report` checks that the Rust, Python and numpy
advantages agree (max relative difference < 1e-9) and prints every Rust
figure with its ratio to the Python loop and to numpy.
"""
import json
import math
import random
import statistics
import sys
import time

EPS = 1e-6
GROUP = 8
ESTIMATORS = ["grpo", "drgrpo", "rloo", "batch_whiten"]


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


def mean_std(xs):
    """The reference's per-group rule: fewer than 2 → (0, 1); unbiased std."""
    if len(xs) < 2:
        return 0.0, 1.0
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def python_loop(estimator, ids, rewards, hinted):
    """The reference's loops: per-group lists of baseline scores, then rows."""
    first_turn = any(hinted)
    if estimator == "batch_whiten":
        m, s = mean_std([r for r, h in zip(rewards, hinted) if not first_turn or not h])
        return [(r - m) / (s + EPS) for r in rewards]
    scores = {}
    for i, idx in enumerate(ids):
        if not first_turn or not hinted[i]:
            scores.setdefault(idx, []).append(rewards[i])
    if estimator == "rloo":
        mean = {idx: sum(xs) / len(xs) for idx, xs in scores.items()}
        out = []
        for i, idx in enumerate(ids):
            n = len(scores.get(idx, ()))
            if n <= 1:
                out.append(0.0)
            elif first_turn and hinted[i]:
                out.append(rewards[i] - mean[idx])
            else:
                out.append((rewards[i] - mean[idx]) * n / (n - 1))
        return out
    mean, std = {}, {}
    for idx, xs in scores.items():
        mean[idx], std[idx] = mean_std(xs)
    out = []
    for i, idx in enumerate(ids):
        m, s = mean.get(idx, 0.0), std.get(idx, 1.0)
        out.append((rewards[i] - m) / (s + EPS) if estimator == "grpo" else rewards[i] - m)
    return out


def numpy_version(np, estimator, ids, rewards, hinted):
    r = np.asarray(rewards, dtype=np.float64)
    h = np.asarray(hinted, dtype=bool)
    base = ~h if h.any() else np.ones_like(h)
    if estimator == "batch_whiten":
        b = r[base]
        if b.size < 2:
            m, s = 0.0, 1.0
        else:
            m, s = b.mean(), b.std(ddof=1)
        return (r - m) / (s + EPS)
    _, groups = np.unique(ids, return_inverse=True)
    n = groups.max() + 1
    count = np.bincount(groups[base], minlength=n)
    total = np.bincount(groups[base], weights=r[base], minlength=n)
    if estimator == "rloo":
        c, t = count[groups], total[groups]
        loo = (t - r) / np.maximum(c - 1, 1)
        allm = t / np.maximum(c, 1)
        baseline = np.where(h & h.any(), allm, loo)
        return np.where(c <= 1, 0.0, r - baseline)
    mean = np.where(count >= 2, total / np.maximum(count, 1), 0.0)
    if estimator == "drgrpo":
        return r - mean[groups]
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


def time_all(rows_path, prefix, estimators):
    import numpy as np
    ids, rewards, hinted = load(rows_path)
    for est in estimators:
        py_ms, py = median_ms(lambda: python_loop(est, ids, rewards, hinted))
        np_ms, nv = median_ms(lambda: numpy_version(np, est, ids, rewards, hinted))
        with open("%s.python.%s.txt" % (prefix, est), "w") as f:
            f.writelines("%.17e\n" % a for a in py)
        with open("%s.numpy.%s.txt" % (prefix, est), "w") as f:
            f.writelines("%.17e\n" % a for a in nv)
        print("python %s %.3f" % (est, py_ms))
        print("numpy %s %.3f" % (est, np_ms))
        sys.stdout.flush()


def report(times_path, prefix, estimators):
    rust, py, npy = {}, {}, {}
    for line in open(times_path):
        parts = line.split()
        if parts[:1] == ["time"]:
            _, path, threads, est, ms = parts
            rust.setdefault(est, []).append((path, threads, float(ms)))
        elif parts[:1] == ["python"]:
            py[parts[1]] = float(parts[2])
        elif parts[:1] == ["numpy"]:
            npy[parts[1]] = float(parts[2])
    load_txt = lambda p: [float(x) for x in open(p)]
    rel = lambda a, b: max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
    ok = True
    for est in estimators:
        r = load_txt("%s.rust.%s.txt" % (prefix, est))
        p = load_txt("%s.python.%s.txt" % (prefix, est))
        n = load_txt("%s.numpy.%s.txt" % (prefix, est))
        dp, dn = rel(r, p), rel(r, n)
        agree = len(r) == len(p) == len(n) and dp < 1e-9 and dn < 1e-9
        ok &= agree
        print("%-12s max relative difference: rust vs python %.3g, rust vs numpy %.3g%s"
              % (est, dp, dn, "" if agree else "  DISAGREE"))
    print()
    # Speed-ups: how many times faster than the Python loop and than numpy.
    print("%-12s %-15s %-7s %11s %16s %10s" % ("estimator", "path", "threads", "median ms",
                                                "vs python loop", "vs numpy"))
    for est in estimators:
        print("%-12s %-15s %-7s %11.1f %15.1fx %10s" % (est, "python loop", "1", py[est], 1.0, ""))
        print("%-12s %-15s %-7s %11.1f %15.1fx %9.1fx" % (est, "numpy", "1", npy[est], py[est] / npy[est], 1.0))
        for path, threads, ms in rust.get(est, []):
            print("%-12s %-15s %-7s %11.3f %15.0fx %9.1fx" % (est, path, threads, ms, py[est] / ms, npy[est] / ms))
    if not ok:
        sys.exit("implementations disagree")


def main():
    if sys.argv[1] == "generate":
        generate(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "time":
        time_all(sys.argv[2], sys.argv[3], sys.argv[4:] or ESTIMATORS)
    elif sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3], sys.argv[4:] or ESTIMATORS)


if __name__ == "__main__":
    main()
