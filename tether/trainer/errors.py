"""The trainer's errors.

TrainerError
├── PolicyCollapsed   the reward stayed at 0 for trainer.collapse_patience updates
├── AgentsFailing      every rollout of the run's first collection failed (agent broken)
├── CheckpointConflict a checkpoint of that step already belongs to another run
├── RankFailed         another training process (torch.distributed rank) died or stopped answering
└── (configuration mistakes are tether.errors.UserError)
"""

from __future__ import annotations

from tether.errors import TetherError

__all__ = [
    "AgentsFailing",
    "CheckpointConflict",
    "PolicyCollapsed",
    "RankFailed",
    "TrainerError",
]


class TrainerError(TetherError):
    """Base of the trainer's errors."""


class PolicyCollapsed(TrainerError):
    """The policy stopped getting any reward; more updates would teach it nothing."""


class AgentsFailing(TrainerError):
    """Every rollout of the run's first collection failed: the agent itself is broken.

    The message carries the first failure's error and the end of its output.
    """


class CheckpointConflict(TrainerError):
    """A checkpoint folder of the same step already belongs to another run."""


class RankFailed(TrainerError):
    """A collective operation between the training processes failed: a rank exited, or
    did not answer within ``trainer.collective_timeout_s``. The run cannot go on."""
