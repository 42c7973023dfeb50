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

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports

#: The package's face: each name and the module it lives in, imported on first use
#: (neither torch nor any sink's package loads on import).
_EXPORTS = {
    "CALL_FIELDS": "._export",
    "EXPORT_FORMATS": "._export",
    "ROW_FIELDS": "._export",
    "Fate": "._groups",
    "StepSamples": "._steps",
    "Tracking": "._fanout",
    "TrackingConfig": ".config",
    "credit_label": "._groups",
    "export_attempts": "._export",
    "normalize_tracking": ".config",
    "open_tracking": "._fanout",
    "place_kind": "._groups",
    "rollout_fates": "._groups",
    "run_tensorboard": "._tensorboard",
    "sample_rows": "._fanout",
    "step_samples": "._steps",
    "training_sample_rows": "._steps",
    "write_report": "._report",
    "write_rows": "._export",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the same names for type checkers (tests/test_public_api.py: they match)
    from ._export import CALL_FIELDS as CALL_FIELDS
    from ._export import EXPORT_FORMATS as EXPORT_FORMATS
    from ._export import ROW_FIELDS as ROW_FIELDS
    from ._export import export_attempts as export_attempts
    from ._export import write_rows as write_rows
    from ._fanout import Tracking as Tracking
    from ._fanout import open_tracking as open_tracking
    from ._fanout import sample_rows as sample_rows
    from ._groups import Fate as Fate
    from ._groups import credit_label as credit_label
    from ._groups import place_kind as place_kind
    from ._groups import rollout_fates as rollout_fates
    from ._report import write_report as write_report
    from ._steps import StepSamples as StepSamples
    from ._steps import step_samples as step_samples
    from ._steps import training_sample_rows as training_sample_rows
    from ._tensorboard import run_tensorboard as run_tensorboard
    from .config import TrackingConfig as TrackingConfig
    from .config import normalize_tracking as normalize_tracking
