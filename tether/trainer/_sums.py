"""What one optimizer step adds up over its micro-batches (:class:`StepSums`), the counts
the loss is divided by (:func:`aggregate_stats`) and the names of the policy loss's
metrics (:func:`metric_names`): the bookkeeping of ``_update.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tether.trainer import algorithms as A
from tether.trainer.config import TrainerConfig
from tether.trainer.distributed import Ranks
from tether.trainer.samples import Sample

__all__ = ["StepSums", "aggregate_stats", "metric_names"]


@dataclass
class StepSums:
    """What one optimizer step adds up over its micro-batches (and, with several
    processes, over every rank) before dividing by the tokens trained."""

    loss: float = 0.0
    gap_sum: float = 0.0
    gap_max: float = 0.0
    n_tokens: int = 0
    entropy_sum: float = 0.0
    #: the policy loss's metrics, token-weighted sums
    totals: dict[str, float] = field(default_factory=dict)

    def add(
        self,
        loss: float,
        logprobs: torch.Tensor,
        old: torch.Tensor,
        mask: torch.Tensor,
        entropy: torch.Tensor | None,
        metrics: dict[str, torch.Tensor],
    ) -> None:
        diff = (logprobs - old).abs() * mask
        tokens = mask.sum().item()
        self.loss += loss
        self.gap_sum += diff.sum().item()
        self.gap_max = max(self.gap_max, diff.max().item())
        self.n_tokens += int(tokens)
        if entropy is not None:
            self.entropy_sum += (entropy * mask).sum().item()
        for k, v in metrics.items():
            self.totals[k] = self.totals.get(k, 0.0) + float(v) * tokens

    def reduced(
        self,
        ranks: Ranks,
        params: list[torch.nn.Parameter],
        names: list[str],
        device: torch.device | None = None,
    ) -> StepSums:
        """The sums over every rank (and the gradients of ``params`` added up in place);
        ``names``: the metrics every rank reports, in one order; ``device``: where the
        collective's tensors live (the training group's device)."""
        local = [self.loss, self.gap_sum, self.n_tokens, self.entropy_sum]
        local += [self.totals.get(k, 0.0) for k in names]
        total, gap_max = ranks.reduce_step(params, local, self.gap_max, device)
        return StepSums(
            loss=total[0],
            gap_sum=total[1],
            gap_max=gap_max,
            n_tokens=round(total[2]),
            entropy_sum=total[3],
            totals=dict(zip(names, total[4:], strict=True)),
        )

    def metrics(self, *, entropy: bool) -> dict[str, float]:
        n = max(self.n_tokens, 1)
        return {
            "loss": self.loss,
            "logprob_gap": self.gap_sum / n,
            "logprob_gap_max": self.gap_max,
            "trained_tokens": float(self.n_tokens),
            **({"entropy": self.entropy_sum / n} if entropy else {}),
            **{k: v / n for k, v in self.totals.items()},
        }


def aggregate_stats(samples: list[Sample]) -> A.AggregateStats:
    """The counts :func:`algorithms.aggregate` divides by, over all ``samples``."""
    tokens, seqs, longest, per_rollout = 0, 0, 0, dict[int, int]()
    for s in samples:
        n = sum(1 for m in s.loss_mask if m)
        tokens, seqs, longest = tokens + n, seqs + int(n > 0), max(longest, n)
        per_rollout[s.rollout_index] = per_rollout.get(s.rollout_index, 0) + n
    return A.AggregateStats(tokens, seqs, per_rollout, longest)


def metric_names(cfg: TrainerConfig, reference: bool) -> list[str]:
    """The names of the policy loss's metrics (and ``kl_ref`` with a reference model), in a
    fixed order: what every rank adds up, even one without a sample this step."""
    z = torch.zeros(1, 1)
    _, metrics = A.POLICY_LOSSES[cfg.policy_loss](z, z, z[0], torch.ones(1, 1))
    return sorted([*metrics, *(["kl_ref"] if reference else [])])
