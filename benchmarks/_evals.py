"""How the learning benchmarks print held-out success: before -> after, and gains over seeds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def change(before: float, after: float) -> str:
    """``' 38% ->  81% (+43)'``: a success rate before and after, and the gain in points."""
    return f"{before:4.0%} -> {after:4.0%} ({100 * (after - before):+.0f})"


def gains(pairs: Sequence[tuple[float, float]]) -> str:
    """``'+42.5 (min +40, max +45)'``: the mean gain in points over runs, and its range."""
    points = [100 * (after - before) for before, after in pairs]
    return f"{statistics.fmean(points):+.1f} (min {min(points):+.0f}, max {max(points):+.0f})"
