"""Orchestration: a training run composes the gateway, the engine, the runner,
the store and the trainer.

- :class:`TrainingRun` (``_loop.py``): one run over a :class:`TrainConfig`;
  sync collection (``_collect.py``) or async (``_async.py``), tasks
  (``_tasks.py``), held-out evals (``_evaluate.py``), failed-collection
  checks (``_failures.py``), run folders and ``--resume`` (``_rundir.py``),
  what a run derives from its config and its final status (``_setup.py``);
  the run's parts, built once (``_parts.py``), and the typed events its
  listener gets (``_events.py``: :data:`RunEvent`);
- the other training processes of ``trainer.processes`` > 1 or a launcher
  (``_ranks.py``; :func:`serve_rank` is what ranks 1.. run);
- :mod:`tether.run.config`: the run's composite config, one YAML file.

It is the only package that imports the gateway, the runner and the starter
together. Importing the configs does not load FastAPI, uvicorn or torch: the
other names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports
from tether.run.config import (
    CheckpointConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    TasksConfig,
    TrackingConfig,
    TrainConfig,
    TrainerConfig,
)

if TYPE_CHECKING:
    from tether.run._async import AsyncRollouts, Group, group_lag
    from tether.run._collect import (
        Collected,
        Grader,
        RetryPolicy,
        RolloutOutcome,
        collect_groups,
        is_success,
        load_grader,
        read_grade,
    )
    from tether.run._diagnostics import batch_diagnostics
    from tether.run._evaluate import EvalResult, StepReport
    from tether.run._events import (
        CheckpointSaved,
        EvalDone,
        EvalProgress,
        EvalStart,
        Resumed,
        RunEvent,
        Status,
        StepDone,
    )
    from tether.run._failures import check_collection
    from tether.run._loop import TrainingRun
    from tether.run._ranks import RankGroup, rank_from_env, serve_rank
    from tether.run._rundir import (
        ResumePoint,
        check_new_run,
        free_name,
        holds_run,
        past_metrics,
        resume_point,
    )
    from tether.run._setup import end_status
    from tether.run._tasks import load_tasks, tasks_for_step

__all__ = [
    "AsyncRollouts",
    "CheckpointConfig",
    "CheckpointSaved",
    "Collected",
    "EvalConfig",
    "EvalDone",
    "EvalProgress",
    "EvalResult",
    "EvalStart",
    "Grader",
    "Group",
    "LoraConfig",
    "ModelConfig",
    "RankGroup",
    "ResumePoint",
    "Resumed",
    "RetryPolicy",
    "RolloutConfig",
    "RolloutOutcome",
    "RunEvent",
    "Status",
    "StepDone",
    "StepReport",
    "TasksConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "TrainingRun",
    "batch_diagnostics",
    "check_collection",
    "check_new_run",
    "collect_groups",
    "end_status",
    "free_name",
    "group_lag",
    "holds_run",
    "is_success",
    "load_grader",
    "load_tasks",
    "past_metrics",
    "rank_from_env",
    "read_grade",
    "resume_point",
    "serve_rank",
    "tasks_for_step",
]

_LAZY = {
    **dict.fromkeys(["AsyncRollouts", "Group", "group_lag"], "tether.run._async"),
    **dict.fromkeys(
        [
            "Collected",
            "Grader",
            "RetryPolicy",
            "RolloutOutcome",
            "collect_groups",
            "is_success",
            "load_grader",
            "read_grade",
        ],
        "tether.run._collect",
    ),
    **dict.fromkeys(
        [
            "CheckpointSaved",
            "EvalDone",
            "EvalProgress",
            "EvalStart",
            "Resumed",
            "RunEvent",
            "Status",
            "StepDone",
        ],
        "tether.run._events",
    ),
    "batch_diagnostics": "tether.run._diagnostics",
    "check_collection": "tether.run._failures",
    **dict.fromkeys(["EvalResult", "StepReport"], "tether.run._evaluate"),
    "TrainingRun": "tether.run._loop",
    **dict.fromkeys(["RankGroup", "rank_from_env", "serve_rank"], "tether.run._ranks"),
    "end_status": "tether.run._setup",
    **dict.fromkeys(
        ["ResumePoint", "check_new_run", "free_name", "holds_run", "past_metrics", "resume_point"],
        "tether.run._rundir",
    ),
    **dict.fromkeys(["load_tasks", "tasks_for_step"], "tether.run._tasks"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
