"""The trainer's weights as others take them: the engine (full, merged, or adapters), an
engine decoding with the trainer's own module, and, sharded (``trainer.strategy: fsdp2``),
the collectives that gather, save and load them on every rank at once.

:class:`TrainerWeights` is :class:`~tether.trainer.PolicyTrainer`'s half that hands weights
out; ``_update.py`` holds the half that changes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tether._hf import adapter_config, adapter_weights, merged_weights
from tether.trainer._adapters import adapters_weights, serving_model
from tether.trainer._fsdp import ShardedPolicy, gather_full, load_shards, save_shards
from tether.trainer.config import TrainerConfig
from tether.trainer.distributed import Ranks

__all__ = ["TrainerWeights"]


class TrainerWeights:
    """What :class:`~tether.trainer.PolicyTrainer` hands out of its weights (a mixin: the
    attributes below are the trainer's)."""

    cfg: TrainerConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ranks: Ranks | None
    #: Sharded: the FSDP2 root of the policy (``_fsdp.py``); None when unsharded.
    root: ShardedPolicy | None
    #: Rank 0, sharded: the full weights gathered after the last change, until taken.
    _full: dict[str, torch.Tensor] | None
    _shared_lock: Any

    def can_share_weights(self) -> bool:
        """Whether an engine may decode with :attr:`model` itself.

        Not with LoRA (the engine needs the merged weights, the trainer keeps the
        adapters apart) and not with dropout (the trainer runs in train mode and
        the engine in eval mode on one module; without dropout the two agree).
        """
        if self.cfg.lora is not None or self.root is not None:
            return False
        config = getattr(self.model, "config", None)
        rates = [v for k, v in vars(config or object()).items() if "dropout" in k]
        rates += [m.p for m in self.model.modules() if isinstance(m, torch.nn.Dropout)]
        return not any(isinstance(r, int | float) and r > 0 for r in rates)

    def share_weights(self, lock: Any) -> None:
        """The engine decodes with :attr:`model`; ``lock`` (its weights lock) guards each step."""
        if not self.can_share_weights():
            raise ValueError("these weights cannot be shared (LoRA or dropout)")
        self._shared_lock = lock

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights for the engine (LoRA merged, base names); empty when the engine
        shares :attr:`model` (it already decodes with the updated tensors). With LoRA the
        frozen base tensors are the trainer's own (never written), the merged ones new:
        no copy of the model is made."""
        if self._shared_lock is not None:
            return {}
        if self.root is not None:  # gathered from the shards (rank 0 only), then merged
            full = self.full_weights()
            return merged_weights(self.model, full) if self.cfg.lora is not None else full
        if self.cfg.lora is not None:
            own = {k: v.detach() for k, v in self.model.state_dict().items()}
            return {k: v.cpu() for k, v in merged_weights(self.model, own).items()}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter's weights as peft saves them (a remote engine's ``lora`` push)."""
        if self.cfg.lora is None:
            raise ValueError("adapter_state_dict needs trainer.lora")
        if self.root is not None:
            return adapter_weights(self.model, self.full_weights())
        return adapter_weights(self.model)

    # -- sharded (trainer.strategy fsdp2): collectives that rank 0 starts ------------

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Rank 0, sharded: the full weights (the model's own names, LoRA unmerged, CPU),
        gathered after the last update or load, or now (every rank joins in). Handed out
        once: rank 0 keeps no second copy beside the engine's or the checkpoint's."""
        if self.root is None or self.ranks is None or not self.ranks.is_main:
            raise ValueError("full_weights is rank 0's, with trainer.strategy fsdp2")
        if self._full is None:
            self.ranks.send(("gather",))
            self.gather()
        full, self._full = self._full, None
        assert full is not None
        return full

    def gather(self) -> None:
        """Every rank, sharded: gather the full weights onto rank 0's CPU (kept there)."""
        assert self.root is not None and self.ranks is not None
        with self.ranks.collective("gathering the weights"):
            self._full = gather_full(self.root, main=self.ranks.is_main) or None

    def save_sharded(self, path: Path) -> None:
        """Every rank's shards of the weights and the optimizer state into ``path``
        (torch.distributed.checkpoint; a folder every rank can reach). Rank 0 starts it."""
        assert self.root is not None and self.ranks is not None
        if self.ranks.is_main:
            self.ranks.send(("save", str(path)))
        with self.ranks.collective("saving the sharded checkpoint"):
            save_shards(self.root, self.optimizer, path)

    def load_sharded(self, path: Path) -> None:
        """Every rank: :meth:`save_sharded`'s folder back, resharded to this world size;
        then the full weights are gathered for the engine. Rank 0 starts it."""
        assert self.root is not None and self.ranks is not None
        if self.ranks.is_main:
            self.ranks.send(("load", str(path)))
        with self.ranks.collective("loading the sharded checkpoint"):
            load_shards(self.root, self.optimizer, path)
        self.gather()

    def adapters_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every adapter's weights by name (``default``: the shared policy; one per role
        with its own adapter): what an engine serving adapters takes."""
        if self.cfg.lora is None:
            raise ValueError("adapters_state_dict needs trainer.lora")
        return adapters_weights(self.model)

    def serving_model(self, base: torch.nn.Module) -> Any:
        """``base`` (the base weights, the engine's copy) wrapped in every adapter of
        :attr:`model` with its weights, unmerged: an engine serving per-role adapters."""
        if self.cfg.lora is None:
            raise ValueError("serving_model needs trainer.lora")
        return serving_model(base, self.model)

    def adapter_config(self) -> dict[str, Any]:
        """The LoRA adapter's ``adapter_config.json`` (JSON-safe); needs trainer.lora."""
        if self.cfg.lora is None:
            raise ValueError("adapter_config needs trainer.lora")
        return adapter_config(self.model)
