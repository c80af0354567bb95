"""The report of a real GRPO run (scripts/rl-demo.sh): one entry per step in
``report.json`` and the curves in ``index.html`` (inline SVG, no script, no
network). Several runs' reports drawn on the same axes:
``python -m hintstream.rl_report OUT.html DIR [DIR ...]``.

An entry's fields (a value that is undefined at a step is left out, never
written as 0): ``step``; ``pass@1`` and ``pass@3`` of the raw rollouts
(stage 2's ``reward/pass_at_1`` and ``reward/pass_at_3``); ``groups``;
``groups_failed``; ``groups_hinted``; ``hints_by_category``;
``hinted_success_rate_by_category`` (stage 2's
``hint/category_<name>_success_rate``); ``signal_rescued``
(``hint/signal_rescued``); ``transfer`` and ``reliance``
(``hint/transfer_rate``, ``hint/reliance``, once stage 2 computes them);
``loss``; ``mean_abs_advantage``; ``seconds`` (the whole training step) and
``seconds_in`` (its hintstream parts: ``hints``, the wait for stage 1;
``hinted_generation``, sampling, scoring and the log-probs of the hinted
completions; ``advantages``, publishing the rows and the wait for stage 2;
``hintstream``, all of them); ``stage2`` (every metric stage 2 published for
the step)."""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: Curves drawn, each (title, how to read it from an entry).
CURVES: Tuple[Tuple[str, str], ...] = (
    ("pass@1 of the raw rollouts", "pass@1"),
    ("pass@3 of the raw rollouts", "pass@3"),
    ("groups hinted", "groups_hinted"),
    ("signal rescued", "signal_rescued"),
    ("hinted success, llm_synthesized", "hinted_success_rate_by_category.llm_synthesized"),
    ("hinted success, static fallbacks", "hinted_success_rate_by_category.static_fallback"),
    ("transfer", "transfer"),
    ("reliance (nats a token)", "reliance"),
    ("loss", "loss"),
    ("mean |advantage|", "mean_abs_advantage"),
    ("seconds a step", "seconds"),
)

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def entry(step: int, record: Mapping[str, Any], stage2: Mapping[str, Any], loss: Optional[float], seconds: float) -> Dict[str, Any]:
    """One step's entry, from the trainer's record of the step
    (``HintstreamGRPOTrainer.hintstream_last_step``) and stage 2's metrics."""
    out: Dict[str, Any] = {"step": step}
    for name, metric in (("pass@1", "reward/pass_at_1"), ("pass@3", "reward/pass_at_3")):
        if metric in stage2:
            out[name] = stage2[metric]
    out["groups"] = record.get("groups")
    if "groups_failed" in record:
        out["groups_failed"] = record["groups_failed"]
    out["groups_hinted"] = len(record.get("hints", []))
    if record.get("hints_by_category"):
        out["hints_by_category"] = dict(record["hints_by_category"])
    by_category = {
        name: stage2[f"hint/category_{name}_success_rate"]
        for name in ("llm_synthesized", "static_fallback")
        if f"hint/category_{name}_success_rate" in stage2
    }
    if by_category:
        out["hinted_success_rate_by_category"] = by_category
    for name, metric in (("signal_rescued", "hint/signal_rescued"), ("transfer", "hint/transfer_rate"), ("reliance", "hint/reliance")):
        if metric in stage2:
            out[name] = stage2[metric]
    if loss is not None:
        out["loss"] = loss
    advantages = record.get("advantages") or []
    if advantages:
        out["mean_abs_advantage"] = sum(abs(a) for a in advantages) / len(advantages)
    out["seconds"] = seconds
    parts = {k[len("seconds_") :]: v for k, v in record.items() if k.startswith("seconds_")}
    if parts:
        out["seconds_in"] = parts
    out["stage2"] = dict(stage2)
    return out


def value(e: Mapping[str, Any], path: str) -> Optional[float]:
    """A dotted field of an entry, or ``None``."""
    current: Any = e
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return float(current) if isinstance(current, (int, float)) and not isinstance(current, bool) else None


def _chart(title: str, path: str, runs: Sequence[Tuple[str, Sequence[Mapping[str, Any]]]]) -> str:
    w, h, left, bottom = 420, 220, 48, 28
    series = [[(float(e["step"]), v) for e in entries if (v := value(e, path)) is not None] for _, entries in runs]
    points = [p for s in series for p in s]
    head = f'<figure><figcaption>{html.escape(title)}</figcaption><svg width="{w}" height="{h}" role="img">'
    if not points:
        return head + f'<text x="{left}" y="{h // 2}" fill="#888">no value yet</text></svg></figure>'
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (w - left - 10)

    def sy(y: float) -> float:
        return h - bottom - (y - y0) / (y1 - y0) * (h - bottom - 10)

    parts = [head, f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="10" x2="{left}" y2="{h - bottom}" stroke="#888"/>',
             f'<text x="2" y="14" font-size="11">{y1:.3g}</text><text x="2" y="{h - bottom}" font-size="11">{y0:.3g}</text>',
             f'<text x="{left}" y="{h - 8}" font-size="11">step {x0:g}</text><text x="{w - 60}" y="{h - 8}" font-size="11">{x1:g}</text>']
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        if len(s) > 1:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in s)
    parts.append("</svg></figure>")
    return "".join(parts)


def page(runs: Sequence[Tuple[str, Sequence[Mapping[str, Any]]]], title: str = "hintstream: a real GRPO run") -> str:
    """The HTML page of one or more runs' entries, ``[(label, entries)]``."""
    legend = " ".join(
        f'<span style="color:{COLOURS[i % len(COLOURS)]}">&#9632; {html.escape(label)}</span>' for i, (label, _) in enumerate(runs)
    )
    charts = "".join(_chart(t, p, runs) for t, p in CURVES)
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}figure{display:inline-block;margin:.5em}"
        "figcaption{font-size:14px;font-weight:bold}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{legend}</p>{charts}</body></html>\n"
    )


def write(out_dir: Path, label: str, entries: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    """``report.json`` (``meta`` and the entries) and ``index.html``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**dict(meta), "steps": list(entries)}
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "index.html").write_text(page([(label, entries)]))


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m hintstream.rl_report OUT.html DIR [DIR ...]", file=sys.stderr)
        return 2
    runs = []
    for d in args[1:]:
        report = json.loads((Path(d) / "report.json").read_text())
        runs.append((str(report.get("arms", d)), report["steps"]))
    Path(args[0]).write_text(page(runs, "hintstream: real GRPO runs side by side"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
