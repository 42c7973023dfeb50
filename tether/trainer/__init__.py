"""Learning only: rollouts' token sequences in, a better policy out.

- :mod:`tether.trainer.algorithms`: pure tensor math (advantages, losses,
  aggregation), torch and nothing of tether;
- :mod:`tether.trainer.credit`: which advantage each call trains with (trajectory or
  turn-level credit, ``trainer.credit``);
- :mod:`tether.trainer.segments`: where a rollout's token prefix breaks (torch-free);
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

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (the names that need torch load when used, so importing the config stays light).
if TYPE_CHECKING:
    from ._update import PolicyTrainer as PolicyTrainer
    from ._update import UpdateStopped as UpdateStopped
    from .config import LoraConfig as LoraConfig
    from .config import TrainerConfig as TrainerConfig
    from .credit import Credit as Credit
    from .credit import RolloutRewards as RolloutRewards
    from .credit import assign_credit as assign_credit
    from .credit import carries_signal as carries_signal
    from .errors import AgentsFailing as AgentsFailing
    from .errors import CheckpointConflict as CheckpointConflict
    from .errors import GraderFailing as GraderFailing
    from .errors import NoLearningSignal as NoLearningSignal
    from .errors import PolicyCollapsed as PolicyCollapsed
    from .errors import RankFailed as RankFailed
    from .errors import TrainerError as TrainerError
    from .samples import Sample as Sample
    from .samples import SampleStats as SampleStats
    from .samples import build_samples as build_samples

__getattr__, __dir__, __all__ = lazy_face(__name__)
