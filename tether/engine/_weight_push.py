"""A weight push: the object an engine provides (``Engine.weight_push``) that takes the
trainer's weights in the form the engine loads and hands them to it.

- :class:`WeightPush` — the full (LoRA merged) weights: the embedded engine on a plain
  model, a remote engine on the ``disk`` or ``nccl`` transport;
- :class:`AdapterPush` — the LoRA adapter's peft state dict: a remote engine on the
  ``lora`` transport;
- :class:`RoleAdaptersPush` — every adapter's by name: the embedded engine serving
  per-role adapters.

How the weights then travel is the engine's: a swap in place (the embedded engine's
``update_weights``), or on a remote engine safetensors on disk, a LoRA load or a
broadcast group (one subclass each, ``_remote_push.py``, whose ``send`` its
``update_weights`` calls). The run only calls :meth:`WeightPush.push`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tether.engine._protocol import Engine

__all__ = ["AdapterPush", "RoleAdaptersPush", "WeightPush", "WeightSource"]


class WeightSource(Protocol):
    """What a push reads from the trainer (:class:`~tether.trainer.PolicyTrainer`)."""

    def state_dict(self) -> dict[str, Any]: ...

    def adapter_state_dict(self) -> dict[str, Any]: ...

    def adapters_state_dict(self) -> dict[str, dict[str, Any]]: ...


@dataclass(eq=False)
class WeightPush:
    """Pushes the trainer's full weights to ``engine`` (the protocol's default)."""

    engine: Engine

    def weights(self, trainer: WeightSource) -> dict[str, Any]:
        """What ``engine.update_weights`` takes from ``trainer``."""
        return trainer.state_dict()

    async def push(self, trainer: WeightSource, *, version: int | None = None) -> int:
        """Load ``trainer``'s weights into the engine: its new policy version, one more
        than before, or ``version`` when given (a run resumed from a checkpoint)."""
        return await self.engine.update_weights(self.weights(trainer), version=version)


class AdapterPush(WeightPush):
    """Pushes the trainer's LoRA adapter (a remote engine on the ``lora`` transport)."""

    def weights(self, trainer: WeightSource) -> dict[str, Any]:
        return trainer.adapter_state_dict()


class RoleAdaptersPush(WeightPush):
    """Pushes every adapter of the trainer by name (an engine serving per-role adapters)."""

    def weights(self, trainer: WeightSource) -> dict[str, Any]:
        return trainer.adapters_state_dict()
