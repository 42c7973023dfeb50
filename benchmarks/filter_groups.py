"""Does ``rollout.filter_groups`` (DAPO's dynamic sampling) help the demo, at equal updates?

Each run is the demo recipe (``tether demo``'s config: the warm starter learning the calc
task, 8 groups × 8 rollouts per update, lr 1e-4) for ``--steps`` updates, once as today
(``off``) and once with ``rollout.filter_groups: true`` and ``--max-oversample``
(``on``), per seed, interleaved (seed 0 off, seed 0 on, seed 1 off, …) so that the
machine's load falls on both alike. Held-out evals (100 tasks, greedy and 4 samples)
before and after. Printed per run:

- steps with full signal: updates whose every trained group carried signal (``off``: no
  group with all rewards equal, none dropped; ``on``: ``batch_groups`` groups kept);
- the mean share of trained groups with signal per update;
- the rollouts sampled in all (``on`` samples extra groups);
- greedy and sampled held-out success before → after, and the wall time.

    .venv/bin/python benchmarks/filter_groups.py [--steps 40] [--seeds 0 1 2]
        [--max-oversample 3] [--modes off on]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _evals import change, gains  # the script's folder
from _shapes import quiet_torchao


def config(mode: str, seed: int, steps: int, oversample: int, tmp: Path) -> Any:
    from tether.cli._train_run import demo_config

    cfg = demo_config(seed=seed, steps=steps)
    rollout = dataclasses.replace(
        cfg.rollout, filter_groups=mode == "on", max_oversample=oversample
    )
    return dataclasses.replace(
        cfg, name=f"{mode}-seed{seed}", dir=str(tmp), rollout=rollout,
        eval=dataclasses.replace(cfg.eval, every=steps),
    )  # fmt: skip


async def train(cfg: Any) -> tuple[list[Any], Path]:
    from tether.run import TrainingRun

    async with TrainingRun(cfg) as run:
        evals = await run.train()
        return evals, run.run_dir


def step_series(run_dir: Path, name: str) -> dict[int, float]:
    """One metric per training step (the last value logged at that step)."""
    from tether.store import Store

    with Store(run_dir / "traces.sqlite") as store:
        return {m.step: m.value for r in store.list_runs() for m in store.metrics(r.id, name)}


def signal(run_dir: Path, mode: str, batch: int) -> tuple[int, float, int]:
    """(updates with full signal, mean share of trained groups with signal, rollouts)."""
    zero = step_series(run_dir, "zero_variance_groups")
    dropped = step_series(run_dir, "groups_dropped")
    kept = step_series(run_dir, "groups_kept")
    rollouts = step_series(run_dir, "rollouts")
    full, shares = 0, []
    for step, z in zero.items():
        trained = kept.get(step, batch - dropped.get(step, 0.0)) if mode == "on" else batch
        with_signal = trained - z - (0 if mode == "on" else dropped.get(step, 0.0))
        full += with_signal >= batch
        shares.append(with_signal / batch)
    return full, statistics.fmean(shares or [float("nan")]), int(sum(rollouts.values()))


def one(mode: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    cfg = config(mode, seed, args.steps, args.max_oversample, tmp)
    t0 = time.monotonic()
    evals, run_dir = asyncio.run(train(cfg))
    minutes = (time.monotonic() - t0) / 60
    full, share, rollouts = signal(run_dir, mode, cfg.rollout.batch_groups)
    before, after = evals[0], evals[-1]
    return dict(
        mode=mode, seed=seed, full=full, share=share, rollouts=rollouts, minutes=minutes,
        greedy=(before.greedy or 0.0, after.greedy or 0.0),
        sampled=(before.sampled, after.sampled),
    )  # fmt: skip


def line(r: dict[str, Any], steps: int) -> str:
    return (
        f"{r['mode']:3} seed {r['seed']}  full signal {r['full']:2}/{steps} steps  "
        f"signal share {r['share']:4.0%}  rollouts {r['rollouts']:5}  greedy "
        f"{change(*r['greedy'])}  sampled {change(*r['sampled'])}  {r['minutes']:.1f} min"
    )


def summary(results: list[dict[str, Any]], mode: str, steps: int) -> str:
    rs = [r for r in results if r["mode"] == mode]
    if not rs:
        return ""

    def mean(f: Any) -> float:
        return statistics.fmean(f(r) for r in rs)

    return (
        f"{mode:3} mean of {len(rs)}: full signal {mean(lambda r: r['full']):.1f}/{steps}  "
        f"rollouts {mean(lambda r: r['rollouts']):.0f}  greedy gain "
        f"{gains([r['greedy'] for r in rs])}  sampled gain {gains([r['sampled'] for r in rs])}  "
        f"{mean(lambda r: r['minutes']):.1f} min"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-oversample", type=int, default=3)
    p.add_argument("--modes", nargs="+", choices=["off", "on"], default=["off", "on"])
    args = p.parse_args()
    quiet_torchao()
    import os

    print(
        f"demo recipe, {args.steps} updates, seeds {args.seeds}, filter_groups on: "
        f"max_oversample {args.max_oversample}; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="filter-groups-") as tmp:
        for seed in args.seeds:
            for mode in args.modes:
                results.append(one(mode, seed, args, Path(tmp)))
                print(line(results[-1], args.steps), flush=True)
    for mode in args.modes:
        print(summary(results, mode, args.steps))
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
