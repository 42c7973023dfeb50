"""The run's end line on memory (``memory_line``): the growth per update the run's memory
check fitted past its warm-up, not the first eval's jump spread over the run."""

from __future__ import annotations

from types import SimpleNamespace

from tether.cli._train_run import memory_line
from tether.run import MemoryWatch, StepReport


def _run(rss: list[float], warmup: int) -> SimpleNamespace:
    watch = MemoryWatch(warn_mib=0, warmup=warmup)
    history = []
    for step, mib in enumerate(rss, start=1):
        watch.add(step, mib)
        history.append(StepReport(step, {"rss_mb": mib}))
    return SimpleNamespace(history=history, memory=watch)


def test_the_line_gives_the_slope_past_the_warm_up() -> None:
    # a 100 MiB jump at update 5 (the first eval), then 0.25 MiB per update
    rss = [500.0 + (100 if s >= 5 else 0) + 0.25 * s for s in range(1, 41)]
    line = memory_line(_run(rss, warmup=10))  # type: ignore[arg-type]
    assert line == (
        "memory: 500 MiB after update 1, 610 MiB after update 40 "
        "(+0.25 MiB per update after the first 10)"
    )


def test_a_run_too_short_for_the_warm_up_gives_first_to_last() -> None:
    line = memory_line(_run([500.0, 504.0, 512.0], warmup=20))  # type: ignore[arg-type]
    assert line == "memory: 500 MiB after update 1, 512 MiB after update 3 (+6.00 MiB per update)"
