"""INT8 rollouts vs fp32 on the demo task: engine speed and memory, the logprob gap, success.

Part 1, the engine alone: the warm starter model served by TransformersEngine in
fp32 (the trainer's weights) and as a torchao int8 weight-only copy
(``rollout_dtype="int8"``), ``--concurrency`` requests of ``--max-tokens`` new
tokens (EOS ignored) each, measured interleaved fp32 / int8 / fp32 / int8 in one
process: generated tokens/s, and the bytes of the weights each engine serves.

Part 2, training: the demo's run (calc task, warm starter, GRPO, its lr, batch and
clip) shortened to ``--steps`` updates and ``--eval-tasks`` held-out tasks (sampled
at T=1, ``--eval-samples`` per task, and greedy), per seed in three variants run
back to back (each in a fresh process): fp32, int8, and int8 with truncated
importance sampling (``trainer.tis_cap=--tis-cap``). Per variant: the mean
``logprob_gap`` (|engine − trainer| logprob over trained tokens, the per-step
self-check), the mean PPO clip fraction (clipping on the first optimizer step is
numerical mismatch, not policy change), rollout tokens/s, peak RSS, and held-out
success before and after. Evals run on the variant's engine (int8 evals with the
int8 copy: what the served policy does); the "before" eval runs once per seed, in
the fp32 run (same start weights, same tasks), and every variant's gain is against it.

    .venv/bin/python benchmarks/int8_rollouts.py [--seeds 0 1 2] [--steps 12] [--eval-tasks 40]
        [--eval-samples 2] [--tis-cap 2] [--concurrency 32] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {"fp32": ("float32", 0.0), "int8": ("int8", 0.0), "int8+TIS": ("int8", None)}


def engine_speed(model_path: Path, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """tokens/s per dtype (two interleaved rounds each) and served weight bytes."""
    from tether.engine import SamplingParams, TransformersEngine, weight_bytes
    from tether.models import load_model

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True, seed=1)
    prompts = [[3 + (7 * i + j) % 1500 for j in range(48)] for i in range(concurrency)]
    out: dict[str, Any] = {"tok_s": {"fp32": [], "int8": []}, "bytes": {}}

    async def round_(engine: TransformersEngine) -> float:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return sum(len(r.completions[0].token_ids) for r in res) / (time.perf_counter() - t0)

    async def go() -> None:
        engines = {
            "fp32": TransformersEngine(load_model(model_path), seed=0),
            "int8": TransformersEngine(load_model(model_path), seed=0, rollout_dtype="int8"),
        }
        try:
            for e in engines.values():  # warm-up: first-call costs out of the clock
                await round_(e)
            for _ in range(2):
                for name, e in engines.items():
                    out["tok_s"][name].append(await round_(e))
            out["bytes"] = {k: weight_bytes(e.model) for k, e in engines.items()}
        finally:
            for e in engines.values():
                await e.close()

    asyncio.run(go())
    return out


async def one_run(args: argparse.Namespace, variant: str, seed: int, out: Path) -> dict:
    from tether.cli._train_run import demo_config
    from tether.engine import weight_bytes
    from tether.run import EvalConfig, TrainingRun

    dtype, cap = VARIANTS[variant]
    cfg = demo_config(seed, args.steps)
    cfg = dataclasses.replace(
        cfg,
        name=f"{variant.replace('+', '-')}-{seed}",
        dir=str(out),
        model=dataclasses.replace(cfg.model, rollout_dtype=dtype),
        trainer=dataclasses.replace(cfg.trainer, tis_cap=args.tis_cap if cap is None else cap),
        eval=EvalConfig(tasks=args.eval_tasks, samples=args.eval_samples, greedy=True),
    )
    t0 = time.perf_counter()
    async with TrainingRun(cfg, model_path=args.model) as run:
        # one "before" eval per seed (the fp32 run's): the same start weights and val tasks
        before = await run.evaluate(0) if variant == "fp32" else None
        for step in range(args.steps):
            await run.train_step(step)
        await run.stop_rollouts()
        after = await run.evaluate(args.steps)
        hist = [r.metrics for r in run.history if "update_s" in r.metrics]
        served = weight_bytes(run.engine.model)

    def mean(key: str) -> float:
        vals = [m[key] for m in hist if key in m]
        return statistics.fmean(vals) if vals else float("nan")

    return {
        "wall": time.perf_counter() - t0,
        "updates": len(hist),
        "gap": mean("logprob_gap"),
        "gap_max": max((m["logprob_gap_max"] for m in hist), default=float("nan")),
        "clip": mean("clip_frac_low") + mean("clip_frac_high"),
        "tok_s": mean("gen_tokens_per_s"),
        "rss_mb": max((m.get("rss_mb", 0.0) for m in hist), default=0.0),
        "served_mb": served / 2**20,
        "before": [before.sampled, before.greedy] if before else None,
        "after": [after.sampled, after.greedy],
    }


def child(args: argparse.Namespace, variant: str, seed: int, tmp: str) -> dict:
    cmd = [sys.executable, __file__, "--one", variant, str(seed), tmp, str(args.model)]
    for flag in ("steps", "eval_tasks", "eval_samples", "tis_cap"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {variant} run of seed {seed} failed (exit {done.returncode})")
    return json.loads(lines[-1][7:])


def report(args: argparse.Namespace, speed: dict, rows: list[tuple[str, int, dict]]) -> None:
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(f"{psutil.cpu_count()} CPUs, load average {load} (shared machine)")
    ts = speed["tok_s"]
    print(
        f"engine alone, warm starter, {args.concurrency} concurrent × {args.max_tokens} tokens, "
        "interleaved fp32/int8 ×2:"
    )
    for name in ("fp32", "int8"):
        rounds = " ".join(f"{x:.0f}" for x in ts[name])
        print(
            f"  {name}: {statistics.fmean(ts[name]):7.0f} tok/s (rounds {rounds}); "
            f"served weights {speed['bytes'][name] / 2**20:.2f} MiB"
        )
    print(
        f"\ntraining: demo config shortened to {args.steps} updates (demo: 80), held-out "
        f"{args.eval_tasks} val tasks × {args.eval_samples} sampled (T=1) + greedy; "
        f"int8+TIS: trainer.tis_cap={args.tis_cap:g}"
    )
    head = "variant   seed  gap mean  gap max  clip frac  tok/s  peak RSS MiB  wall s"
    print(head + "  after T=1 / greedy (gain vs the seed's fp32 before)")
    before = {seed: r["before"] for v, seed, r in rows if v == "fp32"}
    gains: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for variant, seed, r in rows:
        a, b = r["after"], before.get(seed)
        gain = (a[0] - b[0], a[1] - b[1]) if b else (float("nan"),) * 2
        gains[variant].append(gain)
        print(
            f"{variant:<9} {seed:>4}  {r['gap']:.2e}  {r['gap_max']:7.3f}  {r['clip']:9.4f}  "
            f"{r['tok_s']:5.0f}  {r['rss_mb']:12.0f}  {r['wall']:6.0f}  "
            f"{a[0]:>5.0%} ({gain[0] * 100:+.0f}) / {a[1]:.0%} ({gain[1] * 100:+.0f})"
        )
    befores = " ".join(f"seed {k}: {v[0]:.0%} / {v[1]:.0%}" for k, v in before.items())
    print(f"before training (T=1 / greedy): {befores}")
    print("mean over seeds:")
    for variant in VARIANTS:
        rs = [r for v, _, r in rows if v == variant]
        if not rs:
            continue
        g = gains[variant]
        print(
            f"  {variant:<9} gap {statistics.fmean(r['gap'] for r in rs):.2e}  "
            f"clip {statistics.fmean(r['clip'] for r in rs):.4f}  "
            f"after {statistics.fmean(r['after'][0] for r in rs):.0%} T=1 "
            f"({statistics.fmean(x[0] for x in g) * 100:+.1f} points), "
            f"{statistics.fmean(r['after'][1] for r in rs):.0%} greedy "
            f"({statistics.fmean(x[1] for x in g) * 100:+.1f})  "
            f"tok/s {statistics.fmean(r['tok_s'] for r in rs):.0f}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eval-tasks", type=int, default=40)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--tis-cap", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # variant seed dir model
    args = p.parse_args()
    for name in ("torchao", "torch.utils._pytree"):  # CUDA-kernel load noise (see tether.cli)
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    from tether.starter import build_starter

    hf_logging.disable_progress_bar()
    if args.one:
        variant, seed, out, model = args.one
        args.model = Path(model)
        result = asyncio.run(one_run(args, variant, int(seed), Path(out)))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    args.model = Path(build_starter(warm=True))
    speed = engine_speed(args.model, args.concurrency, args.max_tokens)
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-rollouts-") as tmp:
        for seed in args.seeds:
            for variant in args.variants:
                r = child(args, variant, seed, tmp)
                rows.append((variant, seed, r))
                print(f"  {variant} seed {seed}: {json.dumps(r)}", file=sys.stderr, flush=True)
    report(args, speed, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
