"""Several LoRA adapters on one base model: a role's own adapter (docs/credit.md "Roles").

The trainer's peft model holds peft's ``default`` adapter (the shared policy) and
one adapter per role with ``adapter: true``, named after the role, all with the
trainer's LoRA config. An update groups its samples by adapter and trains each
group with that adapter active (:func:`by_adapter`, ``PolicyTrainer``); one
AdamW holds every adapter's parameters. An adapter that no micro-batch of a step
ran keeps ``grad`` None, and AdamW skips such parameters entirely — no weight
decay, no moment decay — so it does not move (tested).

The engine gets the same structure (:func:`serving_model`) and after each
update every adapter's weights (:func:`adapters_weights`,
``TransformersEngine.update_weights``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from tether.trainer.samples import Sample

__all__ = ["DEFAULT", "RESERVED", "adapters_weights", "add_adapters", "by_adapter", "serving_model"]

#: peft's name of the first adapter: the shared policy.
DEFAULT = "default"
#: Names a role with its own adapter cannot have (peft's default, the engine's "base").
RESERVED = frozenset({DEFAULT, "base"})


def add_adapters(model: Any, names: Sequence[str], config: Any) -> None:
    """Add an adapter per name to the peft ``model`` with ``config``; every adapter's
    parameters trainable (peft trains only the active one), ``default`` active."""
    for name in names:
        if name in RESERVED:
            raise ValueError(f"an adapter cannot be named {name!r}: rename the role")
        model.add_adapter(name, config)
    for key, p in model.named_parameters():
        if "lora_" in key:
            p.requires_grad_(True)


def by_adapter(
    samples: Sequence[Sample], adapters: Sequence[str]
) -> list[tuple[str | None, list[Sample]]]:
    """``samples`` grouped by the adapter that trains them, in first-seen order: a
    sample's role if it has its own adapter, else None (the default one)."""
    groups: dict[str | None, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.role if s.role in adapters else None, []).append(s)
    return list(groups.items())


def activate(model: Any, adapter: str | None) -> None:
    """Make ``adapter`` (None: the default) the one peft runs; every adapter stays
    trainable (``set_adapter`` would freeze the others, but the optimizer holds them)."""
    name = adapter or DEFAULT
    if list(model.active_adapters) == [name]:
        return
    model.base_model.set_adapter(name)
    for key, p in model.named_parameters():
        if "lora_" in key:
            p.requires_grad_(True)


def adapters_weights(model: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Every adapter's weights as peft saves them (names without the adapter), on the CPU."""
    from peft import get_peft_model_state_dict

    return {
        name: {
            k: v.detach().cpu().clone()
            for k, v in get_peft_model_state_dict(model, adapter_name=name).items()
        }
        for name in model.peft_config
    }


def serving_model(base: torch.nn.Module, trained: Any) -> Any:
    """``base`` (a fresh copy of the base weights) wrapped like the peft model ``trained``:
    the same adapters, configs and weights; in eval mode, for the engine."""
    from peft import get_peft_model, set_peft_model_state_dict

    configs = {name: copy.deepcopy(c) for name, c in trained.peft_config.items()}
    model = get_peft_model(base, configs.pop(DEFAULT))
    for name, config in configs.items():
        model.add_adapter(name, config)
    for name, weights in adapters_weights(trained).items():
        set_peft_model_state_dict(model, weights, adapter_name=name)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()
