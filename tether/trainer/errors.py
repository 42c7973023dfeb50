"""The trainer's errors.

TrainerError
├── PolicyCollapsed   the reward stayed at 0 for trainer.collapse_patience updates
└── (configuration mistakes are tether.errors.UserError)
"""

from __future__ import annotations

from tether.errors import TetherError

__all__ = ["PolicyCollapsed", "TrainerError"]


class TrainerError(TetherError):
    """Base of the trainer's errors."""


class PolicyCollapsed(TrainerError):
    """The policy stopped getting any reward; more updates would teach it nothing."""
