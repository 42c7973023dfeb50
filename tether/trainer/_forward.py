"""The update's forward pass: token logprobs of a micro-batch, memory-lean when asked.

:func:`forward_logprobs` runs the decoder to its last hidden states and applies
the LM head itself (``model.get_output_embeddings()``), so that with
``chunk_tokens`` the head runs a chunk of positions at a time and the full
``[B, L, V]`` logits never exist (:func:`tether.trainer.samples.token_logprobs_from_hidden`);
without it the head runs once over all positions, as ``model(...).logits`` does.

Rows that share a prompt prefix run it once (batch size 1) and attend to its
KV cache from the suffix pass. The suffix pass reads that cache and never
writes to it (:func:`_read_only`), which is what lets it run under gradient
checkpointing: transformers drops a cache from a checkpointed layer, because
a layer that *writes* would write twice when the backward replays it; a
layer that only reads may keep it (``_can_checkpoint_with_cache``). The prefix
pass itself (one row) runs without checkpointing.

:func:`enable_gradient_checkpointing` turns on transformers' activation
checkpointing, non-reentrant: with the reentrant variant gradients would not
reach the prefix's KV cache (a tensor captured by the layer, not one of its
inputs), and a LoRA model would need peft's ``enable_input_require_grads``
trick (frozen embeddings give the first checkpointed layer an input without
``requires_grad``); non-reentrant checkpointing needs neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from tether._hf import cache_kwarg, cache_layers
from tether.errors import UserError
from tether.trainer.samples import token_logprobs_and_entropy, token_logprobs_from_hidden

__all__ = ["enable_gradient_checkpointing", "forward_logprobs", "split_head"]

#: configs whose causal-LM forward does more than ``head(decoder(x))`` (Gemma's soft cap,
#: Cohere's scale): their logits come from the model's own forward, never chunked.
_LOGIT_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def split_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, head)`` of a transformers causal LM (peft wrappers unwrapped; the LoRA
    layers stay inside), such that ``model(x).logits == head(decoder(x).last_hidden_state)``;
    None when the model is not one (its own forward is used then)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (hasattr(base, "get_decoder") and hasattr(base, "get_output_embeddings")):
        return None
    config = getattr(base, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_EXTRAS):
        return None
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if decoder is base or head is None:
        return None
    return decoder, head


def enable_gradient_checkpointing(model: Any, every_n_layers: int = 1) -> None:
    """transformers' activation checkpointing (non-reentrant) on every ``every_n_layers``-th
    decoder layer, on a plain or peft model; the layers keep the read-only prefix cache
    (module doc)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x
        base.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers
        )
    elif every_n_layers == 1:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise UserError(
            f"trainer.checkpoint_every_n_layers ({every_n_layers}) needs transformers >= 5.2 "
            "(activation_checkpointing_enable): upgrade transformers, or set it to 1"
        )
    for module in base.modules():
        if getattr(module, "gradient_checkpointing", False) and hasattr(
            module, "_can_checkpoint_with_cache"
        ):
            module._can_checkpoint_with_cache = True


@contextmanager
def _checkpointing_off(model: Any) -> Iterator[None]:
    on = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in on:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in on:
            m.gradient_checkpointing = True


def _read_only(cache: Any) -> Any:
    """``cache`` (a DynamicCache) made to return ``prefix + new`` keys/values without storing
    the new ones: a checkpointed layer may then run twice on it (module docstring)."""
    layers = cache_layers(cache)

    def update(keys: Tensor, values: Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        k, v = layers[layer_idx]
        return torch.cat([k, keys], dim=-2), torch.cat([v, values], dim=-2)

    cache.update = update
    return cache


def _hidden(decoder: Any, ids: Tensor, attn: Tensor, cut: int) -> Tensor:
    """Last hidden states ``[B, L − cut, H]`` of ``ids[:, cut:]``, each row read after the
    shared ``ids[0, :cut]`` (run once); ``cut`` 0: a plain forward."""
    if cut == 0:
        return decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    rows, width = ids.shape[0], ids.shape[1] - cut
    with _checkpointing_off(decoder):
        out = decoder(input_ids=ids[:1, :cut], use_cache=True)
    cache = getattr(out, "cache", None)
    cache = out.past_key_values if cache is None else cache
    cache.batch_repeat_interleave(rows)
    positions = torch.arange(cut, cut + width, device=ids.device).expand(rows, -1)
    return decoder(
        input_ids=ids[:, cut:],
        attention_mask=attn,
        position_ids=positions,
        use_cache=True,
        **{cache_kwarg(decoder): _read_only(cache)},
    ).last_hidden_state


def forward_logprobs(
    model: Any,
    ids: Tensor,
    attn: Tensor,
    temps: Tensor,
    *,
    cut: int = 0,
    chunk_tokens: int = 0,
    entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Token logprobs ``[B, L]`` of ``ids`` (aligned as in :mod:`tether.trainer.samples`),
    and with ``entropy`` the next-token entropies ``[B, L]``, else None.

    ``cut`` > 0: ``ids[:, :cut]`` is a prefix every row shares, with no loss token
    (see ``shared_prefix``); its columns come out 0. ``chunk_tokens`` > 0: the LM
    head runs that many positions at a time (no ``[B, L, V]`` logits); 0: at once.
    """
    parts = split_head(model)
    if parts is None:  # not a transformers causal LM: its own forward, its full logits
        from tether._hf import shared_prefix_forward

        out = shared_prefix_forward(model, ids[0, :cut], ids[:, cut:], attn)
        lp, ent = token_logprobs_and_entropy(out.logits, ids[:, cut:], temps, entropy=entropy)
    else:
        decoder, head = parts
        hidden = _hidden(decoder, ids, attn, cut)
        if chunk_tokens > 0:
            lp, ent = token_logprobs_from_hidden(
                hidden, head, ids[:, cut:], temps, chunk_tokens, entropy=entropy
            )
        else:
            logits = head(hidden)
            lp, ent = token_logprobs_and_entropy(logits, ids[:, cut:], temps, entropy=entropy)
    if cut == 0:
        return lp, ent
    pad = lp.new_zeros(ids.shape[0], cut)
    return torch.cat([pad, lp], dim=1), torch.cat([pad, ent], 1) if ent is not None else None
