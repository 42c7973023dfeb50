"""Sync vs async training on the calc task, with slow tools: wall time, rollouts/s, success.

The warmed-up starter model, the calc agent in-process through the real
gateway (the packaged agent's loop, with every calculator call taking an
extra ``--latency`` seconds, as a remote tool would), GRPO with the same
seed (each run in a fresh process), the same number of updates and the same number of trained rollouts in
both modes. Async keeps ``--in-flight`` groups running (default 2 × batch)
and pauses admission only for the update. Per latency it prints the wall
time of the training steps (evaluation excluded; an evaluation and
``--warmup-steps`` untimed updates warm each run up, so the clock sees the
steady state), trained rollouts per
second, the async speedup, groups dropped for policy lag, and held-out
success after training (``--eval-tasks`` val tasks: sampled at T=1, 2 per
task, and greedy). The target is async ≥ 2× the rollouts/s of sync at
0.2 s, with no worse success.

    .venv/bin/python benchmarks/sync_vs_async.py [--latency 0 0.2 1] [--steps 4] [--warmup-steps 1]
        [--batch-groups 4] [--n 4] [--in-flight 0] [--eval-tasks 20] [--max-lag 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LATENCY_ENV = "TETHER_BENCH_TOOL_LATENCY"


async def agent(task: dict[str, Any], client: Any) -> str:
    """``tether.starter.calc.agent``, with ``$TETHER_BENCH_TOOL_LATENCY`` s per tool call."""
    from tether.starter import calc

    latency = float(os.environ.get(LATENCY_ENV, "0"))

    async def slow_tool(name: str, arguments: str) -> str:
        await asyncio.sleep(latency)  # as a remote tool would take
        return calc.run_tool_call(name, arguments)

    return await calc.agent(task, client, slow_tool if latency else calc.run_tool_call)


def config(args: argparse.Namespace, mode: str, out: Path) -> Any:
    from tether.run import (
        CheckpointConfig,
        EvalConfig,
        RolloutConfig,
        RunConfig,
        TasksConfig,
        TrainConfig,
        TrainerConfig,
    )
    from tether.runner import RunnerConfig

    in_flight = args.in_flight or 2 * args.batch_groups
    return TrainConfig(
        name=f"{mode}",
        dir=str(out),
        tasks=TasksConfig(source="calc", train_size=2000, val_size=args.eval_tasks, seed=0),
        agent=RunnerConfig(
            mode="inprocess",
            entry=f"{Path(__file__).resolve()}:agent",
            concurrency=in_flight * args.n,
            timeout_s=300,
        ),
        rollout=RolloutConfig(n=args.n, batch_groups=args.batch_groups),
        trainer=TrainerConfig(
            steps=args.warmup_steps + args.steps,
            lr=2e-4,
            seed=0,
        ),
        run=RunConfig(
            mode=mode,
            max_groups_in_flight=in_flight,
            max_policy_lag=args.max_lag,
            collapse_patience=0,
        ),
        eval=EvalConfig(tasks=args.eval_tasks, samples=2, greedy=True),
        checkpoint=CheckpointConfig(every=0, keep=1),
    )


async def one_run(args: argparse.Namespace, mode: str, latency: float, out: Path) -> dict:
    from tether.run import TrainingRun

    os.environ[LATENCY_ENV] = str(latency)
    cfg = config(args, mode, out / f"{mode}-{latency:g}")
    async with TrainingRun(cfg, model_path=args.model) as run:
        before = await run.evaluate(0)  # also warms the engine up before the clock starts
        for step in range(args.warmup_steps):  # first backward, kernels for new shapes
            await run.train_step(step)
        t0 = time.perf_counter()
        for step in range(args.warmup_steps, args.warmup_steps + args.steps):
            await run.train_step(step)
        wall = time.perf_counter() - t0
        await run.stop_rollouts()
        ev = await run.evaluate(args.steps)
        hist = [r.metrics for r in run.history[args.warmup_steps :]]
        counts = run.store.counts(run.run_record.id)
    trained = sum(m["rollouts"] for m in hist)
    return {
        "wall": wall,
        "trained": trained,
        "rate": trained / wall,
        "dropped": sum(m.get("groups_dropped_lag", 0.0) for m in hist),
        "update": sum(m.get("update_s", 0.0) for m in hist) / len(hist),
        "held": sum(m.get("calls_held", 0.0) for m in hist),
        "calls": counts["calls"],
        "before": before.sampled,
        "sampled": ev.sampled,
        "greedy": ev.greedy,
    }


def child(args: argparse.Namespace, mode: str, latency: float, tmp: str) -> dict:
    """One run in a fresh process, so each pays the same one-time costs (first backward, ...)."""
    cmd = [sys.executable, __file__, "--one", mode, str(latency), tmp, str(args.model)]
    for flag in (
        "steps",
        "warmup_steps",
        "batch_groups",
        "n",
        "in_flight",
        "max_lag",
        "eval_tasks",
    ):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {mode} run at {latency:g} s failed (exit {done.returncode})")
    return json.loads(lines[-1][7:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.2, 1.0])
    p.add_argument("--steps", type=int, default=4, help="timed updates per run")
    p.add_argument("--warmup-steps", type=int, default=1, help="untimed updates first")
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--n", type=int, default=4, help="rollouts per group")
    p.add_argument("--in-flight", type=int, default=0, help="async groups in flight (0: 2×batch)")
    p.add_argument("--max-lag", type=int, default=1, help="async max_policy_lag (drop beyond)")
    p.add_argument("--eval-tasks", type=int, default=20)
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # mode latency dir model
    args = p.parse_args()
    if min(args.steps, args.batch_groups, args.eval_tasks) < 1 or args.n < 2:
        p.error("--steps, --batch-groups, --eval-tasks must be >= 1 and --n >= 2")
    if args.warmup_steps < 0 or args.in_flight < 0 or args.max_lag < 0:
        p.error("--warmup-steps, --in-flight and --max-lag must be >= 0")
    from transformers.utils import logging as hf_logging

    from tether.starter import build_starter

    hf_logging.disable_progress_bar()
    if args.one:
        mode, latency, out, model = args.one
        args.model = Path(model)
        result = asyncio.run(one_run(args, mode, float(latency), Path(out)))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    args.model = Path(build_starter(warm=True))
    rows = []
    with tempfile.TemporaryDirectory(prefix="sync-vs-async-") as tmp:
        for latency in args.latency:
            for mode in ("sync", "async"):
                r = child(args, mode, latency, tmp)
                rows.append((latency, mode, r))
                print(f"  {mode} at {latency:g} s: {r['wall']:.1f} s", file=sys.stderr, flush=True)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    r0 = rows[0][2]
    print(
        f"calc task, warm starter model, {args.steps} timed updates (after {args.warmup_steps}) × "
        f"{args.batch_groups} groups × "
        f"{args.n} rollouts per mode; async: {args.in_flight or 2 * args.batch_groups} groups "
        f"in flight, max lag {args.max_lag}; {psutil.cpu_count()} CPUs, load average {load}\n"
        f"held-out success before training: {r0['before']:.0%} sampled (T=1, 2 per task), "
        f"{args.eval_tasks} val tasks; the clock covers the updates only"
    )
    head = ("tool s", "mode", "wall s", "trained", "rollouts/s", "speedup", "lag drops")
    print(
        " ".join(f"{h:>10}" for h in head),
        f"{'held calls':>10} {'update s':>9} {'success T=1':>11} {'greedy':>7}",
    )
    base: dict[float, float] = {}
    for latency, mode, r in rows:
        if mode == "sync":
            base[latency] = r["rate"]
        speed = r["rate"] / base[latency] if latency in base else float("nan")
        print(
            f"{latency:>10g} {mode:>10} {r['wall']:>10.1f} {r['trained']:>10.0f} "
            f"{r['rate']:>10.2f} {speed:>9.2f}× {r['dropped']:>10.0f} {r['held']:>10.0f} "
            f"{r['update']:>9.2f} {r['sampled']:>11.0%} {r['greedy'] or 0:>7.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
