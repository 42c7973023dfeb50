"""Does the search agent learn on the CPU, and which credit learns faster: trajectory or turn?

Each run is ``examples/search/config.yaml`` (the search-warmed starter, made by
``examples/search/warmup.py``, answering questions with a BM25 search tool over several
turns) for ``--steps`` updates, once with ``trainer.credit=trajectory`` and once with
``trainer.credit=turn``, per seed, interleaved (seed 0 trajectory, seed 0 turn, seed 1
trajectory, …) so that the machine's load falls on both alike. Held-out evals of the 40
val questions (greedy and 4 samples each) before and after. Printed per run: greedy and
sampled success before → after, the share of greedy runs that search before answering
(the habit the warm-up left, which RL has to break) and the wall time; then the mean and
spread per credit.

    .venv/bin/python benchmarks/search_credit.py [--steps 20] [--seeds 0 1 2]
        [--credits trajectory turn] [--model examples/search/runs/search-starter]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _evals import change, gains  # the script's folder
from _shapes import quiet_torchao

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "search" / "config.yaml"


def config(credit: str, seed: int, args: argparse.Namespace, tmp: Path) -> Any:
    from tether.configio import load_config
    from tether.run import TrainConfig

    overrides = [
        f"name={credit}-seed{seed}",
        f"dir={tmp}",
        f"trainer.credit={credit}",
        f"trainer.seed={seed}",
        f"trainer.steps={args.steps}",
        f"eval.every={args.steps}",
        "checkpoint.every=0",
    ]
    if args.model:
        overrides.append(f"model.path={Path(args.model).resolve()}")
    return load_config(TrainConfig, CONFIG, overrides)


async def train(cfg: Any) -> tuple[list[Any], Path]:
    from tether.run import TrainingRun

    async with TrainingRun(cfg) as run:
        return await run.train(), run.run_dir


def searched_first(run_dir: Path, step: int) -> float:
    """The share of the greedy eval's rollouts at ``step`` whose first call searched (the
    habit RL has to break is answering without a search)."""
    from tether.store import Store
    from tether.tracking import place_kind

    with Store(run_dir / "traces.sqlite") as store:
        found = store.list_rollouts()
        at = [r.id for r in found if place_kind(r) == "eval_greedy" and r.place.step == step]
        first = [store.calls(i)[:1] for i in at]
    return sum(bool(c and (c[0].response or {}).get("tool_calls")) for c in first) / len(at)


def one(credit: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    evals, run_dir = asyncio.run(train(config(credit, seed, args, tmp)))
    before, after = evals[0], evals[-1]
    return dict(
        credit=credit, seed=seed, minutes=(time.monotonic() - t0) / 60,
        greedy=(before.greedy or 0.0, after.greedy or 0.0),
        sampled=(before.sampled, after.sampled),
        searched=(searched_first(run_dir, before.step), searched_first(run_dir, after.step)),
    )  # fmt: skip


def line(r: dict[str, Any]) -> str:
    f0, f1 = r["searched"]
    return (
        f"{r['credit']:10} seed {r['seed']}  greedy {change(*r['greedy'])}  sampled "
        f"{change(*r['sampled'])}  greedy searches first {f0:4.0%} -> {f1:4.0%}  "
        f"{r['minutes']:.1f} min"
    )


def summary(results: list[dict[str, Any]], credit: str) -> str:
    rs = [r for r in results if r["credit"] == credit]
    if not rs:
        return ""
    return (
        f"{credit:10} mean of {len(rs)}: greedy gain {gains([r['greedy'] for r in rs])}  "
        f"sampled gain {gains([r['sampled'] for r in rs])}  "
        f"{statistics.fmean(r['minutes'] for r in rs):.1f} min"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--credits", nargs="+", choices=["trajectory", "turn"], default=["trajectory", "turn"])  # fmt: skip
    p.add_argument("--model", default=None, help="model folder (default: the config's)")
    args = p.parse_args()
    quiet_torchao()
    print(
        f"examples/search/config.yaml, {args.steps} updates, seeds {args.seeds}; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="search-credit-") as tmp:
        for seed in args.seeds:
            for credit in args.credits:
                results.append(one(credit, seed, args, Path(tmp)))
                print(line(results[-1]), flush=True)
    for credit in args.credits:
        print(summary(results, credit))
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
