"""The trainer's errors.

TrainerError
├── PolicyCollapsed   the reward fell to 0 after gains and stayed there for
│                     run.collapse_patience updates
├── NoLearningSignal   every group's rewards were equal (all 0) from the start for
│                     run.collapse_patience updates: no update could learn anything
├── AgentsFailing      every rollout of the run's first collection failed (agent broken)
├── GraderFailing      the grader raised on every rollout of a collection
├── CheckpointConflict a checkpoint of that step already belongs to another run
├── RankFailed         another training process (torch.distributed rank) died or stopped answering
└── (configuration mistakes are tether.errors.UserError)
"""

from __future__ import annotations

from tether.errors import TetherError

__all__ = [
    "AgentsFailing",
    "CheckpointConflict",
    "GraderFailing",
    "NoLearningSignal",
    "PolicyCollapsed",
    "RankFailed",
    "TrainerError",
]


class TrainerError(TetherError):
    """Base of the trainer's errors."""


class PolicyCollapsed(TrainerError):
    """The policy earned reward, then stopped getting any; more updates would teach it
    nothing."""


class NoLearningSignal(TrainerError):
    """The reward was 0 (every group's rewards equal) from the run's first step on: no
    update had a gradient, so the policy never changed. The grader or the agent is the
    suspect, not the learning rate."""


class GraderFailing(TrainerError):
    """The grader raised on every rollout of a collection; the message names the
    exception and where in the grader it was raised."""


class AgentsFailing(TrainerError):
    """Every rollout of the run's first collection failed: the agent itself is broken.

    The message carries the first failure's error and the end of its output.
    """


class CheckpointConflict(TrainerError):
    """A checkpoint folder of the same step already belongs to another run."""


class RankFailed(TrainerError):
    """A collective operation between the training processes failed: a rank exited, or
    did not answer within ``trainer.collective_timeout_s``. The run cannot go on."""
