"""Async mode's rollouts (``_async.py``) built from an open run's parts and its config."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.run._async import AsyncRollouts, Learn
from tether.run._finish import RolloutOutcome
from tether.run._learn import Learning, has_signal, trainable
from tether.run._tasks import tasks_for_step
from tether.run.config import TrainConfig

if TYPE_CHECKING:
    from tether.run._parts import RunParts

__all__ = ["async_rollouts"]


def async_rollouts(
    cfg: TrainConfig, parts: RunParts, learn: Learn, start_step: int
) -> AsyncRollouts:
    """Async mode's rollouts over an open run's ``parts``: groups of its train tasks, learned
    from with ``learn``, from the group its ``start_step`` (``--resume``) is at."""
    engine = parts.model.engine
    return AsyncRollouts(
        parts.serving.gateway,
        parts.serving.runner,
        # group i (from 0) is the task of "update" i + 1 with one group per update
        lambda i: tasks_for_step(parts.records.train_tasks, i + 1, 1, cfg.tasks.seed)[0],
        cfg.rollout.n,
        grader=parts.grader,
        run_id=parts.records.run_record.id,
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
