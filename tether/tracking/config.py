"""The run config's ``tracking`` section: where metrics go besides the store.

Two spellings in a YAML file::

    tracking: [tensorboard, wandb]          # the sinks, nothing else

    tracking:                               # the sinks and their options
      sinks: [tensorboard, mlflow]
      log_samples: false
      mlflow_uri: http://127.0.0.1:5000

The list is the complete set: ``tracking: [wandb]`` turns TensorBoard off,
``tracking: []`` sends metrics to the store only. The default is
``[tensorboard]``. A file's list form is read as ``{sinks: [...]}`` before the
command-line overrides, so ``tracking.log_samples=true`` works on either
spelling (:func:`normalize_tracking`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from tether.errors import UserError

__all__ = ["SINKS", "TrackingConfig", "normalize_tracking"]

#: The sinks tether knows, and what to install for each (tensorboard is a dependency of
#: tether itself; the others are extras).
SINKS = {"tensorboard": "tensorboard", "wandb": "'tether[wandb]'", "mlflow": "'tether[mlflow]'"}


@dataclass
class TrackingConfig:
    #: Where each step's metrics, the evals and the config (as hyperparameters) also go:
    #: tensorboard (event files in {run folder}/tensorboard), wandb, mlflow. [] = the store only.
    sinks: list[str] = field(default_factory=lambda: ["tensorboard"])
    #: Also send each update's rollouts (prompt, completion, answer, reward) to the sinks.
    #: Off by default: with W&B or a remote MLflow, prompts and completions leave the machine.
    log_samples: bool = False
    #: The W&B project and the MLflow experiment of the run.
    project: str = "tether"
    #: W&B entity (user or team); "" = your W&B default.
    wandb_entity: str = ""
    #: MLflow tracking URI; "" = MLFLOW_TRACKING_URI, else MLflow's own default.
    mlflow_uri: str = ""

    def __post_init__(self) -> None:
        seen: list[str] = []
        for name in self.sinks:
            if name not in SINKS:
                near = difflib.get_close_matches(str(name), list(SINKS), n=1)
                hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(SINKS)}"
                raise UserError(f"tracking.sinks: unknown sink {name!r} ({hint})")
            if name not in seen:
                seen.append(name)
        self.sinks = seen
        if not self.project:
            raise UserError("tracking.project must not be empty (e.g. tracking.project=tether)")


def normalize_tracking(data: dict[str, Any]) -> dict[str, Any]:
    """A run config mapping whose ``tracking`` list (or one sink name) becomes ``{sinks: ...}``."""
    value = data.get("tracking")
    if isinstance(value, str):
        value = value.split()
    if isinstance(value, list | tuple):
        data = {**data, "tracking": {"sinks": list(value)}}
    return data
