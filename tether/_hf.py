"""transformers / peft compatibility: the one place that knows their version quirks.

Shared by the engine (KV-cached decoding), the trainer (shared-prefix forward,
LoRA merge) and the starter's warm-up (shared-prefix forward). It is a leaf:
it imports torch (transformers and peft lazily) and nothing of tether, so any
package that already knows transformers may use it without a new arrow in the
layering table. It lives at the top of the package, beside ``records.py``,
because the engine, the trainer and the starter are siblings: putting it in
one of them would make the others import a sibling's internals.

- :func:`takes_kwarg`: whether a forward takes an argument (``logits_to_keep``…).
- :func:`cache_kwarg`: the KV cache argument is ``cache`` from transformers
  5.24 on, ``past_key_values`` before.
- :func:`cache_layers`: a ``DynamicCache``'s ``(keys, values)`` per layer
  (``cache.layers`` from 4.56 on, ``key_cache``/``value_cache`` before).
- :func:`shared_prefix_forward`: rows that share a prefix run it once and
  broadcast its KV cache (gradients flow through it).
- :func:`merged_weights`: a LoRA (peft) model's adapters merged into its weights,
  tensor by tensor, from its state dict or one held elsewhere (FSDP2 shards gathered
  on rank 0); no copy of the model.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = [
    "cache_kwarg",
    "cache_layers",
    "merged_weights",
    "shared_prefix_forward",
    "takes_kwarg",
]


def takes_kwarg(model: Any, name: str) -> bool:
    """Whether ``model.forward`` (peft wrappers unwrapped) has a parameter ``name``."""
    base = getattr(model, "get_base_model", lambda: model)()
    return name in inspect.signature(base.forward).parameters


def cache_kwarg(model: Any) -> str:
    """The name under which ``model.forward`` takes the KV cache."""
    return "cache" if takes_kwarg(model, "cache") else "past_key_values"


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` per layer of a ``DynamicCache``, each ``[B, heads, L, head_dim]``."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def shared_prefix_forward(
    model: Any, prefix: torch.Tensor, suffix: torch.Tensor, attention_mask: torch.Tensor
) -> Any:
    """``model``'s output for ``suffix`` ``[B, T]`` as if each row were ``prefix + row``.

    ``prefix`` ``[P]`` (or ``[1, P]``) is run once and its KV cache repeated to
    the ``B`` rows, with gradients, so the result equals a full forward of
    every row up to float rounding. ``attention_mask`` ``[B, P + T]`` covers
    prefix and suffix. ``model`` is a causal LM (``.logits``) or its inner
    decoder (``.last_hidden_state``); with an empty prefix it is a plain forward.
    """
    rows, width = suffix.shape
    start = prefix.shape[-1]
    if start == 0:
        return model(input_ids=suffix, attention_mask=attention_mask)
    kw = cache_kwarg(model)
    out = model(input_ids=prefix.reshape(1, start), use_cache=True)
    cache = getattr(out, "cache", None)
    cache = out.past_key_values if cache is None else cache
    cache.batch_repeat_interleave(rows)
    positions = torch.arange(start, start + width, device=suffix.device).expand(rows, -1)
    return model(
        input_ids=suffix,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        **{kw: cache},
    )


def merged_weights(model: Any, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What peft's ``merge_and_unload`` of a copy of ``model`` would hold, from
    ``weights`` (the peft ``model``'s state dict, its own or one gathered from shards):
    each LoRA target's base weight plus its default adapter's ``B @ A × scaling``, under
    the base model's names; the other tensors are ``weights``' own."""
    targets = {
        name: module
        for name, module in model.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and "default" in module.scaling
    }
    if any(getattr(m, "use_dora", {}).get("default") for m in targets.values()):
        raise ValueError("merged_weights does not merge DoRA adapters")
    merged: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        if ".lora_" in key:
            continue
        owner = key.removesuffix(".base_layer.weight")
        if owner != key and owner in targets:
            a, b = (
                weights[f"{owner}.lora_A.default.weight"],
                weights[f"{owner}.lora_B.default.weight"],
            )
            delta = b.float() @ a.float()
            delta = delta.T if getattr(targets[owner], "fan_in_fan_out", False) else delta
            value = (value.float() + delta * targets[owner].scaling["default"]).to(value.dtype)
        merged[key.removeprefix("base_model.model.").replace(".base_layer.", ".")] = value
    return merged


def adapter_weights(
    model: Any, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A peft model's adapter tensors as ``save_pretrained`` writes them (names without
    the adapter's name), on the CPU; from ``weights`` (its state dict held elsewhere,
    e.g. gathered from shards) when given."""
    from peft import get_peft_model_state_dict

    chosen = get_peft_model_state_dict(model, state_dict=weights)
    return {k: v.detach().cpu().clone() for k, v in chosen.items()}


def adapter_config(model: Any) -> dict[str, Any]:
    """A peft model's adapter config as ``adapter_config.json`` holds it (JSON-safe)."""
    config = model.peft_config["default"].to_dict()
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
