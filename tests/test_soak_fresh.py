"""benchmarks/_soak_fresh.py (``soak.py --vs-fresh``): where the fresh run's blocks start
and the order of the turns. The soak itself takes minutes on the warm starter; it is run
by hand (benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_soak_fresh", ROOT / "benchmarks" / "_soak_fresh.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the dataclass looks its module up
    spec.loader.exec_module(module)
    return module


fresh = load()


def test_the_fresh_blocks_meet_the_same_evals_and_checkpoints() -> None:
    """300 updates, 12 blocks of 5, evals every 20, checkpoints every 50: the aged run's
    blocks are 241-300 (evals after 240, 260, 280; a checkpoint at 250), so the fresh
    run's are 41-100 (evals after 40, 60, 80; a checkpoint at 50), past a warm-up of 20."""
    assert fresh.fresh_start(240, 20, 20, 50) == 40
    for aged, warmup, evals, ckpt in [(240, 20, 20, 50), (440, 10, 30, 40), (110, 20, 10, 0),
                                      (83, 5, 7, 3), (50, 20, 0, 0)]:  # fmt: skip
        w = fresh.fresh_start(aged, warmup, evals, ckpt)
        period = math.lcm(evals or 1, ckpt or 1)
        assert w >= warmup and (aged - w) % period == 0
        assert w - period < warmup  # the first such start past the warm-up


def test_each_pair_flips_its_order() -> None:
    assert fresh.order(3) == ["aged", "fresh", "fresh", "aged", "aged", "fresh"]
    assert fresh.order(1) == ["aged", "fresh"]
