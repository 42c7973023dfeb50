"""The update's forward pass: token logprobs of a micro-batch, memory-lean when asked.

:func:`forward_logprobs` runs the decoder to its last hidden states and applies
the LM head itself (``model.get_output_embeddings()``), so that with
``chunk_tokens`` the head runs a chunk of positions at a time and the full
``[B, L, V]`` logits never exist (:func:`token_logprobs_from_hidden`);
without it the head runs once over all positions, as ``model(...).logits`` does.

From logits to numbers, aligned as :mod:`tether.trainer.samples` says (column ``t`` is
token ``t``, read from the logits at ``t − 1``): :func:`token_logprobs`,
:func:`token_entropy`, both from one pass (:func:`token_logprobs_and_entropy`), and
both from the last hidden states with the head run chunk by chunk
(:func:`token_logprobs_from_hidden`). Each works in fp32 a few rows at a time, so
the fp32 ``[B, L, V]`` never exists at once.

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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tether._hf import cache_kwarg, cache_layers
from tether.errors import UserError

__all__ = [
    "MIN_SHARED_PREFIX",
    "enable_gradient_checkpointing",
    "forward_logprobs",
    "shared_prefix",
    "split_head",
    "token_entropy",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "token_logprobs_from_hidden",
]

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
    hidden = decoder(
        input_ids=ids[:, cut:],
        attention_mask=attn,
        position_ids=positions,
        use_cache=True,
        **{cache_kwarg(decoder): _read_only(cache)},
    ).last_hidden_state
    # The prefix's own output, weighted 0: the backward then passes through each prefix
    # layer's output as well as through its KV cache, which is where FSDP2's hooks gather
    # a sharded layer's weights for the backward (trainer/_fsdp.py). Same values.
    return hidden + 0.0 * out.last_hidden_state.sum()


#: Below this many shared tokens the plain forward is as fast.
MIN_SHARED_PREFIX = 16


def shared_prefix(ids: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """Length ``cut`` of the prefix that every row shares and that holds no loss token.

    Positions ``0..cut`` carry no loss (a token's logprob comes from the
    previous position's logits, so position ``cut`` itself needs no logits
    from the prefix), and ``ids[:, :cut]`` is identical in every row.
    """
    same = (ids == ids[:1]).all(dim=0)
    lcp = int(same.long().cumprod(0).sum())
    masked = loss_mask.bool().any(dim=0)
    first_loss = int(masked.float().argmax()) if bool(masked.any()) else ids.shape[1]
    return max(0, min(lcp, first_loss - 1))


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
    """Token logprobs ``[B, L]`` of ``ids`` (aligned as :func:`token_logprobs`),
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


# -- logits → logprobs and entropy ---------------------------------------------------


def _scaled_rows(
    logits: Tensor, temperature: Tensor | float, chunk_rows: int
) -> Iterator[tuple[int, int, Tensor, Tensor]]:
    """``(start, stop, z, lse)`` per chunk of rows: ``z = logits[start:stop, :-1] / T`` in
    fp32 (float64 if the logits are) and ``lse = logsumexp(z)`` ``[rows, L-1, 1]``. One
    chunk at a time, so the full fp32 ``[B, L, V]`` never exists at once."""
    b = logits.shape[0]
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    temps = torch.as_tensor(temperature, dtype=dtype, device=logits.device).expand(b)
    for start in range(0, b, chunk_rows):
        stop = min(start + chunk_rows, b)
        z = logits[start:stop, :-1].to(dtype) / temps[start:stop, None, None]
        yield start, stop, z, torch.logsumexp(z, dim=-1, keepdim=True)


def _aligned(rows: list[Tensor], logits: Tensor) -> Tensor:
    """Per-row ``[rows, L-1]`` results → ``[B, L]`` with a zero column 0 (token 0 has no
    previous position)."""
    b, length, _ = logits.shape
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    shifted = torch.cat(rows, dim=0) if rows else logits.new_zeros((0, length - 1), dtype=dtype)
    return torch.cat([shifted.new_zeros((b, 1)), shifted], dim=1)


def token_logprobs(
    logits: Tensor, input_ids: Tensor, temperature: Tensor | float = 1.0, chunk_rows: int = 1
) -> Tensor:
    """Log-probability of each token under ``log_softmax(logits / T)``, in fp32.

    ``logits`` ``[B, L, V]`` (any float dtype, as the model returns them),
    ``input_ids`` ``[B, L]``, ``temperature`` a float or ``[B]``. Returns ``[B, L]``
    float32 (float64 if the logits are): column ``t`` is token ``t``'s logprob from
    the logits at ``t − 1``; column 0 is 0. Computed ``chunk_rows`` rows at a time
    as ``logit[token] − logsumexp(logits)``, so the full fp32 ``[B, L, V]``
    log-softmax never exists at once. Differentiable.
    """
    return token_logprobs_and_entropy(logits, input_ids, temperature, chunk_rows, entropy=False)[0]


@torch.no_grad()
def token_entropy(logits: Tensor, temperature: Tensor | float = 1.0, chunk_rows: int = 1) -> Tensor:
    """Entropy (nats) of the next-token distribution ``softmax(logits / T)``, in fp32.

    The distribution at temperature ``T`` is the one the engine sampled from (the
    one :func:`token_logprobs` scores), not the raw ``softmax(logits)``. Aligned as
    :func:`token_logprobs`: ``[B, L]``, column ``t`` is the entropy of the
    distribution token ``t`` was drawn from (the logits at ``t − 1``), column 0
    is 0. Computed ``chunk_rows`` rows at a time as ``logsumexp(z) − Σ softmax(z)·z``
    (``z = logits / T``), so like :func:`token_logprobs` the fp32 ``[B, L, V]``
    never exists at once; no gradient.
    """
    rows = [_entropy(z, lse) for _, _, z, lse in _scaled_rows(logits, temperature, chunk_rows)]
    return _aligned(rows, logits)


def token_logprobs_and_entropy(
    logits: Tensor,
    input_ids: Tensor,
    temperature: Tensor | float = 1.0,
    chunk_rows: int = 1,
    *,
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs` and (with ``entropy``) :func:`token_entropy` from one pass:
    each chunk's scaled logits and logsumexp are computed once and serve both."""
    targets = input_ids[:, 1:].unsqueeze(-1)
    logps, ents = [], []
    for start, stop, z, lse in _scaled_rows(logits, temperature, chunk_rows):
        logps.append(z.gather(-1, targets[start:stop]).squeeze(-1) - lse[..., 0])
        if entropy:
            with torch.no_grad():
                ents.append(_entropy(z.detach(), lse.detach()))
    return _aligned(logps, logits), _aligned(ents, logits) if entropy else None


def _entropy(z: Tensor, lse: Tensor) -> Tensor:
    """``logsumexp(z) − Σ softmax(z)·z`` over the last axis (``lse`` keeps its last dim)."""
    return lse[..., 0] - ((z - lse).exp() * z).sum(-1)


def token_logprobs_from_hidden(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    input_ids: Tensor,
    temperature: Tensor | float = 1.0,
    chunk_tokens: int = 128,
    *,
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs_and_entropy` of ``head(hidden)``, without the full logits.

    ``hidden`` ``[B, L, H]`` are the decoder's last hidden states, ``head`` the LM
    head (``[N, H] → [N, V]``, e.g. ``model.get_output_embeddings()``, LoRA-wrapped
    or not), ``input_ids`` ``[B, L]``, ``temperature`` a float or ``[B]``. Returns
    the same ``[B, L]`` logprobs (and entropies) as
    ``token_logprobs_and_entropy(head(hidden), ...)``, aligned the same way.

    The head runs on ``chunk_tokens`` positions at a time. With gradients, each
    chunk is checkpointed (``torch.utils.checkpoint``, non-reentrant): the
    forward keeps only the chunk's hidden states, and the backward recomputes
    that chunk's logits, so at most one chunk's ``[chunk_tokens, V]`` logits
    and their gradient exist at once, never ``[B, L, V]``. The price is one more
    head matmul per chunk in the backward. The entropy has no gradient.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens ({chunk_tokens}) must be positive")
    b, length, width = hidden.shape
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    h = hidden[:, :-1].reshape(-1, width)
    targets = input_ids[:, 1:].reshape(-1, 1)
    temps = torch.as_tensor(temperature, dtype=dtype, device=hidden.device).expand(b)
    temps = temps[:, None].expand(b, length - 1).reshape(-1, 1)

    def chunk(h: Tensor, targets: Tensor, temps: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h)
        # in place where the head's output is ours alone: one [chunk, V] tensor, not two
        z = logits.div_(temps) if logits.dtype == dtype else logits.to(dtype) / temps
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        logp = z.gather(-1, targets)[:, 0] - lse[:, 0]
        if not entropy:
            return logp, logp.new_zeros(())
        with torch.no_grad():  # lse − Σ p·z with one [chunk, V] temporary
            p = (z.detach() - lse.detach()).exp_()
            return logp, lse.detach()[:, 0] - p.mul_(z.detach()).sum(-1)

    grad = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in getattr(head, "parameters", list)())
    )
    logps, ents = [], []
    for start in range(0, h.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (h[part], targets[part], temps[part])
        lp, ent = checkpoint(chunk, *args, use_reentrant=False) if grad else chunk(*args)
        logps.append(lp)
        ents.append(ent)

    def aligned(parts: list[Tensor]) -> Tensor:
        flat = torch.cat(parts) if parts else h.new_zeros((0,), dtype=dtype)
        return torch.cat([flat.new_zeros((b, 1)), flat.reshape(b, length - 1)], dim=1)

    return aligned(logps), aligned(ents) if entropy else None
