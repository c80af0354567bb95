"""The reference trainer's numbers, in float64, for checking stage 2."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Sequence, Tuple

EPSILON = 1e-6


def grpo_advantages(rows: Sequence[Mapping[str, Any]], epsilon: float = EPSILON) -> List[float]:
    """compute_grpo_outcome_advantage with the fork's first-turn baseline:
    when any row is hinted, each group's mean and (unbiased) std come from
    its raw rows only; a group with 0 or 1 baseline rows uses 0 and 1."""
    first_turn = any(r["is_hinted"] for r in rows)
    baseline: Dict[str, List[float]] = defaultdict(list)
    for r in rows:
        if not (first_turn and r["is_hinted"]):
            baseline[r["instance_id"]].append(float(r["reward"]))
    stats: Dict[str, Tuple[float, float]] = {}
    for group, values in baseline.items():
        if len(values) <= 1:
            stats[group] = (0.0, 1.0)
        else:
            mean = math.fsum(values) / len(values)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
            stats[group] = (mean, std)
    out = []
    for r in rows:
        mean, std = stats.get(r["instance_id"], (0.0, 1.0))
        out.append((float(r["reward"]) - mean) / (std + epsilon))
    return out


def signal_rescued(rows: Sequence[Mapping[str, Any]]) -> float:
    """hint/signal_rescued as the reference defines it: the fraction of
    hinted prompts (groups with a hinted row) where a hinted row scored > 0."""
    hinted: Dict[str, bool] = {}
    for r in rows:
        if r["is_hinted"]:
            hinted[r["instance_id"]] = hinted.get(r["instance_id"], False) or float(r["reward"]) > 0
    return sum(hinted.values()) / len(hinted)
