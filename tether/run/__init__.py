"""Orchestration: a training run composes the gateway, the engine, the runner,
the store and the trainer.

- :class:`TrainingRun` (``_loop.py``): one run over a :class:`TrainConfig`;
  the collection service, sync and async alike (``_collect.py``; grading and ending
  each rollout: ``_finish.py``), async mode's scheduler (``_async.py``), tasks
  (``_tasks.py``), held-out evals (``_evaluate.py``), failed-collection
  checks (``_failures.py``), the stop when the engine is gone (``_watch.py``), the judge
  grader (``_judge.py``), run folders and ``--resume`` (``_rundir.py``),
  the run record's config and final status (``_rundir.py``), a model path
  (``_paths.py``), the weights pushed to the engine (``_weights.py``), async mode's
  rollouts from the run's parts (``_async_parts.py``);
  the run's parts, built once (``_parts.py``), and the typed events its
  listener gets (``_events.py``: :data:`RunEvent`);
- the other training processes of ``run.processes`` > 1 or a launcher
  (``_ranks.py``; :func:`serve_rank` is what ranks 1.. run);
- :mod:`tether.run.config`: the run's composite config, one YAML file.

It is the only package that imports the gateway, the runner and the starter
together. Importing the configs does not load FastAPI, uvicorn or torch: the
other names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use.
if TYPE_CHECKING:
    from ._collect import RetryPolicy as RetryPolicy
    from ._collect import collect_groups as collect_groups
    from ._diagnostics import batch_diagnostics as batch_diagnostics
    from ._evaluate import EvalResult as EvalResult
    from ._evaluate import StepReport as StepReport
    from ._events import CheckpointSaved as CheckpointSaved
    from ._events import EvalDone as EvalDone
    from ._events import EvalProgress as EvalProgress
    from ._events import EvalStart as EvalStart
    from ._events import Resumed as Resumed
    from ._events import RunEvent as RunEvent
    from ._events import Status as Status
    from ._events import StepDone as StepDone
    from ._finish import RolloutOutcome as RolloutOutcome
    from ._grading import Grader as Grader
    from ._grading import load_grader as load_grader
    from ._loop import TrainingRun as TrainingRun
    from ._memwatch import MemoryWatch as MemoryWatch
    from ._paths import resolve_model_path as resolve_model_path
    from ._ranks import RankGroup as RankGroup
    from ._ranks import rank_from_env as rank_from_env
    from ._ranks import serve_rank as serve_rank
    from ._rundir import check_new_run as check_new_run
    from ._rundir import end_status as end_status
    from ._rundir import holds_run as holds_run
    from ._tasks import load_task_set as load_task_set
    from ._tasks import load_tasks as load_tasks
    from ._tasks import tasks_for_step as tasks_for_step
    from .config import CheckpointConfig as CheckpointConfig
    from .config import EvalConfig as EvalConfig
    from .config import JudgeConfig as JudgeConfig
    from .config import LoraConfig as LoraConfig
    from .config import ModelConfig as ModelConfig
    from .config import RolloutConfig as RolloutConfig
    from .config import RunConfig as RunConfig
    from .config import TasksConfig as TasksConfig
    from .config import TrackingConfig as TrackingConfig
    from .config import TrainConfig as TrainConfig
    from .config import TrainerConfig as TrainerConfig

__getattr__, __dir__, __all__ = lazy_face(__name__)
