"""The run's memory self-check (tether/run/_memwatch.py) against a plain loop over every
pair of updates, and its one warning."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import small_run
from tether.run._memwatch import MemoryWatch


def _median_slope_by_loop(xs: list[float], ys: list[float]) -> float:
    """Theil-Sen by the book: every pair's slope, then their median."""
    slopes = []
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            slopes.append((ys[j] - ys[i]) / (xs[j] - xs[i]))
    return statistics.median(slopes)


def _least_squares_by_loop(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    num = n * sum(x * y for x, y in zip(xs, ys, strict=True)) - sum(xs) * sum(ys)
    return num / (n * sum(x * x for x in xs) - sum(xs) ** 2)


def test_the_slope_is_the_median_of_every_pairs_slope() -> None:
    rng = random.Random(0)
    watch = MemoryWatch(warn_mib=0, warmup=5)
    xs, ys = [], []
    for step in range(1, 151):
        mib = 600 + 0.37 * step + rng.gauss(0, 4)
        watch.add(step, mib)
        if step > 5:
            xs.append(float(step))
            ys.append(mib)
    assert len(watch.points) == 145  # under 2 * keep: every update is kept
    assert watch.slope() == pytest.approx(_median_slope_by_loop(xs, ys), rel=1e-12)
    assert watch.slope() == pytest.approx(0.37, abs=0.03)


def test_jumps_that_come_and_go_do_not_tilt_it_as_they_tilt_least_squares() -> None:
    """Flat at 612 MiB over updates 21-40 but for +43 MiB over the last five (an eval
    near the end; the warm demo-40's jumps were this size): least squares reads growth."""

    def rss(step: int) -> float:
        return 612 + (43 if step >= 36 else 0)

    watch = MemoryWatch(warn_mib=0, warmup=20)
    for s in range(1, 41):
        watch.add(s, rss(s))
    xs = [float(s) for s in range(21, 41)]
    assert _least_squares_by_loop(xs, [rss(int(x)) for x in xs]) > 0.9
    assert watch.slope() == 0.0


def test_what_it_keeps_is_bounded_and_evenly_spread() -> None:
    watch = MemoryWatch(warn_mib=0, warmup=0, keep=10)
    for step in range(1, 1001):
        watch.add(step, 500 + 0.2 * step)
    assert len(watch.points) < 20
    gaps = {b[0] - a[0] for a, b in zip(watch.points, watch.points[1:], strict=False)}
    assert len(gaps) == 1  # one stride between every two kept points
    assert watch.points[0][0] == 1 and watch.points[-1][0] > 900
    assert watch.slope() == pytest.approx(0.2)


def test_growth_after_the_warm_up_warns_once_naming_the_figure_and_the_benchmark() -> None:
    watch = MemoryWatch(warn_mib=1.0, warmup=10, min_points=20)
    lines = []
    for step in range(1, 101):
        # the warm-up's jump (first eval) is left out; then 1.5 MiB per update
        mib = 500 + (300 if step > 3 else 0) + (1.5 * (step - 10) if step > 10 else 0)
        lines.append(watch.add(step, mib))
    said = [(i + 1, line) for i, line in enumerate(lines) if line]
    assert len(said) == 1
    step, line = said[0]
    assert step == 50  # over the bound at the 20th update past the warm-up, and 20 later
    assert line.startswith("resident memory grows 1.50 MiB per update after the first 10 ")
    assert "trainer.memory_warn_mib is 1" in line and "benchmarks/soak.py" in line


@pytest.mark.parametrize("warn", [0.0, 2.0])
def test_no_warning_when_off_or_under_the_bound(warn: float) -> None:
    watch = MemoryWatch(warn_mib=warn, warmup=10)
    assert not any(watch.add(s, 500 + 900 * (s <= 10) + 1.5 * s) for s in range(1, 200))
    assert math.isclose(watch.slope(), 1.5)


def test_an_evals_spike_at_the_end_of_the_first_look_does_not_warn() -> None:
    """What the async soak showed: flat memory, an eval at update 40 that lifts it by
    80 MiB for three updates. Over updates 21-41 that is 1.5 MiB per update; 20 updates
    on it is not, and nothing is said. A leak of the same size is said at update 61."""

    def flat_with_spike(step: int) -> float:
        return 620 + (80 if 41 <= step <= 43 else 0)

    watch = MemoryWatch(warn_mib=1.0, warmup=20, min_points=20)
    lines = [watch.add(s, flat_with_spike(s)) for s in range(1, 301)]
    assert not any(lines)
    leak = MemoryWatch(warn_mib=1.0, warmup=20, min_points=20)
    said = [s for s in range(1, 301) if leak.add(s, 620 + 1.5 * s)]
    assert said == [60]


def test_a_flat_run_after_a_warm_up_jump_does_not_warn() -> None:
    """The demo's first-to-last figure counts the first eval's jump as growth; this does not."""
    watch = MemoryWatch(warn_mib=0.3, warmup=10)
    assert not any(watch.add(s, 650 + (240 if s >= 10 else 0)) for s in range(1, 81))
    assert watch.slope() == pytest.approx(0.0, abs=1e-9)


def test_a_run_whose_memory_keeps_rising_logs_the_warning(
    starter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Wired into the run: each update's resident memory reaches the check (here a
    stand-in figure rising 10 MiB per update, past a 1-update warm-up, with 2 points
    enough for each look: over the bound at update 3, still at update 5), and the warning
    is logged by the run."""
    from tether.run import RolloutConfig, TrainerConfig, TrainingRun, _loop

    rising = iter(range(500, 10_000, 10))
    monkeypatch.setattr(_loop, "resident_mb", lambda: float(next(rising)))
    monkeypatch.setattr(_loop, "MemoryWatch", functools.partial(MemoryWatch, min_points=2))
    cfg = small_run(
        tmp_path, "memory", "tests.test_async:short_calc_agent",
        rollout=RolloutConfig(n=2, batch_groups=1, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=5, lr=1e-4, memory_warn_mib=5, memory_warmup=1),
    )  # fmt: skip

    async def go() -> None:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()

    with caplog.at_level(logging.WARNING, logger="tether.run._loop"):
        asyncio.run(go())
    said = [r.getMessage() for r in caplog.records if "resident memory grows" in r.getMessage()]
    assert said == [
        "resident memory grows 10.00 MiB per update after the first 1 (510 -> 540 MiB by "
        "update 5; trainer.memory_warn_mib is 5): something the run keeps grows with it; "
        "benchmarks/soak.py measures what"
    ]
