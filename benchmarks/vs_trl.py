"""tether against TRL's GRPOTrainer on single-turn calc, CPU: seconds per step and held-out success.

Single-turn calc: the model gets the calc system prompt and the question, no
tool, and answers in one reply. A 2M-parameter model cannot multiply
3-digit numbers in its head, so the reply counts as right when the last
arithmetic expression in it (the starter model writes one, in the
calculator's JSON, even without a tool) evaluates to the answer, or, with no
expression, when its last number is the answer (:func:`grade`). Both trainers start from the same warmed-up starter model (a plain
``Qwen2ForCausalLM`` folder; tokenizer from ``tether.starter.load_tokenizer``)
with the same GRPO settings: group size ``--n``, ``--batch-groups`` prompts
per step, learning rate, ``--steps`` steps (so the same number of samples),
completions of at most ``--max-tokens`` tokens at T=1, one optimizer step per
batch, PPO clip 0.2/0.28, no KL, token-mean loss (TRL: ``loss_type="dapo"``,
``beta=0``; tether: ``aggregation=token_mean``, ``kl_coef=0``), same seed.

- tether: the run as a user runs it: an in-process agent calling the
  gateway with the OpenAI SDK, the embedded engine, SQLite traces.
- TRL: ``GRPOTrainer`` with its built-in generation (``model.generate``).

Each runs in its own process. Afterwards the same evaluator scores both
final models on ``--eval-tasks`` held-out tasks (tether's engine on the
model's weights, no gateway): greedy, and 2 samples per task at T=1.
tether skips the optimizer step when no group of the batch has reward
variance (all advantages 0); the "updates" column counts the steps that
had one, so compare s/step only when it equals --steps. On a shared
machine set ``OMP_NUM_THREADS=1``: two processes' OpenMP threads on two
cores slow small-batch decoding by 10-50×.

    .venv/bin/python benchmarks/vs_trl.py [--steps 6] [--batch-groups 4] [--n 8]
        [--max-tokens 32] [--lr 2e-4] [--eval-tasks 40]

Needs ``trl`` (``pip install 'trl==1.16.0'``; it reuses the installed torch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_TOKENS_ENV = "TETHER_BENCH_MAX_TOKENS"
_EXPRESSION = re.compile(r'"expression":\s*"([^"]*)"')


def grade(task: dict[str, Any], reply: str | None) -> float:
    """1.0 if the reply's last expression evaluates to the answer (else its last number is it)."""
    from tether.starter import calc

    found = _EXPRESSION.findall(reply or "")
    if not found:
        return calc.grade(task, reply)
    try:
        value = calc.safe_eval(found[-1])
    except calc.CalcError:
        return 0.0
    return calc.grade(task, calc.format_number(value))


def messages(question: str) -> list[dict[str, str]]:
    from tether.starter.calc import SYSTEM_PROMPT

    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


async def agent(task: dict[str, Any], client: Any) -> str:
    """Single turn, no tool: one call, the reply is the answer."""
    r = await client.chat.completions.create(
        model="policy",
        messages=messages(task["question"]),
        max_tokens=int(os.environ.get(MAX_TOKENS_ENV, "32")),
    )
    return r.choices[0].message.content or ""


# -- the shared evaluator ------------------------------------------------------------


def evaluate(model: Any, tokenizer: Any, tasks: list[dict], max_tokens: int) -> dict[str, float]:
    """Greedy and sampled (2 per task, T=1) success of ``model`` on ``tasks``."""
    from tether.chat import render_prompt
    from tether.engine import SamplingParams, TransformersEngine

    async def run() -> dict[str, float]:
        engine = TransformersEngine(model, tokenizer, max_batch_size=64, seed=0)
        try:
            prompts = [render_prompt(tokenizer, messages(t["question"])) for t in tasks]
            greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            sampled = SamplingParams(temperature=1.0, max_tokens=max_tokens, n=2, seed=0)
            out = {}
            for name, params in (("greedy", greedy), ("sampled", sampled)):
                results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
                scores = [
                    grade(t, tokenizer.decode(c.token_ids, skip_special_tokens=True))
                    for t, r in zip(tasks, results, strict=True)
                    for c in r.completions
                ]
                out[name] = sum(scores) / len(scores)
            return out
        finally:
            await engine.close()

    return asyncio.run(run())


def val_tasks(n: int) -> list[dict]:
    from tether.starter.calc import make_tasks

    return make_tasks(n, "val", 0)


# -- the two trainers ------------------------------------------------------------------


def run_tether(args: argparse.Namespace) -> dict:
    from tether.run import (
        CheckpointConfig,
        EvalConfig,
        RolloutConfig,
        TasksConfig,
        TrainConfig,
        TrainerConfig,
        TrainingRun,
    )
    from tether.runner import RunnerConfig

    os.environ[MAX_TOKENS_ENV] = str(args.max_tokens)
    cfg = TrainConfig(
        name="tether",
        dir=args.out,
        tasks=TasksConfig(source="calc", train_size=2000, val_size=args.eval_tasks, seed=0),
        agent=RunnerConfig(
            mode="inprocess",
            agent=f"{Path(__file__).resolve()}:agent",
            concurrency=args.batch_groups * args.n,
        ),
        rollout=RolloutConfig(n=args.n, batch_groups=args.batch_groups, grader="vs_trl:grade"),
        trainer=TrainerConfig(
            steps=args.steps,
            lr=args.lr,
            clip_low=0.2,
            clip_high=0.28,
            aggregation="token_mean",
            kl_coef=0.0,
            seed=0,
            collapse_patience=0,
        ),
        eval=EvalConfig(tasks=1, samples=2, greedy=False),
        checkpoint=CheckpointConfig(every=0, keep=1),
    )

    async def go() -> tuple[list[float], Any, Any]:
        async with TrainingRun(cfg, model_path=Path(args.model)) as run:
            await run.evaluate(0)  # warms the engine up; "s/step 2+" compares steady states
            times, updates = [], 0
            for step in range(args.steps):
                t0 = time.perf_counter()
                report = await run.train_step(step)
                times.append(time.perf_counter() - t0)
                updates += "update_s" in report.metrics  # skipped when no group has variance
            return times, updates, run.trainer.model, run.tokenizer

    times, updates, model, tokenizer = asyncio.run(go())
    return {
        "times": times,
        "updates": updates,
        **evaluate(model, tokenizer, val_tasks(args.eval_tasks), args.max_tokens),
    }


def run_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tether.starter import load_model, load_tokenizer
    from tether.starter.calc import make_tasks

    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype=torch.float32)
    train = make_tasks(args.steps * args.batch_groups, "train", 0)
    data = Dataset.from_list(
        [{"prompt": messages(t["question"]), "answer": t["answer"]} for t in train]
    )

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        return [
            grade({"answer": a}, c[0]["content"]) for c, a in zip(completions, answer, strict=True)
        ]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.times.append(time.perf_counter() - self.t0)

    clock = Clock()
    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"),
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_groups * args.n,
        gradient_accumulation_steps=1,
        num_generations=args.n,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        max_steps=args.steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        use_cpu=True,
        bf16=False,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    model = trainer.model.eval()
    return {
        "times": clock.times,
        "updates": len(clock.times),  # TRL steps even when every advantage is 0
        **evaluate(model, load_tokenizer(args.model), val_tasks(args.eval_tasks), args.max_tokens),
    }


# -- the comparison --------------------------------------------------------------------


def child(which: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--only", which, "--out", args.out, "--model", args.model]
    for flag in ("steps", "batch_groups", "n", "max_tokens", "lr", "eval_tasks"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {which} run failed (exit {done.returncode})")
    return json.loads(lines[-1][7:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-groups", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="completions per prompt (the group)")
    p.add_argument("--max-tokens", type=int, default=32, help="completion length cap")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-tasks", type=int, default=40)
    p.add_argument("--only", choices=("tether", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if min(args.steps, args.batch_groups, args.max_tokens, args.eval_tasks) < 1 or args.n < 2:
        p.error("--steps, --batch-groups, --max-tokens, --eval-tasks must be >= 1, --n >= 2")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if args.only:
        result = run_tether(args) if args.only == "tether" else run_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    import psutil
    import torch
    import trl

    from tether.starter import build_starter, load_model, load_tokenizer

    args.model = str(build_starter(warm=True))
    before = evaluate(
        load_model(args.model, dtype=torch.float32),
        load_tokenizer(args.model),
        val_tasks(args.eval_tasks),
        args.max_tokens,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        args.out = tmp
        for which in ("tether", "trl"):
            rows.append((which, child(which, args)))
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"single-turn calc, warm starter model, {args.steps} steps × {args.batch_groups} prompts × "
        f"{args.n} completions (≤ {args.max_tokens} tokens), lr {args.lr:g}; TRL {trl.__version__}, "
        f"torch {torch.__version__}; {psutil.cpu_count()} CPUs, load average {load}"
    )
    print(
        f"held-out success before training ({args.eval_tasks} val tasks): "
        f"greedy {before['greedy']:.0%}, sampled {before['sampled']:.0%}"
    )
    head = ("trainer", "s/step", "s/step 2+", "total s", "updates", "greedy", "sampled T=1")
    print(" ".join(f"{h:>11}" for h in head))
    for which, r in rows:
        t = r["times"]
        later = t[1:] or t
        print(
            f"{which:>11} {sum(t) / len(t):>11.2f} {sum(later) / len(later):>11.2f} "
            f"{sum(t):>11.1f} {r['updates']:>11} {r['greedy']:>11.0%} {r['sampled']:>11.0%}"
        )
    (_, a), (_, b) = rows
    ratio = (sum(b["times"]) / len(b["times"])) / (sum(a["times"]) / len(a["times"]))
    print(f"tether is {ratio:.2f}× TRL's speed per step (target > 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
