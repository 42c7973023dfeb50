"""One run's sinks behind one object (metrics fanned out to each): a sink that fails never
stops the run.

:func:`open_tracking` opens the sinks the config names. One that cannot
start (its package is missing, its server is unreachable, it refuses the
login) is left out with one warning line that names the fix; the run goes on
with the others. A sink that raises later is switched off with one warning
line, also without stopping the run. The training loop calls
:meth:`Tracking.log_metrics` wherever it stores metrics (each update, each
eval) with the same step, and :meth:`Tracking.log_samples` with each update's
rollouts, which goes nowhere unless ``tracking.log_samples`` is true.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.tracking._sinks import OPENERS, Sink, SinkSpec
from tether.tracking.config import SINKS, TrackingConfig

__all__ = ["Tracking", "open_tracking", "sample_rows"]

log = logging.getLogger(__name__)

#: What to do when a sink does not start, by sink.
FIXES = {
    "tensorboard": "pip install tensorboard",
    "wandb": "run `wandb login`, or set WANDB_MODE=offline to keep the run on this machine",
    "mlflow": "check tracking.mlflow_uri / MLFLOW_TRACKING_URI (a file: store needs "
    "MLFLOW_ALLOW_FILE_STORE=true with MLflow 3)",
}


def _why(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


class Tracking:
    """The open sinks of one run. ``Tracking([])`` tracks nothing."""

    def __init__(self, sinks: Sequence[Sink], *, log_samples: bool = False):
        self.sinks = list(sinks)
        self.samples_on = log_samples

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sinks]

    def _each(self, what: str, step: int | None, call: Any) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:  # a sink's fault is never the run's
                self.sinks.remove(sink)
                at = f" at step {step}" if step is not None else ""
                log.warning(
                    "tracking: %s failed%s while %s (%s); it is off for the rest of the run",
                    sink.name,
                    at,
                    what,
                    _why(exc),
                )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        self._each("logging metrics", step, lambda s: s.log_metrics(step, values))

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Send ``rows`` (:func:`sample_rows`) only when ``tracking.log_samples`` is true."""
        if self.samples_on and rows:
            self._each("logging samples", step, lambda s: s.log_samples(step, rows))

    def close(self, failed: bool = False) -> None:
        """Close every sink; ``failed``: the run ended with an error (W&B and MLflow mark it)."""
        self._each("closing", None, lambda s: s.close(failed))
        self.sinks = []


def open_tracking(
    cfg: TrackingConfig, run_dir: Path, run_name: str, config: dict[str, Any]
) -> Tracking:
    """Open the sinks ``cfg`` names for the run in ``run_dir``; ``config`` (the store's copy of
    the run config, secrets redacted) goes to each as hyperparameters."""
    spec = SinkSpec(cfg, Path(run_dir), run_name, config)
    sinks: list[Sink] = []
    for name in cfg.sinks:
        try:
            sinks.append(OPENERS[name](spec))
        except ImportError as exc:
            log.warning(
                "tracking: %s is not installed (%s); the run goes on without it "
                "(fix: pip install %s, or drop it from tracking)",
                name,
                _why(exc),
                SINKS[name],
            )
        except Exception as exc:  # a server down, a login missing: the run still trains
            log.warning(
                "tracking: %s did not start (%s); the run goes on without it (fix: %s)",
                name,
                _why(exc),
                FIXES[name],
            )
    return Tracking(sinks, log_samples=cfg.log_samples)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else str(value)


def sample_rows(outcomes: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per rollout (``RolloutOutcome``-like: ``rollout_id``, ``reward``, ``success``,
    ``final_answer``, ``calls``): the last call's last prompt message and its completion."""
    rows = []
    for o in outcomes:
        last = max(o.calls, key=lambda c: c.seq) if o.calls else None
        messages = (last.request.get("messages") or []) if last else []
        reply = (last.response or {}) if last else {}
        completion = reply.get("content")
        if reply.get("tool_calls"):
            completion = f"{_text(completion)} {reply['tool_calls']}".strip()
        rows.append(
            {
                "rollout": o.rollout_id,
                "reward": o.reward,
                "success": bool(o.success),
                "prompt": _text(messages[-1].get("content")) if messages else "",
                "completion": _text(completion),
                "answer": _text(o.final_answer),
            }
        )
    return rows
