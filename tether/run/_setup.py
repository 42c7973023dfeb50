"""What a training run derives from its config before it starts, async mode's
rollouts (``_async.py``) built from the run's parts, and how the run ended.

A run never changes its config: the values it settles at start-up (its admin
key, the server's URL, async mode's hold timeout, the ``extra``
notes of its store record) are new objects kept on the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.configio import dump
from tether.engine import Engine
from tether.errors import Interrupted
from tether.gateway import GatewayConfig
from tether.records import RunStatus
from tether.run._async import AsyncRollouts, Learn
from tether.run._finish import RolloutOutcome
from tether.run._learn import Learning, has_signal, trainable
from tether.run._rundir import ResumePoint
from tether.run._tasks import tasks_for_step
from tether.run.config import TrainConfig

if TYPE_CHECKING:
    from tether.run._parts import RunParts

__all__ = [
    "async_rollouts",
    "end_status",
    "engine_weights",
    "gateway_config",
    "record_config",
    "resolve_model_path",
]


def record_config(cfg: TrainConfig, command: str, resume: ResumePoint | None) -> dict[str, Any]:
    """``cfg`` as the run's store record holds it: ``extra`` says an eval's record is not a
    training run, and links a resumed session to the record it continues (see _rundir.py)."""
    record = dump(cfg)
    notes = dict(record.get("extra") or {})
    if command != "train":
        notes["command"] = command
    if resume is not None and resume.run_id is not None:
        notes.update(resumed_from=resume.run_id, resumed_at=resume.step)
    record["extra"] = notes
    return record


def gateway_config(cfg: TrainConfig, admin_key: str) -> GatewayConfig:
    """The run's gateway config: ``admin_key`` (:func:`tether.gateway.resolve_admin_key`
    decided it), and in async mode ``run.hold_timeout_s`` as the admission timeout."""
    gcfg = dataclasses.replace(cfg.gateway, admin_key=admin_key)
    hold = cfg.run.hold_timeout_s
    if cfg.run.mode == "async" and hold is not None:
        gcfg = dataclasses.replace(gcfg, admission_timeout_s=hold)
    return gcfg


def end_status(exc_type: object) -> RunStatus:
    """A run's final status from the exception that ended it (None: it finished)."""
    if exc_type is None:
        return RunStatus.FINISHED
    if isinstance(exc_type, type) and issubclass(
        exc_type, (Interrupted, KeyboardInterrupt, asyncio.CancelledError)
    ):
        return RunStatus.INTERRUPTED  # Ctrl-C or SIGTERM (Interrupts cancels the main task)
    return RunStatus.FAILED


def resolve_model_path(path: str | Path) -> Path:
    """``model.path`` as a folder: the starter's (built once, cached), or for a local
    checkpoint or run folder the model folder in it (:func:`tether.models.model_folder`);
    a hub id unchanged. ``./runs/x`` that is not there is refused as a path, before
    ``Path`` makes it ``runs/x``, which reads as a hub id."""
    if str(path) == "starter":
        from tether.starter import build_starter

        return Path(build_starter(warm=True))
    from tether.models import model_folder, model_source

    if Path(path).is_dir():
        return model_folder(Path(path))
    model_source(str(path))  # none there: the one-line error, on the path as written
    return Path(path)


def async_rollouts(
    cfg: TrainConfig, parts: RunParts, learn: Learn, start_step: int
) -> AsyncRollouts:
    """Async mode's rollouts over an open run's ``parts``: groups of its train tasks, learned
    from with ``learn``, from the group its ``start_step`` (``--resume``) is at."""
    engine = parts.engine
    return AsyncRollouts(
        parts.gateway,
        parts.runner,
        # group i (from 0) is the task of "update" i + 1 with one group per update
        lambda i: tasks_for_step(parts.train_tasks, i + 1, 1, cfg.tasks.seed)[0],
        cfg.rollout.n,
        grader=parts.grader,
        run_id=parts.run_record.id,
        batch_groups=cfg.rollout.batch_groups,
        max_in_flight=cfg.groups_in_flight,
        max_lag=cfg.run.max_policy_lag,
        lag_policy=cfg.run.lag_policy,
        learn=learn,
        version=lambda: engine.policy_version,
        first_group=start_step * cfg.rollout.batch_groups,
        success_threshold=cfg.rollout.success_threshold,
        signal=_keeps_signal(Learning.of(cfg)) if cfg.rollout.filter_groups else None,
        max_flat=(cfg.rollout.max_oversample - 1) * cfg.rollout.batch_groups,
    )


def _keeps_signal(how: Learning) -> Callable[[list[RolloutOutcome]], bool]:
    """rollout.filter_groups in async mode: whether a finished group stays for the update
    (one with an unusable reward does: the update drops and counts it, as in sync mode)."""
    return lambda group: not trainable(group, how.credit) or has_signal(group, how)


def engine_weights(trainer: Any, engine: Engine) -> dict[str, Any]:
    """What ``engine.update_weights`` takes from ``trainer``: the LoRA adapter's weights
    for a remote engine that loads adapters (``wants_adapter``), every adapter's by name
    for an embedded engine serving per-role adapters, else the full weights."""
    if engine.adapters:
        return trainer.adapters_state_dict()
    if engine.wants_adapter:
        return trainer.adapter_state_dict()
    return trainer.state_dict()
