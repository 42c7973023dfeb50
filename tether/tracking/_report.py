"""``tether report``: one self-contained HTML file of a run's curves and held-out table.

The curves are PNGs (matplotlib, the ``plot`` extra) embedded as base64
``data:`` URIs, so the file can be mailed or attached as it is: no scripts,
no network, no other files. Every text that comes from the store (names,
config) is HTML-escaped. The x axis is the run's step, which counts updates (as
everywhere: the store, the CLI, the dashboard): a train step's metrics at step
``N`` are those of update ``N`` (from 1); an eval at step ``N`` ran after ``N``
updates (0: before training).

A run folder's store may hold several records of one run (each ``--resume``
session adds one) and records of ``tether eval``; the report draws the
training records together, a step done twice counting as the later record's.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from tether.errors import UserError

__all__ = ["CURVES", "collect_metrics", "write_report"]

#: (title, [(store metric, label)]): the panels, each drawn when the run has its metrics.
CURVES: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "reward",
        [
            ("reward_mean", "train reward (batch mean)"),
            ("eval/sampled_reward_mean", "held-out reward (sampled, mean)"),
            ("eval/greedy_reward_mean", "held-out reward (greedy, mean)"),
        ],
    ),
    (
        "success",
        [
            ("success", "train success"),
            ("eval/sampled_success", "held-out success (sampled)"),
            ("eval/greedy_success", "held-out success (greedy)"),
        ],
    ),
    ("loss", [("loss", "loss")]),
    ("KL", [("approx_kl", "approx KL (k3)"), ("kl_ref", "KL to the reference")]),
    ("grad norm", [("grad_norm", "grad norm")]),
    ("logprob gap", [("logprob_gap", "|engine - trainer| logprob, mean")]),
]


def _is_training(config: dict[str, Any]) -> bool:
    extra = config.get("extra")
    return not (isinstance(extra, dict) and extra.get("command") == "eval")


def collect_metrics(store: Any) -> tuple[list[Any], dict[int, dict[str, float]]]:
    """(the store's training run records, oldest first; metrics by step, the later record
    winning a step both hold)."""
    runs = sorted(
        (r for r in store.list_runs() if _is_training(r.config)), key=lambda r: r.created_at
    )
    by_step: dict[int, dict[str, float]] = {}
    for run in runs:
        mine: dict[int, dict[str, float]] = {}
        for m in store.metrics(run.id):
            mine.setdefault(m.step, {})[m.name] = m.value
        for step, values in mine.items():
            train = {k: v for k, v in values.items() if not k.startswith("eval/")}
            ev = {k: v for k, v in values.items() if k.startswith("eval/")}
            old = by_step.setdefault(step, {})
            if train:  # a later session's step replaces the earlier session's
                for k in [k for k in old if not k.startswith("eval/")]:
                    del old[k]
            if ev:
                for k in [k for k in old if k.startswith("eval/")]:
                    del old[k]
            old.update(values)
    return runs, dict(sorted(by_step.items()))


def _points(by_step: dict[int, dict[str, float]], name: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for step, values in by_step.items():
        v = values.get(name)
        if v is not None and math.isfinite(v):
            xs.append(step)
            ys.append(v)
    return xs, ys


def _png(plt: Any, title: str, series: list[tuple[str, list[int], list[float]]]) -> str:
    fig = _figure(plt, title, series)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")  # keeps the legend below
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(plt: Any, title: str, series: list[tuple[str, list[int], list[float]]]) -> Any:
    """One chart; its legend below the axes, where it never covers a curve."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, xs, ys in series:
        evals = label.startswith("held-out")
        ax.plot(xs, ys, "o-" if evals or len(xs) < 3 else "-", label=label, markersize=4)
    ax.set_title(title)
    ax.set_xlabel("update")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(series), 3) or 1,
        fontsize=8, frameon=False,
    )  # fmt: skip
    fig.tight_layout()
    return fig


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.1%}"


def _reward(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _held_out(by_step: dict[int, dict[str, float]]) -> str:
    evals = [(s, v) for s, v in by_step.items() if "eval/sampled_success" in v]
    if not evals:
        return "<p>No held-out eval in this run (eval.enabled was false).</p>"
    rows = []
    first = evals[0][1]
    for step, v in evals:
        gain = (v["eval/sampled_success"] - first["eval/sampled_success"]) * 100
        rows.append(
            f"<tr><td>{step}</td><td>{_pct(v.get('eval/sampled_success'))}</td>"
            f"<td>{_pct(v.get('eval/greedy_success'))}</td>"
            f"<td>{_reward(v.get('eval/sampled_reward_mean'))}</td>"
            f"<td>{_reward(v.get('eval/greedy_reward_mean'))}</td><td>{gain:+.1f}</td>"
            f"<td>{int(v.get('eval/tasks', 0))}</td><td>{int(v.get('eval/rollouts', 0))}</td></tr>"
        )
    before, after = evals[0], evals[-1]
    line = (
        f"held-out success: before {_pct(before[1]['eval/sampled_success'])} (update {before[0]}) "
        f"-> after {_pct(after[1]['eval/sampled_success'])} (update {after[0]})"
    )
    head = (
        "<tr><th>after update</th><th>sampled success</th><th>greedy success</th>"
        "<th>mean reward (sampled)</th><th>mean reward (greedy)</th>"
        "<th>points vs first</th><th>tasks</th><th>rollouts</th></tr>"
    )
    return f"<p>{html.escape(line)}</p><table>{head}{''.join(rows)}</table>"


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "img{margin:4px;border:1px solid #eee}pre{background:#f6f6f6;padding:1em;overflow:auto}"
)


def write_report(store: Any, out: Path, name: str) -> Path:
    """Write the report of the run in ``store`` (named ``name``) to ``out``; returns ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("tether report needs matplotlib: pip install 'tether[plot]'") from None
    runs, by_step = collect_metrics(store)
    if not runs:
        raise UserError(
            "this store holds no training run: pass a run folder that `tether train` wrote"
        )
    images = []
    for title, names in CURVES:
        series = [(label, *_points(by_step, n)) for n, label in names]
        series = [s for s in series if s[1]]
        if series:
            png = _png(plt, title, series)
            alt = html.escape(title, quote=True)
            images.append(f'<img alt="{alt}" src="data:image/png;base64,{png}">')
    last = runs[-1]
    when = dt.datetime.fromtimestamp(runs[0].created_at).strftime("%Y-%m-%d %H:%M")
    model = last.config.get("model")
    model = model.get("path") if isinstance(model, dict) else model
    steps = [s for s, v in by_step.items() if any(not k.startswith("eval/") for k in v)]
    info = (
        f"records {', '.join(r.id for r in runs)}; status {last.status.value}; model {model}; "
        f"{len(steps)} updates; started {when}"
    )
    config = json.dumps(last.config, indent=2, default=str)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>tether report: {html.escape(name)}</title><style>{STYLE}</style></head><body>"
        f"<h1>tether run {html.escape(name)}</h1><p>{html.escape(info)}</p>"
        f"<h2>Held-out success</h2>{_held_out(by_step)}"
        f"<h2>Curves</h2><div>{''.join(images) or '<p>No update metrics yet.</p>'}</div>"
        f"<h2>Config</h2><pre>{html.escape(config)}</pre></body></html>\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out
