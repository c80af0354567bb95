"""A real GRPO run through hintstream (``scripts/rl-demo.sh`` starts the
broker, both stages and the model server, then this):
SmolLM2-135M-Instruct (:mod:`hintstream.policy`) learns the built-in
arithmetic task (:mod:`hintstream.arith_task`) with TRL's GRPOTrainer on
CPU, hints and advantages through hintstream (:mod:`hintstream.trl`).
Writes ``OUT/report.json`` and ``OUT/index.html`` (:mod:`hintstream.rl_report`)
after every step.

    python -m hintstream.rl_demo --bootstrap HOST:PORT --arms llm|static|none \\
        [--steps 30] [--seed 0] [--prompts 8] [--generations 4] [--max-new-tokens 64] --out DIR

``--arms`` only says whether the trainer asks for hints (``none``: it does
not); which hints come (LLM or static) is stage 1's configuration.
``--baseline N`` measures the untrained policy's pass@1 on N problems
instead (no broker needed)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig

from . import arith_task, rl_report
from .client import HintstreamError, TrainerClient
from .policy import load_policy, smollm2_gguf
from .trl import HintstreamGRPOTrainer, HintstreamSettings

log = logging.getLogger("hintstream")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hintstream.rl_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("HINTSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--topics", default=None, help="JSON object of topic names (hintstream.Topics' fields); default names otherwise")
    p.add_argument("--arms", choices=("llm", "static", "none"), default="llm")
    p.add_argument("--run-id", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) a step")
    p.add_argument("--generations", type=int, default=4, help="completions a prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--pool", type=int, default=64, help="problems in the data set (they recur across steps)")
    p.add_argument("--level", type=int, default=1, help="the task's difficulty, 1 to 3")
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--n-hint-samples", type=int, default=2)
    p.add_argument("--hint-timeout", type=float, default=60.0)
    p.add_argument("--advantages-timeout", type=float, default=120.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: on a busy 2-core machine, 2 threads generated 9 times slower than 1)")
    p.add_argument("--out", type=Path, default=Path("rl-demo-out"))
    p.add_argument("--baseline", type=int, default=0, metavar="N", help="only measure the untrained policy's pass@1 on N problems")
    return p.parse_args(argv)


def baseline(args: argparse.Namespace) -> Dict[str, Any]:
    """The untrained policy's pass@1 on ``args.baseline`` problems, each
    sampled ``args.generations`` times at temperature 1 (as training
    samples), 16 problems a batch."""
    model, tokenizer = load_policy()
    model.eval()
    tokenizer.padding_side = "left"
    torch.manual_seed(args.seed)
    rows = arith_task.problems(args.baseline, args.seed, args.level)
    solved, total, formatted = 0, 0, 0
    started = time.monotonic()
    for first in range(0, len(rows), 16):
        chunk = [r for r in rows[first : first + 16] for _ in range(args.generations)]
        enc = tokenizer.apply_chat_template([r["prompt"] for r in chunk], add_generation_prompt=True, return_tensors="pt", return_dict=True, padding=True)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for row, text in zip(chunk, texts):
            solved += int(arith_task.reward(text, row["answer"]))
            formatted += int(arith_task.parse_answer(text) is not None)
            total += 1
        print(f"baseline: {total} samples, {solved} solved, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return {"level": args.level, "problems": len(rows), "samples": total, "pass@1": solved / total,
            "answer_line_rate": formatted / total, "seconds": time.monotonic() - started}


def train(args: argparse.Namespace) -> Path:
    run_id = args.run_id or f"rl-demo-{args.arms}-{uuid.uuid4().hex[:8]}"
    rows = arith_task.problems(args.pool, args.seed, args.level)
    model, tokenizer = load_policy()
    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        data_seed=args.seed,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,  # 135M parameters fit; recomputing would only cost time
        # TRL defaults to bf16, which on a CPU without bf16 instructions runs a reference matmul:
        # a training step took over 20 minutes instead of about one.
        bf16=False,
        dataloader_num_workers=0,
    )
    topics = json.loads(args.topics) if args.topics else None
    client = TrainerClient(args.bootstrap, topics=topics)
    trainer = HintstreamGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[arith_task.reward_func],
        args=config,
        train_dataset=Dataset.from_list(rows),
        client=client,
        hintstream=HintstreamSettings(
            run_id=run_id,
            enable_hints=args.arms != "none",
            n_hint_samples=args.n_hint_samples,
            hint_timeout=args.hint_timeout,
            advantages_timeout=args.advantages_timeout,
        ),
        feedback_fn=arith_task.Verifier(rows),
    )
    meta = {
        "run_id": run_id, "arms": args.arms, "seed": args.seed, "steps": args.steps, "prompts": args.prompts,
        "generations": args.generations, "max_new_tokens": args.max_new_tokens, "pool": args.pool, "level": args.level,
        "learning_rate": args.learning_rate, "n_hint_samples": args.n_hint_samples, "policy": smollm2_gguf().name,
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "python": platform.python_version(),
    }
    trainer.add_callback(Reporter(trainer, client, args.out, meta))
    try:
        trainer.train()
    finally:
        client.close(timeout=5)
    return args.out


class Reporter(TrainerCallback):  # type: ignore[misc]
    """Builds the report as the training goes: stage 2's metrics of each
    step, the trainer's record of it, the loss; written after every step."""

    def __init__(self, trainer: Any, client: Any, out: Path, meta: Dict[str, Any]) -> None:
        self.trainer, self.client, self.out, self.meta = trainer, client, out, meta
        self.entries: List[Dict[str, Any]] = []
        self.started = time.monotonic()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        record = self.trainer.hintstream_last_step
        step = record.get("step", state.global_step - 1)
        try:
            stage2 = self.client.wait_metrics(self.meta["run_id"], step, timeout=30)
        except HintstreamError as e:  # the report shows what is missing
            log.warning("hintstream: no stage-2 metrics for step %d: %s", step, e)
            stage2 = {}
        self.entries.append(rl_report.entry(step, record, stage2, None, time.monotonic() - self.started))

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if logs and "loss" in logs and self.entries:
            self.entries[-1]["loss"] = float(logs["loss"])
        rl_report.write(self.out, self.meta["arms"], self.entries, self.meta)


def main(argv: Optional[List[str]] = None) -> int:
    # transformers 5.24 deprecates `gradient_checkpointing`, which TRL 1.16's config still sets:
    # nothing a user of the demo can act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.baseline:
        print(json.dumps(baseline(args)))
        return 0
    out = train(args)
    print(f"report: {out / 'report.json'}, curves: {out / 'index.html'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
