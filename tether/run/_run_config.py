"""How a training run orchestrates collection and updates (``run:`` in a run config).

Sync or async, async mode's bounds on groups in flight and policy lag, the training
processes, and when a run whose reward collapsed stops. These were ``trainer.*``
keys; :data:`MOVED` lists them, and a config that still writes one loads with a
notice naming the new key (``tether.configio``'s ``renamed``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from tether.errors import UserError

__all__ = ["MOVED", "RunConfig"]

log = logging.getLogger(__name__)

#: The ``run:`` keys that were ``trainer:`` keys.
MOVED = (
    "mode",
    "max_groups_in_flight",
    "max_policy_lag",
    "lag_policy",
    "hold_timeout_s",
    "processes",
    "collapse_patience",
)


@dataclass
class RunConfig:
    #: sync (collect a batch, update, repeat) or async (groups keep running; admission
    #: pauses only for the update; see tether/run/_async.py).
    mode: Literal["sync", "async"] = "sync"
    #: Async: groups (tasks × n rollouts) running at once; 0 = 2 × rollout.batch_groups.
    max_groups_in_flight: int = 0
    #: Async: a group whose oldest call is more than this many policy versions behind
    #: the weights it would train is handled by lag_policy.
    max_policy_lag: int = 1
    #: Async: "drop" (counted as groups_dropped_lag) or "reweight" (kept; the loss's ratio
    #: against the recorded engine logprobs corrects for the lag, or with trainer.tis_cap
    #: set the truncated weight π_trainer / π_engine does).
    lag_policy: Literal["drop", "reweight"] = "drop"
    #: Async: seconds a model call arriving during an update is held before a 503;
    #: unset = gateway.admission_timeout_s.
    hold_timeout_s: float | None = None
    #: Training processes (torch.distributed ranks): rank 0 runs the gateway, engine and
    #: runners, the others only train; each update's samples are split across the ranks
    #: by token count, one optimizer step over all (docs/distributed.md). Under torchrun
    #: or ``accelerate launch`` their WORLD_SIZE is used instead.
    processes: int = 1
    #: Stop early when the batch reward has been 0 for this many updates in a row (collapse); 0 = never.
    collapse_patience: int = 8

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise UserError(f"run.mode ({self.mode!r}) must be 'sync' or 'async'")
        if self.lag_policy not in ("drop", "reweight"):
            raise UserError(f"run.lag_policy ({self.lag_policy!r}) must be 'drop' or 'reweight'")
        if self.max_groups_in_flight < 0 or self.max_policy_lag < 0:
            raise UserError(
                f"run.max_groups_in_flight ({self.max_groups_in_flight}) and "
                f"max_policy_lag ({self.max_policy_lag}) must be >= 0"
            )
        if self.hold_timeout_s is not None and not self.hold_timeout_s > 0:
            raise UserError(f"run.hold_timeout_s ({self.hold_timeout_s}) must be > 0 seconds")
        if not self.processes > 0:
            raise UserError(f"run.processes ({self.processes}) must be > 0")
        if self.collapse_patience < 0:
            raise UserError(
                f"run.collapse_patience ({self.collapse_patience}) must be >= 0 (0 turns it off)"
            )

    def groups_in_flight(self, batch_groups: int) -> int:
        """Async mode's bound on running groups (``max_groups_in_flight``, default 2 × batch)."""
        return self.max_groups_in_flight or 2 * batch_groups

    def check_async(self, batch_groups: int, n: int, concurrency: int) -> None:
        """Async mode's bounds against the batch (``rollout.batch_groups`` groups of ``n``)
        and the agents' ``concurrency``: an error, or warnings where they starve each other."""
        if self.mode != "async":
            return
        b = batch_groups
        if self.max_groups_in_flight and self.max_groups_in_flight < b:
            raise UserError(
                f"run.max_groups_in_flight ({self.max_groups_in_flight}) must be >= "
                f"rollout.batch_groups ({b}); raise it (e.g. {2 * b}) or set 0 for 2 × batch_groups"
            )
        in_flight = self.groups_in_flight(b)
        if concurrency < in_flight * n:
            log.warning(
                "agent.concurrency (%d) is below max_groups_in_flight × rollout.n (%d): "
                "at most %d rollouts run at once",
                concurrency,
                in_flight * n,
                concurrency,
            )
        if self.lag_policy == "drop" and in_flight > (self.max_policy_lag + 1) * b:
            log.warning(
                "max_groups_in_flight (%d) is above (max_policy_lag + 1) × batch_groups "
                "(%d): many groups will finish too late and be dropped for lag",
                in_flight,
                (self.max_policy_lag + 1) * b,
            )
