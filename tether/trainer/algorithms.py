"""The RL math: policy losses, KL estimators, aggregation (advantages: advantages.py).

Pure tensor → tensor functions; this module imports torch and, of tether, only
the estimators it re-exports. Each family sits in a small registry chosen by name
from the config (``ADVANTAGE_ESTIMATORS``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``,
``AGGREGATION_MODES``), after verl's ``core_algos.py``.

Shapes: ``N`` rollouts in ``G`` groups (a group is the ``n`` rollouts of one
task); ``B`` rows (samples) of ``T`` token positions. Per-token tensors are
aligned with ``input_ids`` (see :mod:`tether.trainer.samples`): column ``t``
holds token ``t``'s log-probability; ``mask`` marks completion tokens.

Which logprobs go where: ``old`` = the engine's recorded ones (the behaviour
policy μ that sampled the tokens), ``logprobs`` = the trainer's π_θ (with grad).

- plain (``tis_cap`` = 0, the default): ``policy_loss(logprobs, old, adv, mask)``,
  the PPO ratio π_θ / μ taken against the engine. Where engine and trainer
  numerics differ (vLLM bf16 kernels vs an fp32 trainer) the ratio is not 1
  even before any update, and clipping fires on numerical noise.
- decoupled PPO with truncated importance sampling (``tis_cap`` > 0): the
  proximal policy ``prox`` = π_old, the trainer's own logprobs of the same
  tokens under the weights before this batch's first optimizer step (no
  grad). The ratio ρ = π_θ / π_old (``prox_logprobs=prox``) and its clip
  measure only the policy change made by the update; the engine-vs-trainer
  mismatch (numerics, or a stale engine in async mode) is corrected once, by
  the per-token weight ``w = min(π_old / μ, cap)`` (``is_weights=
  truncated_is_weights(prox, old, cap)``, stop-gradient) that multiplies the
  per-token loss: ``−min(ρ·A, clip(ρ)·A) · w``. The engine's logprobs never
  enter the ratio, so the correction is not applied twice. With the embedded
  engine (same weights and dtype) π_old ≈ μ and ``w`` ≈ 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from tether.trainer.advantages import (
    ADVANTAGE_ESTIMATORS,
    GroupAdvantages,
    compute_advantages,
    keyed_advantages,
    returns_to_go,
    state_advantages,
    turn_advantages,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AggregateStats",
    "GroupAdvantages",
    "PolicyLoss",
    "aggregate",
    "compute_advantages",
    "keyed_advantages",
    "masked_mean",
    "mismatch_metrics",
    "returns_to_go",
    "state_advantages",
    "truncated_is_weights",
    "turn_advantages",
]

# --------------------------------------------------------------------------- policy losses


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is nonzero (0 if none). Any matching shapes."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def _log_ratio(logprobs: Tensor, ref: Tensor, mask: Tensor) -> Tensor:
    """``logprobs − ref`` where ``mask``, else 0; clamped to ±20 so ``exp`` stays finite."""
    return torch.where(mask.bool(), logprobs - ref, torch.zeros_like(logprobs)).clamp(-20.0, 20.0)


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    a = advantages.to(like.dtype)
    return a.unsqueeze(-1).expand_as(like) if a.dim() == 1 else a


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    prox_logprobs: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with clip-higher (DAPO): per token
    ``−min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A) · w``.

    ``logprobs`` ``[B, T]`` (current policy, requires grad), ``old_logprobs``
    ``[B, T]`` (behaviour = engine), ``advantages`` ``[B]`` or ``[B, T]``, ``mask``
    ``[B, T]``. ``ρ = exp(logprobs − prox_logprobs)`` when ``prox_logprobs`` is
    given (decoupled PPO), else ``exp(logprobs − old_logprobs)``. ``w`` is
    ``is_weights`` ``[B, T]`` (detached, e.g. TIS) or 1. Returns the loss
    ``[B, T]`` (0 where masked; reduce it with :func:`aggregate`) and detached
    scalar metrics over masked tokens: ``clip_frac`` (the clipped branch is
    taken), ``clip_frac_low`` (of those, ρ < 1 − clip_low with A < 0: the
    policy already moved away from the token far enough), ``clip_frac_high``
    (ρ > 1 + clip_high with A > 0), ``ratio_mean``, ``approx_kl`` (k3 estimate
    of KL(behaviour ‖ current) = mean of ``ρ − 1 − log ρ`` against the same
    reference as ρ, at the weights ``logprobs`` came from, i.e. before the
    optimizer step this loss feeds).
    """
    base = old_logprobs if prox_logprobs is None else prox_logprobs
    log_ratio = _log_ratio(logprobs, base, mask)
    ratio = log_ratio.exp()
    adv = _per_token(advantages, logprobs)
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        loss = loss * is_weights.detach().to(loss.dtype)
    m = mask.bool()
    loss = torch.where(m, loss, torch.zeros_like(loss))
    with torch.no_grad():
        took_clip = clipped > unclipped
        metrics = {
            "clip_frac": masked_mean(took_clip.float(), m),
            "clip_frac_low": masked_mean((took_clip & (ratio < 1)).float(), m),
            "clip_frac_high": masked_mean((took_clip & (ratio > 1)).float(), m),
            "ratio_mean": masked_mean(ratio, m),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, m),
        }
    return loss, metrics


def reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    prox_logprobs: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Unclipped importance-weighted policy gradient, ``−ρ·A·w`` per token (the clip
    arguments are ignored); on-policy its gradient is ``−A·∇log π``. Shapes and
    metrics as :func:`ppo_clip_loss` (``clip_frac`` is 0)."""
    inf = float("inf")
    return ppo_clip_loss(
        logprobs, old_logprobs, advantages, mask, clip_low=inf, clip_high=inf,
        prox_logprobs=prox_logprobs, is_weights=is_weights,
    )  # fmt: skip


class PolicyLoss(Protocol):
    """Every policy loss takes the same arguments (a loss ignores what it does not use,
    e.g. :func:`reinforce_loss` the clip range), so a caller never branches on its name."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        clip_low: float = ...,
        clip_high: float = ...,
        prox_logprobs: Tensor | None = ...,
        is_weights: Tensor | None = ...,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo_clip": ppo_clip_loss,
    "reinforce": reinforce_loss,
}


def truncated_is_weights(
    trainer_logprobs: Tensor, engine_logprobs: Tensor, cap: float = 2.0
) -> Tensor:
    """TIS weights ``min(exp(trainer_old − engine), cap)``, detached. ``[B, T]`` → ``[B, T]``.

    Corrects the gradient for tokens sampled by an engine whose numerics differ
    from the trainer's (vLLM bf16 kernels vs a trainer in fp32, or a stale
    engine in async mode): the engine's distribution is the behaviour policy,
    the trainer's pre-update logprobs are the policy being trained. The cap
    bounds the variance. Multiply them into the loss via ``is_weights``.
    """
    log_w = (trainer_logprobs.detach() - engine_logprobs.detach()).clamp(max=20.0)
    return log_w.exp().clamp(max=cap)


def mismatch_metrics(
    trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """Trainer's recomputed vs the engine's recorded logprobs over masked tokens (the
    per-step self-check). ``[B, T]`` each → ``mean_abs_diff``, ``max_abs_diff``, ``kl_k3``."""
    with torch.no_grad():
        d = _log_ratio(trainer_logprobs.detach(), engine_logprobs, mask)
        m = mask.bool()
        return {
            "mean_abs_diff": masked_mean(d.abs(), m),
            "max_abs_diff": d.abs().max() if m.any() else d.new_zeros(()),
            "kl_k3": masked_mean(d.exp() - 1 - d, m),
        }


# --------------------------------------------------------------------------- KL to a reference


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = ``log π − log π_ref`` (unbiased, high variance, can be negative). ``[B, T]``."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ``½ (log π − log π_ref)²`` (biased, low variance, ≥ 0). ``[B, T]``."""
    return 0.5 * (logprobs - ref_logprobs).square()


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = ``exp(d) − d − 1`` with ``d = log π_ref − log π`` (unbiased, ≥ 0; the GRPO
    paper's choice). ``[B, T]``."""
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return d.exp() - d - 1


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


# --------------------------------------------------------------------------- aggregation

AGGREGATION_MODES = ("token_mean", "seq_mean", "rollout_mean", "seq_mean_token_sum_norm")


@dataclass(frozen=True)
class AggregateStats:
    """The whole batch's counts that :func:`aggregate` divides by.

    Build one per micro-batch with :meth:`of` and combine with :meth:`merge` (or
    ``+``); pass the total to every micro-batch's :func:`aggregate` call.
    """

    num_tokens: int = 0  # masked tokens
    num_seqs: int = 0  # rows with at least one masked token
    rollout_tokens: dict[int, int] = field(default_factory=dict)  # rollout index → masked tokens
    max_seq_tokens: int = 0  # the most masked tokens in one row (the longest completion)

    @property
    def num_rollouts(self) -> int:
        return sum(1 for n in self.rollout_tokens.values() if n > 0)

    @classmethod
    def of(cls, mask: Tensor, rollout_index: Tensor | None = None) -> AggregateStats:
        """Counts of one ``mask`` ``[B, T]`` with its ``rollout_index`` ``[B]``."""
        per_row = mask.detach().bool().sum(-1)
        per_rollout: dict[int, int] = {}
        if rollout_index is not None:
            for r, n in zip(rollout_index.tolist(), per_row.tolist(), strict=True):
                per_rollout[int(r)] = per_rollout.get(int(r), 0) + int(n)
        longest = int(per_row.max()) if per_row.numel() else 0
        return cls(int(per_row.sum()), int((per_row > 0).sum()), per_rollout, longest)

    def __add__(self, other: AggregateStats) -> AggregateStats:
        merged = dict(self.rollout_tokens)
        for r, n in other.rollout_tokens.items():
            merged[r] = merged.get(r, 0) + n
        return AggregateStats(
            self.num_tokens + other.num_tokens,
            self.num_seqs + other.num_seqs,
            merged,
            max(self.max_seq_tokens, other.max_seq_tokens),
        )

    @classmethod
    def merge(cls, parts: Iterable[AggregateStats]) -> AggregateStats:
        return sum(parts, cls())


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token_mean",
    *,
    rollout_index: Tensor | None = None,
    stats: AggregateStats | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token ``loss`` ``[B, T]`` under ``mask`` ``[B, T]`` to a scalar.

    - ``token_mean``: sum over all masked tokens / number of masked tokens.
    - ``seq_mean``: mean over rows of each row's token mean.
    - ``rollout_mean``: mean over rollouts of the token mean of that rollout's
      tokens (all its rows together), so a rollout weighs the same however
      many samples it was cut into. Needs ``rollout_index`` ``[B]``.
    - ``seq_mean_token_sum_norm`` (Dr. GRPO): sum / (``max_len`` · number of rows);
      ``max_len`` is a batch-level constant: given (e.g. the generation budget),
      else ``stats.max_seq_tokens``, the longest completion (masked tokens of one
      row) in the whole batch — never a micro-batch's padded width.

    Rows without masked tokens are not counted. Without ``stats`` the counts come
    from this batch. For gradient accumulation give every micro-batch the whole
    batch's ``stats`` (``AggregateStats.merge(AggregateStats.of(mask, rollout_index)
    for each micro-batch)``): each call returns its micro-batch's share, and the
    shares *sum* to the full-batch value in every mode; ``backward`` each, never
    divide by the number of micro-batches. (DDP averages over ranks: use counts
    summed over ranks and multiply by the world size.)
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"aggregation mode {mode!r} is unknown; choose one of {AGGREGATION_MODES}")
    m = mask.to(loss.dtype)
    if stats is None:
        stats = AggregateStats.of(mask, rollout_index)
    row_sum = (loss * m).sum(-1)  # [B]
    zero = (loss * 0).sum()  # keeps the graph when there is nothing to average
    if mode == "token_mean":
        return row_sum.sum() / stats.num_tokens if stats.num_tokens else zero
    if mode == "seq_mean":
        row_mean = row_sum / m.sum(-1).clamp(min=1)
        return row_mean.sum() / stats.num_seqs if stats.num_seqs else zero
    if mode == "seq_mean_token_sum_norm":
        norm = stats.max_seq_tokens if max_len is None else max_len
        if stats.num_seqs and norm <= 0:
            raise ValueError(f"seq_mean_token_sum_norm needs max_len > 0, not {norm}")
        return row_sum.sum() / (norm * stats.num_seqs) if stats.num_seqs else zero
    # rollout_mean
    if rollout_index is None:
        raise ValueError("rollout_mean needs rollout_index (one rollout id per row)")
    if stats.num_rollouts == 0:
        return zero
    denom = [max(stats.rollout_tokens.get(int(r), 0), 1) for r in rollout_index.tolist()]
    per_row_den = torch.tensor(denom, dtype=loss.dtype, device=loss.device)
    return (row_sum / per_row_den).sum() / stats.num_rollouts
