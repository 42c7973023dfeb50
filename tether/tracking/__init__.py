"""Watching a run: its metrics to TensorBoard, W&B or MLflow; its store exported and reported.

- :class:`TrackingConfig` (``config.py``): the run config's ``tracking`` section;
- :func:`open_tracking` / :class:`Tracking` (``_hub.py``): the sinks of one run
  (``_sinks.py``), each of which may fail without stopping the run;
- :func:`export_attempts` / :func:`write_rows` (``_export.py``): one row per
  rollout attempt, to JSONL or Parquet (docs/export.md);
- :func:`step_samples` (``_steps.py``): the training samples of one update,
  rebuilt from the stored calls with the trainer's own functions;
- :func:`write_report` (``_report.py``): a self-contained HTML page of the curves
  and the held-out table;
- :func:`run_tensorboard` (``_tensorboard.py``): ``tether tensorboard``.

It reads the store and never writes it. Importing the package loads neither
torch nor any sink's package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports
from tether.tracking.config import SINKS, TrackingConfig, normalize_tracking

if TYPE_CHECKING:
    from tether.tracking._export import (
        CALL_FIELDS,
        EXPORT_FORMATS,
        ROW_FIELDS,
        SAMPLE_FIELDS,
        export_attempts,
        write_rows,
    )
    from tether.tracking._hub import Tracking, open_tracking, sample_rows
    from tether.tracking._report import write_report
    from tether.tracking._sinks import (
        MlflowSink,
        Sink,
        SinkSpec,
        TensorBoardSink,
        WandbSink,
        flatten_config,
        metric_tag,
    )
    from tether.tracking._steps import StepSamples, step_samples, training_sample_rows
    from tether.tracking._tensorboard import run_tensorboard

__all__ = [
    "CALL_FIELDS",
    "EXPORT_FORMATS",
    "ROW_FIELDS",
    "SAMPLE_FIELDS",
    "SINKS",
    "MlflowSink",
    "Sink",
    "SinkSpec",
    "StepSamples",
    "TensorBoardSink",
    "Tracking",
    "TrackingConfig",
    "WandbSink",
    "export_attempts",
    "flatten_config",
    "metric_tag",
    "normalize_tracking",
    "open_tracking",
    "run_tensorboard",
    "sample_rows",
    "step_samples",
    "training_sample_rows",
    "write_report",
    "write_rows",
]

_LAZY = {
    **dict.fromkeys(["Tracking", "open_tracking", "sample_rows"], "tether.tracking._hub"),
    **dict.fromkeys(
        [
            "CALL_FIELDS",
            "EXPORT_FORMATS",
            "ROW_FIELDS",
            "SAMPLE_FIELDS",
            "export_attempts",
            "write_rows",
        ],
        "tether.tracking._export",
    ),
    **dict.fromkeys(
        [
            "MlflowSink",
            "Sink",
            "SinkSpec",
            "TensorBoardSink",
            "WandbSink",
            "flatten_config",
            "metric_tag",
        ],
        "tether.tracking._sinks",
    ),
    **dict.fromkeys(
        ["StepSamples", "step_samples", "training_sample_rows"], "tether.tracking._steps"
    ),
    "write_report": "tether.tracking._report",
    "run_tensorboard": "tether.tracking._tensorboard",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
