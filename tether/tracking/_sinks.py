"""The sinks: TensorBoard event files, Weights & Biases, MLflow.

Each sink is built by ``open_<name>(spec)`` (:class:`SinkSpec` says what of
the run it needs) and has three methods, all called with the store's step
numbers (the run's one numbering: update N at step N from 1, evals at 0 and N)::

    log_metrics(step, {name: value})   # a train step's metrics, or an eval's eval/*
    log_samples(step, rows)             # only with tracking.log_samples
    close(failed)                       # failed: the run ended with an error

A sink imports its package when it opens, so a missing package is an
:class:`ImportError` there (:mod:`._fanout` turns it into one line). Metric names
are the store's; a name without a ``/`` gets ``train/`` in front
(``reward_mean`` -> ``train/reward_mean``; ``eval/sampled_success`` stays), so
the dashboards group train and eval curves (:func:`metric_tag`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether.tracking.config import TrackingConfig

__all__ = [
    "OPENERS",
    "MlflowSink",
    "Sink",
    "SinkSpec",
    "TensorBoardSink",
    "WandbSink",
    "flatten_config",
    "metric_tag",
]

#: The columns of a ``log_samples`` row (see :func:`tether.tracking._fanout.sample_rows`).
SAMPLE_COLUMNS = ("rollout", "reward", "success", "prompt", "completion", "answer")


class Sink(Protocol):
    name: str

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


@dataclass(frozen=True)
class SinkSpec:
    cfg: TrackingConfig
    run_dir: Path  # the run folder (runs/NAME)
    run_name: str  # the run's store record id
    config: dict[str, Any]  # the run config as the store holds it (secrets redacted)


def metric_tag(name: str) -> str:
    """The sink's name of store metric ``name``: ``train/`` in front unless it has a ``/``."""
    return name if "/" in name else f"train/{name}"


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trainer": {"lr": 1e-3}}`` -> ``{"trainer.lr": 1e-3}``; values other than
    bool/int/float/str become their JSON text (lists, None)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, name + "."))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


# -- TensorBoard -----------------------------------------------------------------------


class TensorBoardSink:
    """Event files in ``{run folder}/tensorboard`` (torch's ``SummaryWriter``)."""

    name = "tensorboard"

    def __init__(self, spec: SinkSpec):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.dir = spec.run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir))
        params = flatten_config(spec.config)
        # The config as hyperparameters (the HPARAMS tab) in this run's own event file,
        # not in a sub-run as SummaryWriter.add_hparams writes them.
        events: Any = self.writer.file_writer  # set by SummaryWriter.__init__
        for summary in hparams(params, {"eval/sampled_success": 0.0}):
            events.add_summary(summary)
        self.writer.add_text("config", _code_block(json.dumps(spec.config, indent=2)), 0)
        self.writer.flush()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(metric_tag(name), value, step)
        self.writer.flush()  # a TensorBoard watching the folder sees each step at once

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", _markdown_table(rows), step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


def _code_block(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())  # markdown: verbatim


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")[:500]

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in SAMPLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


# -- Weights & Biases --------------------------------------------------------------------


class WandbSink:
    """A W&B run (``wandb.init``): online, or offline with ``WANDB_MODE=offline``; its local
    files go under the run folder (``{run folder}/wandb``)."""

    name = "wandb"

    def __init__(self, spec: SinkSpec):
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=spec.cfg.project,
            entity=spec.cfg.wandb_entity or None,
            name=spec.run_name,
            config=spec.config,
            dir=str(spec.run_dir),
            reinit="create_new",  # several runs in one process (tests, notebooks)
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({metric_tag(k): v for k, v in metrics.items()}, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        data: list[Any] = [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]
        self.run.log(
            {"samples": self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=data)}, step=step
        )

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


# -- MLflow ------------------------------------------------------------------------------


class MlflowSink:
    """An MLflow run in experiment ``tracking.project`` (``MlflowClient``: no global active
    run), at ``tracking.mlflow_uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's default."""

    name = "mlflow"

    def __init__(self, spec: SinkSpec):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=spec.cfg.mlflow_uri or None)
        found = self.client.get_experiment_by_name(spec.cfg.project)
        experiment = (
            found.experiment_id if found else self.client.create_experiment(spec.cfg.project)
        )
        self.run_id = self.client.create_run(experiment, run_name=spec.run_name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flatten_config(spec.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_tag(k), float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
        self.client.log_text(self.run_id, text, f"samples/step-{step:06d}.jsonl")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


#: Sink name -> its constructor.
OPENERS: dict[str, Callable[[SinkSpec], Sink]] = {
    "tensorboard": TensorBoardSink,
    "wandb": WandbSink,
    "mlflow": MlflowSink,
}
