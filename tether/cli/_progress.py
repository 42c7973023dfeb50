"""The live progress display of ``tether train`` and ``tether demo``, and the reward curve."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from tether.run import (
    CheckpointSaved,
    EvalDone,
    EvalProgress,
    EvalStart,
    Resumed,
    RunEvent,
    Status,
    StepDone,
)

if TYPE_CHECKING:
    from tether.run import EvalResult

__all__ = ["NOISY_IMPORTS", "Progress", "plot_curve", "quiet_imports", "quiet_loading"]

#: Loggers that speak when transformers is imported: it imports torchao (when installed)
#: with any model class, and on a CPU-only torch torchao logs that its CUDA kernels
#: (``_C_mxfp8…so``, cutlass) did not load, and torch logs a ``_pytree`` deprecation
#: notice for each of torchao's enums. Nothing tether uses; errors still show.
NOISY_IMPORTS = ("torchao", "torch.utils._pytree")


def quiet_imports() -> None:
    """Silence :data:`NOISY_IMPORTS` below errors; before transformers is first imported
    (every ``tether`` command calls it first). Imports nothing itself."""
    import logging

    for name in NOISY_IMPORTS:
        logging.getLogger(name).setLevel(logging.ERROR)


def quiet_loading() -> None:
    """No per-file progress bars from transformers while a command loads a model, and
    none of the import notices of :func:`quiet_imports`."""
    quiet_imports()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


class Progress:
    """Receives the training run's events (``tether.run.RunEvent``) and keeps a live table
    on the terminal.

    Each step shows ``H``, the mean entropy (nats) of the sampling distribution over
    the trained tokens (falling: the policy sharpens), and ``zero-var``, the share
    of groups whose rollouts all got the same reward (they teach nothing); the
    other diagnostics are in the store (``tether.run._diagnostics``).

    Steps are the run's one numbering: ``step N/T`` is the N-th update; the eval before
    training is at step 0, the one after update N at step N.
    """

    def __init__(self, total_steps: int, console: Console | None = None, *, live: bool = True):
        self.total = total_steps
        self.console = console or Console()
        self.rows: list[Any] = []
        self.evals: list[Any] = []
        self.t0 = time.monotonic()
        self.step_times: list[float] = []
        self._eval: list[Any] | None = None  # [EvalStart, attempts done, t0, next quarter]
        self._live = (
            Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            if live and self.console.is_terminal
            else None
        )

    def __enter__(self) -> Progress:
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def _print(self, msg: str) -> None:
        (self._live.console if self._live else self.console).print(
            msg, highlight=False, soft_wrap=True, markup=False
        )

    def _eval_tick(self) -> None:
        if self._eval is None:
            return
        self._eval[1] += 1
        start, done, t0, quarter = self._eval
        if not self._live and quarter <= 3 and done >= start.rollouts * quarter / 4:
            self._print(  # the share done, not the quarter passed: 2/6 is 33%
                f"  eval: {done}/{start.rollouts} rollouts ({done / start.rollouts:.0%}), "
                f"{time.monotonic() - t0:.0f} s"
            )
            while self._eval[3] <= 3 and done >= start.rollouts * self._eval[3] / 4:
                self._eval[3] += 1  # one line even when a tick passes several quarters

    def __call__(self, event: RunEvent) -> None:
        match event:
            case Status(text):
                self._print(text)
            case EvalStart() as start:
                self._eval = [start, 0, time.monotonic(), 1]
                self._print(
                    f"evaluating at step {start.step}: {start.what} ({start.rollouts} rollouts)…"
                )
            case EvalProgress():
                self._eval_tick()
            case StepDone(report):
                self.rows.append(report)
                self.step_times.append(report.metrics.get("step_s", 0.0))
                if not self._live:
                    self.console.print(self._line(report), highlight=False, soft_wrap=True)
            case EvalDone(result):
                self._eval = None
                self.evals.append(result)
                self._say(_eval_line(result), soft_wrap=True)
            case Resumed(at):
                self._say(f"resumed from {at.path}: step {at.step + 1}/{self.total} next")
            case CheckpointSaved(_, path):
                self._say(f"checkpoint: {path}")
        if self._live:
            self._live.update(self._render())

    def _say(self, msg: str, **kw: Any) -> None:
        (self._live.console if self._live else self.console).print(msg, highlight=False, **kw)

    def _eta(self) -> str:
        if not self.step_times:
            return "-"
        recent = self.step_times[-5:]
        left = (self.total - self.rows[-1].step) * sum(recent) / len(recent)  # resume-proof
        return f"{left / 60:.1f} min"

    def _line(self, r: Any) -> str:
        m = r.metrics
        return (
            f"step {r.step:>3}/{self.total}  reward {m['reward_mean']:.3f}  success {m['success']:.0%}  "
            f"H {_num(m, 'entropy', '.2f')}  zero-var {_num(m, 'zero_variance_frac', '.0%')}  "
            f"{_groups(m)}gen {m['gen_tokens_per_s']:.0f} tok/s  gap {_gap(m)}  "
            f"v{int(m['policy_version'])}  {m['step_s']:.1f} s/step  left {self._eta()}"
        )

    def _render(self) -> Group:
        table = Table(title="tether: training", expand=False)
        for col in (
            "step",
            "reward",
            "success",
            "entropy",
            "zero-var",
            "gen tok/s",
            "logprob gap",
            "merged",
            "dropped",
            "policy",
            "s/step",
        ):
            table.add_column(col, justify="right")
        for r in self.rows[-12:]:
            m = r.metrics
            table.add_row(
                f"{r.step}/{self.total}",
                f"{m['reward_mean']:.3f}",
                f"{m['success']:.0%}",
                _num(m, "entropy", ".2f"),
                _num(m, "zero_variance_frac", ".0%"),
                f"{m['gen_tokens_per_s']:.0f}",
                _gap(m),
                f"{m.get('merge_fraction', 0):.0%}",
                f"{int(m['groups_dropped'])}",
                f"v{int(m['policy_version'])}",
                f"{m['step_s']:.1f}",
            )
        elapsed = (time.monotonic() - self.t0) / 60
        footer = Table.grid()
        footer.add_row(f"elapsed {elapsed:.1f} min   time left ≈ {self._eta()}")
        if self._eval is not None:
            start, done = self._eval[0], self._eval[1]
            footer.add_row(f"evaluating at step {start.step}: {done}/{start.rollouts} rollouts")
        return Group(table, footer)


def _groups(m: dict[str, float]) -> str:
    """With rollout.filter_groups: ``groups 8 kept 5 flat +16 rollouts  `` (the groups
    trained, those dropped for equal rewards, the extra rollouts sampled); else nothing."""
    if "groups_kept" not in m:
        return ""
    extra = int(m.get("rollouts_extra", 0))
    return (
        f"groups {int(m['groups_kept'])} kept {int(m.get('groups_no_signal', 0))} flat "
        f"+{extra} rollouts  "
    )


def _eval_line(r: EvalResult) -> str:
    greedy = "-" if r.greedy is None else f"{r.greedy:.0%}"
    reward = f"mean reward {_reward(r.sampled_reward)}"
    if r.greedy_reward is not None:
        reward += f" (greedy {_reward(r.greedy_reward)})"
    return (
        f"eval @ step {r.step}: sampled success {r.sampled:.0%}, greedy {greedy}, {reward} "
        f"({r.tasks} held-out tasks, {r.rollouts} rollouts, {r.wall_s:.0f} s)"
    )


def _reward(value: float) -> str:
    """A held-out mean reward, or "-" when no rollout had a usable one."""
    return "-" if math.isnan(value) else f"{value:.3g}"


def _num(m: dict[str, float], key: str, spec: str) -> str:
    """``m[key]`` formatted, or "-" when the step has no such value (e.g. ``entropy``
    when every group had zero reward variance and no update ran)."""
    value = m.get(key, math.nan)
    return "-" if math.isnan(value) else format(value, spec)


def _gap(m: dict[str, float]) -> str:
    """The logprob gap, or "-" when the step had no update to measure it on."""
    gap = m.get("logprob_gap", math.nan)
    return "-" if math.isnan(gap) else f"{gap:.1e}"


def plot_curve(rows: list[Any], evals: list[Any], path: Path) -> Path | None:
    """Reward per step and held-out success to a PNG; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = _curve_figure(plt, rows, evals)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight": the legend below the axes
    plt.close(fig)
    return path


def _curve_figure(plt: Any, rows: list[Any], evals: list[Any]) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4.4))
    steps = [r.step for r in rows]
    ax.plot(
        steps,
        [r.metrics["reward_mean"] for r in rows],
        label="train reward (mean of batch)",
        alpha=0.6,
    )
    if len(rows) >= 5:
        k = 5
        vals = [r.metrics["reward_mean"] for r in rows]
        smooth = [
            sum(vals[max(0, i - k + 1) : i + 1]) / len(vals[max(0, i - k + 1) : i + 1])
            for i in range(len(vals))
        ]
        ax.plot(steps, smooth, label="train reward (5-step mean)", linewidth=2)
    if evals:
        ax.plot(
            [e.step for e in evals],
            [e.sampled for e in evals],
            "o-",
            label="held-out success (sampled)",
        )
        if all(e.greedy is not None for e in evals):
            ax.plot(
                [e.step for e in evals],
                [e.greedy for e in evals],
                "s--",
                label="held-out success (greedy)",
            )
    ax.set_xlabel("update")
    ax.set_ylabel("reward / success")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    # below the axes, never over the curves (a rising reward runs into any corner)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    ax.set_title("tether: reward while training")
    fig.tight_layout()
    return fig
