"""tether against TRL's GRPOTrainer on single-turn calc, CPU: one identical update, then training.

Single-turn calc, the first step of the calc agent: the model gets the calc
system prompt, the ``calculator`` tool and the question, and makes one reply
(the tool is not run). A 2M-parameter model cannot multiply in its head, so
the reply counts as right when the expression of its calculator call
evaluates to the answer, or, with no call, when its last number is the
answer (:func:`grade`). The warm starter answers multiplication and division
problems from memory more often than not, so there is something to learn:
calling the tool, with the right operands.

``--identical``: one update of each trainer on the same batch (same weights,
prompts, completions, rewards; TRL's generation replaced by the fixed
completions): advantages, loss, and per parameter tensor the gradient cosine
and norm ratio and the parameter-delta cosine (see ``_vs_trl_identical.py``).

Otherwise, training: both trainers start from one pinned model folder
(``--model``, default the warm starter; its weights hash and its held-out
success are printed, so two tables that start from different models show it) with
the same GRPO settings: group size ``--n``, ``--batch-groups`` prompts per
step, learning rate, ``--steps`` steps, completions of at most
``--max-tokens`` tokens at T=1 (no top-k/top-p), one optimizer step per
batch, PPO clip 0.2/0.28, no KL, token-mean loss (TRL: ``loss_type="dapo"``,
``beta=0``; tether: ``aggregation=token_mean``, ``kl_coef=0``).

- The same task sequence: for seed ``s`` tether's run draws step ``k``'s (from 1)
  tasks with ``tasks_for_step(train, k, batch_groups, s)``; TRL's dataset is
  those tasks in that order, and its sampler does not shuffle
  (``shuffle_dataset=False``: ``RepeatSampler`` walks the rows in order).
- tether: the run as a user runs it: an in-process agent calling the
  gateway with the OpenAI SDK, the embedded engine, SQLite traces.
- TRL: ``GRPOTrainer`` with its built-in generation (``model.generate``).
- ``--seeds N`` runs per side (8 or more to read the result; one run's
  final success scatters by ±10-17 points between seeds), interleaved
  (tether seed 0, TRL seed 0, tether seed 1, ...) so that machine load falls
  on both alike; each run in its own process.
- Optimizer steps actually taken are counted on both sides: tether skips
  the step when no group has reward variance, TRL steps anyway (Adam
  momentum moves the weights without a gradient).
- The mean reward per step is kept: at step 1 both sides sample from the
  same weights on the same tasks, so its mean over seeds should agree
  within the spread (a check that the two samplers and graders match).

The same evaluator scores every final model on ``--eval-tasks`` held-out
tasks (tether's engine on the model's weights, no gateway): greedy, and 2
samples per task at T=1. Printed: a markdown table (mean ± sd over seeds)
ready for benchmarks/README.md, and one line per run. On a shared machine
set ``OMP_NUM_THREADS=1``: two processes' OpenMP threads on two cores slow
small-batch decoding by 10-50×.

TRL stays out of the project's environment; install it in a venv of its own:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 'trl==1.16.0' -e '.[dev]'
    OMP_NUM_THREADS=1 .venv-trl/bin/python benchmarks/vs_trl.py --identical
    OMP_NUM_THREADS=1 .venv-trl/bin/python benchmarks/vs_trl.py --seeds 8 [--steps 12]
        [--batch-groups 8] [--n 8] [--max-tokens 32] [--lr 2e-4] [--eval-tasks 40]
        [--model FOLDER]
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


def tools() -> list[dict[str, Any]]:
    from tether.starter.calc import CALCULATOR_TOOL

    return [CALCULATOR_TOOL]


def prompt_text(tokenizer: Any, question: str) -> str:
    """The prompt as text, rendered as tether's gateway renders the agent's request
    (TRL gets this text, so both sides see the same prompt token ids)."""
    from tether.chat import render_text

    return render_text(tokenizer, messages(question), tools())


async def agent(task: dict[str, Any], client: Any) -> str:
    """Single turn: one call offering the calculator; the reply is its text and the
    arguments of any tool call (``{"expression": ...}``, what :func:`grade` reads)."""
    r = await client.chat.completions.create(
        model="policy",
        messages=messages(task["question"]),
        tools=tools(),
        max_tokens=int(os.environ.get(MAX_TOKENS_ENV, "32")),
    )
    message = r.choices[0].message
    calls = [c.function.arguments for c in message.tool_calls or []]
    return " ".join([message.content or "", *calls]).strip()


# -- the shared evaluator ------------------------------------------------------------


def evaluate(model: Any, tokenizer: Any, tasks: list[dict], max_tokens: int) -> dict[str, float]:
    """Greedy and sampled (2 per task, T=1) success of ``model`` on ``tasks``."""
    from tether.chat import render_prompt
    from tether.engine import SamplingParams, TransformersEngine

    async def run() -> dict[str, float]:
        engine = TransformersEngine(model, tokenizer, max_batch_size=64, seed=0)
        try:
            prompts = [render_prompt(tokenizer, messages(t["question"]), tools()) for t in tasks]
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


def task_sequence(args: argparse.Namespace) -> list[dict]:
    """The tasks tether's run trains on, in its order: what TRL's dataset holds too."""
    from tether.run import load_tasks, tasks_for_step

    train, _ = load_tasks(tasks_config(args))
    return [
        t.data
        for step in range(1, args.steps + 1)
        for t in tasks_for_step(train, step, args.batch_groups, args.seed)
    ]


def tasks_config(args: argparse.Namespace) -> Any:
    from tether.run import TasksConfig

    return TasksConfig(source="calc", train_size=2000, val_size=args.eval_tasks, seed=args.seed)


def run_tether(args: argparse.Namespace) -> dict:
    from tether.run import (
        CheckpointConfig,
        EvalConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
        TrainerConfig,
        TrainingRun,
        tasks_for_step,
    )
    from tether.runner import RunnerConfig

    os.environ[MAX_TOKENS_ENV] = str(args.max_tokens)
    cfg = TrainConfig(
        name="tether",
        dir=str(Path(args.out) / f"tether-{args.seed}"),
        tasks=tasks_config(args),
        agent=RunnerConfig(
            mode="inprocess",
            entry=f"{Path(__file__).resolve()}:agent",
            concurrency=args.batch_groups * args.n,
        ),
        rollout=RolloutConfig(n=args.n, batch_groups=args.batch_groups, grader="vs_trl:grade"),
        trainer=TrainerConfig(
            steps=args.steps,
            lr=args.lr,
            betas=(0.9, 0.99),
            weight_decay=0.0,
            grad_clip=1.0,
            clip_low=0.2,
            clip_high=0.28,
            aggregation="token_mean",
            kl_coef=0.0,
            seed=args.seed,
        ),
        run=RunConfig(collapse_patience=0),
        eval=EvalConfig(tasks=1, samples=2, greedy=False),
        checkpoint=CheckpointConfig(every=0, keep=1),
    )
    expected = [t["id"] for t in task_sequence(args)]

    async def go() -> tuple[list[float], int, list[float], Any, Any, list[str]]:
        async with TrainingRun(cfg, model_path=Path(args.model)) as run:
            await run.evaluate(0)  # warms the engine up; "s/step 2+" compares steady states
            times, updates, rewards = [], 0, []
            for step in range(1, args.steps + 1):
                t0 = time.perf_counter()
                report = await run.train_step(step)
                times.append(time.perf_counter() - t0)
                updates += "update_s" in report.metrics  # skipped when no group has variance
                rewards.append(report.metrics["reward_mean"])
            seen = [  # what train_step drew: the run's tasks, its seed, its batch size
                t.id
                for k in range(1, args.steps + 1)
                for t in tasks_for_step(run.train_tasks, k, args.batch_groups, cfg.tasks.seed)
            ]
            return times, updates, rewards, run.trainer.model, run.tokenizer, seen

    times, updates, rewards, model, tokenizer, seen = asyncio.run(go())
    if seen != expected:
        raise SystemExit("tether's run trained on other tasks than task_sequence() lists")
    return {
        "times": times,
        "optimizer_steps": updates,
        "signal_steps": updates,
        "rewards": rewards,
        **evaluate(model, tokenizer, val_tasks(args.eval_tasks), args.max_tokens),
    }


# -- the comparison --------------------------------------------------------------------


def child(which: str, seed: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--only", which, "--seed", str(seed)]
    cmd += ["--out", args.out, "--model", args.model]
    for flag in ("steps", "batch_groups", "n", "max_tokens", "lr", "eval_tasks"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {which} run (seed {seed}) failed (exit {done.returncode})")
    return json.loads(lines[-1][7:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--identical", action="store_true", help="one update on one fixed batch")
    p.add_argument("--seeds", type=int, default=8, help="runs per trainer (seeds 0..N-1)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-groups", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="completions per prompt (the group)")
    p.add_argument("--max-tokens", type=int, default=32, help="completion length cap")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-tasks", type=int, default=40)
    p.add_argument("--model", help="model folder to start from (default: the warm starter)")
    p.add_argument("--only", choices=("tether", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if min(args.steps, args.batch_groups, args.max_tokens, args.eval_tasks, args.seeds) < 1:
        p.error("--steps, --batch-groups, --max-tokens, --eval-tasks, --seeds must be >= 1")
    if args.n < 2:
        p.error("--n must be >= 2 (a group of one has no advantage)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if args.only:
        if args.only == "tether":
            result = run_tether(args)
        else:
            from _vs_trl_side import run_trl

            result = run_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    import psutil
    import torch

    try:
        import trl
    except ModuleNotFoundError:
        raise SystemExit(
            "vs_trl.py needs TRL: python3 -m venv .venv-trl && .venv-trl/bin/pip "
            "install torch==2.13.0 'trl==1.16.0' -e '.[dev]', then run it with .venv-trl/bin/python"
        ) from None
    from _vs_trl_report import content_hash, mean_sd, table

    from tether.models import load_model, load_tokenizer
    from tether.starter import build_starter

    args.model = str(Path(args.model or build_starter(warm=True)).resolve())
    if args.identical:
        from _vs_trl_identical import run_identical

        print(
            f"model {args.model} (weights sha256 {content_hash(args.model)}), TRL {trl.__version__}"
        )
        with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
            run_identical(args.model, grade, args.lr, tmp)
        return 0
    before = evaluate(
        load_model(args.model, dtype=torch.float32),
        load_tokenizer(args.model),
        val_tasks(args.eval_tasks),
        args.max_tokens,
    )
    rows: dict[str, list[dict]] = {"tether": [], "TRL": []}
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        args.out = tmp
        for seed in range(args.seeds):  # interleaved: load falls on both alike
            for which, key in (("tether", "tether"), ("trl", "TRL")):
                r = child(which, seed, args)
                rows[key].append(r)
                t = r["times"]
                print(
                    f"seed {seed} {key:>6}: {sum(t) / len(t):.2f} s/step, "
                    f"{r['optimizer_steps']} optimizer steps ({r['signal_steps']} with signal), "
                    f"reward per step {' '.join(f'{x:.2f}' for x in r['rewards'])}, "
                    f"greedy {r['greedy']:.0%}, sampled {r['sampled']:.0%}",
                    flush=True,
                )
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print()
    print(
        f"single-turn calc, model {Path(args.model).name} (weights sha256 "
        f"{content_hash(args.model)}), {args.steps} steps × {args.batch_groups} prompts × "
        f"{args.n} completions (≤ {args.max_tokens} tokens), lr {args.lr:g}, seeds "
        f"0–{args.seeds - 1} interleaved; TRL {trl.__version__}, torch {torch.__version__}; "
        f"{psutil.cpu_count()} CPUs, load average {load}; TRL's prompt token ids "
        f"{'equal' if all(r['same_prompt_ids'] for r in rows['TRL']) else 'DIFFER FROM'} tether's"
    )
    print(
        f"held-out success before training ({args.eval_tasks} val tasks): "
        f"greedy {before['greedy']:.0%}, sampled {before['sampled']:.0%}"
    )
    print()
    print("\n".join(table(rows, args.steps)))
    speed = [
        (sum(b["times"]) / len(b["times"])) / (sum(a["times"]) / len(a["times"]))
        for a, b in zip(rows["tether"], rows["TRL"], strict=True)
    ]
    m, sd = mean_sd(speed)
    print(f"\ntether is {m:.2f}× ± {sd:.2f} TRL's speed per step (paired by seed; target > 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
