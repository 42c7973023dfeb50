"""The run's memory self-check: resident memory that keeps rising after the warm-up.

The first updates of a process and its first eval raise the process's high-water marks (the
engine's KV cache at full concurrency, the allocator's arenas, the tokenizer's and
template's caches), so growth over them says little. After the process's first
``warmup`` updates (a resumed run's too), a least-squares line through every update's
resident memory gives the growth per update;
once ``min_points`` updates lie past the warm-up and that slope exceeds ``warn_mib``,
and still does ``min_points`` updates later, the run logs one warning naming the figure
and ``benchmarks/soak.py`` (the benchmark that finds what grows), once per run.

The second look is for evals: an eval of hundreds of rollouts lifts resident memory for
a few updates after it, and at the end of a short line that reads as growth (an async
soak measured 1.53 MiB per update over updates 21-41, an eval at 40, and 0.07 over 300).
Memory that really grows still grows ``min_points`` updates on; a spike is by then in
the middle of the line, where it hardly tilts it.
"""

from __future__ import annotations

import math

__all__ = ["MemoryWatch"]

SOAK = "benchmarks/soak.py"


class MemoryWatch:
    """Fed each update's resident MiB; :meth:`add` returns the warning line once. It keeps
    running sums (Welford's), not the figures: what it holds does not grow with the run."""

    def __init__(self, warn_mib: float, warmup: int, min_points: int = 20):
        self.warn_mib, self.warmup, self.min_points = warn_mib, warmup, min_points
        self.seen = 0  # updates fed, warm-up included
        self.n = 0
        self.mean_x = self.mean_y = self.sxx = self.sxy = 0.0
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
        dx = x - self.mean_x
        self.mean_x += dx / self.n
        self.mean_y += (y - self.mean_y) / self.n
        self.sxx += dx * (x - self.mean_x)
        self.sxy += dx * (y - self.mean_y)

    def slope(self) -> float:
        """MiB per update over the updates past the warm-up so far (NaN under 2)."""
        return self.sxy / self.sxx if self.n >= 2 and self.sxx > 0 else math.nan
