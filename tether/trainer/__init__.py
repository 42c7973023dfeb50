"""Learning only: rollouts' token sequences in, a better policy out.

- :mod:`tether.trainer.algorithms`: pure tensor math (advantages, losses,
  aggregation), torch and nothing of tether;
- :mod:`tether.trainer.samples`: finished rollouts → token sequences with masks;
- :class:`PolicyTrainer`: the policy update (micro-batches, optimizer step);
- :mod:`tether.trainer.checkpoint`: checkpoints of the trainer's state;
- :class:`TrainerConfig` (``trainer:`` in a run config) and the errors.

It imports nothing from the gateway, the runner or the starter: the run that
composes them is :mod:`tether.run`. The names that need torch load on first
use, so that importing the config stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports
from tether.trainer.config import LoraConfig, TrainerConfig
from tether.trainer.errors import (
    AgentsFailing,
    CheckpointConflict,
    PolicyCollapsed,
    RankFailed,
    TrainerError,
)

if TYPE_CHECKING:
    from tether.trainer._update import PolicyTrainer, UpdateStopped
    from tether.trainer.samples import Sample, SampleStats, build_samples

__all__ = [
    "AgentsFailing",
    "CheckpointConflict",
    "LoraConfig",
    "PolicyCollapsed",
    "PolicyTrainer",
    "RankFailed",
    "Sample",
    "SampleStats",
    "TrainerConfig",
    "TrainerError",
    "UpdateStopped",
    "build_samples",
]

_LAZY = {
    "PolicyTrainer": "tether.trainer._update",
    "UpdateStopped": "tether.trainer._update",
    "Sample": "tether.trainer.samples",
    "SampleStats": "tether.trainer.samples",
    "build_samples": "tether.trainer.samples",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
