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

from tether._lazy import lazy_exports

#: The package's face: each name and the module it lives in, imported on first use
#: (the names that need torch load when used, so importing the config stays light).
_EXPORTS = {
    "AgentsFailing": ".errors",
    "CheckpointConflict": ".errors",
    "Credit": ".credit",
    "GraderFailing": ".errors",
    "LoraConfig": ".config",
    "NoLearningSignal": ".errors",
    "PolicyCollapsed": ".errors",
    "PolicyTrainer": "._update",
    "RankFailed": ".errors",
    "RolloutRewards": ".credit",
    "Sample": ".samples",
    "SampleStats": ".samples",
    "TrainerConfig": ".config",
    "TrainerError": ".errors",
    "UpdateStopped": "._update",
    "assign_credit": ".credit",
    "build_samples": ".samples",
    "carries_signal": ".credit",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the same names for type checkers (tests/test_public_api.py: they match)
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
