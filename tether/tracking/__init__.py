"""Watching a run: its metrics to TensorBoard, W&B or MLflow; its store exported and reported.

- :class:`TrackingConfig` (``config.py``): the run config's ``tracking`` section;
- :func:`open_tracking` / :class:`Tracking` (``_fanout.py``): the sinks of one run
  (``_sinks.py``), each of which may fail without stopping the run;
- :func:`export_attempts` / :func:`write_rows` (``_export.py``): one row per
  rollout attempt, to JSONL or Parquet (docs/export.md);
- :func:`rollout_fates` / :class:`Fate` / :func:`credit_label` (``_groups.py``): what each
  update did with each rollout's group (trained with which advantage, or dropped and
  why), read from the update records the run stored (the dashboard shows these);
  :func:`place_kind`: a rollout's stored place (``records.Place``) in one word, as export
  and the dashboard name it;
- :func:`step_samples` (``_steps.py``): the training samples of one update,
  rebuilt from the stored calls with the trainer's own functions;
- :func:`write_report` (``_report.py``): a self-contained HTML page of the curves
  and the held-out table;
- :func:`run_tensorboard` (``_tensorboard.py``): ``tether tensorboard``.

It reads the store and never writes it. Importing the package loads neither
torch nor any sink's package.
"""

from __future__ import annotations

from ._export import CALL_FIELDS, EXPORT_FORMATS, ROW_FIELDS, export_attempts, write_rows
from ._fanout import Tracking, open_tracking, sample_rows
from ._groups import Fate, credit_label, place_kind, rollout_fates
from ._report import write_report
from ._steps import StepSamples, step_samples, training_sample_rows
from ._tensorboard import run_tensorboard
from .config import TrackingConfig, normalize_tracking

__all__ = [
    "CALL_FIELDS",
    "EXPORT_FORMATS",
    "ROW_FIELDS",
    "Fate",
    "StepSamples",
    "Tracking",
    "TrackingConfig",
    "credit_label",
    "export_attempts",
    "normalize_tracking",
    "open_tracking",
    "place_kind",
    "rollout_fates",
    "run_tensorboard",
    "sample_rows",
    "step_samples",
    "training_sample_rows",
    "write_report",
    "write_rows",
]
