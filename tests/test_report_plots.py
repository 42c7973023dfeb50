"""The reward curve (``tether demo``/``train``) and the report's charts: the legend sits
below the axes, where it covers no curve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tether.cli._progress import _curve_figure
from tether.tracking._report import _figure

plt = pytest.importorskip("matplotlib.pyplot")


def _apart(fig) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))  # not over the curves
    assert not legend.overlaps(ax.xaxis.label.get_window_extent(renderer))
    assert not any(legend.overlaps(t.get_window_extent(renderer)) for t in ax.get_xticklabels())
    plt.close(fig)


def test_the_reward_curves_legend_is_below_the_curves() -> None:
    rows = [SimpleNamespace(step=i, metrics={"reward_mean": i / 20}) for i in range(20)]
    evals = [SimpleNamespace(step=s, sampled=0.2 + s / 40, greedy=0.4 + s / 40) for s in (0, 20)]
    _apart(_curve_figure(plt, rows, evals))


def test_the_reports_legends_are_below_their_charts() -> None:
    xs = list(range(1, 11))
    series = [(f"series {i}", xs, [x * (i + 1) / 10 for x in xs]) for i in range(4)]
    _apart(_figure(plt, "reward", series))
    _apart(_figure(plt, "held-out", [("held-out success (sampled)", [0, 5], [0.2, 0.4])]))
