"""Async mode's rollouts (``_async.py``) built from an open run's parts and its config."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.run._async import AsyncPolicy, AsyncRollouts, Learn
from tether.run._collect import Collector
from tether.run._finish import RolloutOutcome
from tether.run._learn import Learning, has_signal, trainable
from tether.run._tasks import tasks_for_step
from tether.run.config import TrainConfig

if TYPE_CHECKING:
    from tether.run._parts import RunParts

__all__ = ["async_rollouts"]


def async_rollouts(
    cfg: TrainConfig, parts: RunParts, collector: Collector, learn: Learn, start_step: int
) -> AsyncRollouts:
    """Async mode's rollouts over an open run's ``parts``, collected by ``collector``: groups
    of its train tasks, learned from with ``learn``, from the group its ``start_step``
    (``--resume``) is at."""
    engine = parts.model.engine
    policy = AsyncPolicy(
        cfg.rollout.batch_groups,
        cfg.groups_in_flight,
        cfg.run.max_policy_lag,
        cfg.run.lag_policy,
        signal=_keeps_signal(Learning.of(cfg)) if cfg.rollout.filter_groups else None,
        max_flat=(cfg.rollout.max_oversample - 1) * cfg.rollout.batch_groups,
    )
    return AsyncRollouts(
        collector,
        # group i (from 0) is the task of "update" i + 1 with one group per update
        lambda i: tasks_for_step(parts.records.train_tasks, i + 1, 1, cfg.tasks.seed)[0],
        cfg.rollout.n,
        policy,
        learn=learn,
        version=lambda: engine.policy_version,
        first_group=start_step * cfg.rollout.batch_groups,
    )


def _keeps_signal(how: Learning) -> Callable[[list[RolloutOutcome]], bool]:
    """rollout.filter_groups in async mode: whether a finished group stays for the update
    (one with an unusable reward does: the update drops and counts it, as in sync mode)."""
    return lambda group: not trainable(group, how.credit) or has_signal(group, how)
