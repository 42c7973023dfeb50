"""The run's memory self-check: resident memory that keeps rising after the warm-up.

The first updates of a process and its first eval raise the process's high-water marks (the
engine's KV cache at full concurrency, the allocator's arenas, the tokenizer's and
template's caches), so growth over them says little. After the process's first
``warmup`` updates (a resumed run's too), the growth per update is the Theil-Sen slope
of every update's resident memory: the median of the slopes between every two updates.
Once ``min_points`` updates lie past the warm-up and that slope exceeds ``warn_mib``,
and still does ``min_points`` updates later, the run logs one warning naming the figure
and ``benchmarks/soak.py`` (the benchmark that finds what grows), once per run.

Why a median and not least squares: resident memory jumps by tens of MiB for a few
updates and comes back (an eval's hundreds of rollouts, the allocator handing pages back
late). A least-squares line through 20 updates tilts with such a jump wherever it falls
near an end: a warm ``tether demo --steps 40`` whose memory read 611.8 MiB after update
21 and 612.9 after update 40, with +-43 MiB jumps between, printed +0.46 +- 0.68 MiB per
update. The median of the pairwise slopes ignores jumps that come and go (up to about
29% of the points) and still follows memory that really grows, which moves every pair.

The second look is for long jumps: an eval that lifts memory for a few updates at the end
of a short line still reads as growth (an async soak measured 1.53 MiB per update by least
squares over updates 21-41, an eval at 40, and 0.07 over 300). Memory that really grows
still grows ``min_points`` updates on.

To stay bounded over thousands of updates the check keeps at most ``2 * keep`` of the
figures: when it has that many it keeps every other one, and from then on every second
update's (then fourth, ...), so the points stay evenly spread over the run.
"""

from __future__ import annotations

import math

__all__ = ["MemoryWatch"]

SOAK = "benchmarks/soak.py"


class MemoryWatch:
    """Fed each update's resident MiB; :meth:`add` returns the warning line once. What it
    holds is bounded (at most ``2 * keep`` figures), not the run's length."""

    def __init__(self, warn_mib: float, warmup: int, min_points: int = 20, keep: int = 100):
        self.warn_mib, self.warmup, self.min_points = warn_mib, warmup, min_points
        self.keep = keep
        self.seen = 0  # updates fed, warm-up included
        self.n = 0  # updates past the warm-up
        self.points: list[tuple[float, float]] = []  # (step, MiB), thinned (module docstring)
        self.stride = 1
        self.first_mib = math.nan
        self.suspect_at: int | None = None  # n when the slope first went over warn_mib
        self.warned = False

    def add(self, step: int, mib: float) -> str | None:
        """Record update ``step``'s resident memory; the warning line the first time the
        slope past the warm-up exceeds ``warn_mib`` (0 turns the check off)."""
        self.seen += 1
        if self.seen <= self.warmup:
            return None
        self._fold(float(step), mib)
        if self.warned or not self.warn_mib or self.n < self.min_points:
            return None
        slope = self.slope()
        if not slope > self.warn_mib:
            self.suspect_at = None
            return None
        if self.suspect_at is None:
            self.suspect_at = self.n
        if self.n < self.suspect_at + self.min_points:  # look again (module docstring)
            return None
        self.warned = True
        return (
            f"resident memory grows {slope:.2f} MiB per update after the first {self.warmup} "
            f"({self.first_mib:.0f} -> {mib:.0f} MiB by update {step}; "
            f"trainer.memory_warn_mib is {self.warn_mib:g}): something the run keeps grows "
            f"with it; {SOAK} measures what"
        )

    def _fold(self, x: float, y: float) -> None:
        if self.n == 0:
            self.first_mib = y
        self.n += 1
        if (self.n - 1) % self.stride:
            return
        self.points.append((x, y))
        if len(self.points) >= 2 * self.keep:
            self.points = self.points[::2]
            self.stride *= 2

    def slope(self) -> float:
        """MiB per update over the updates past the warm-up so far: the median of the
        slopes between every two of the points kept (NaN under 2)."""
        return theil_sen(self.points)


def theil_sen(points: list[tuple[float, float]]) -> float:
    """The median of ``(y2 - y1) / (x2 - x1)`` over every pair of points with x1 < x2
    (NaN with no such pair)."""
    slopes = sorted(
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    )
    if not slopes:
        return math.nan
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2
