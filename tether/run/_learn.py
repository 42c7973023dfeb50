"""What an update learns from: grade-filtered groups → advantages → samples, and their metrics.

Groups with any unusable reward are dropped (counted, never scored 0); the
kept groups' rewards become advantages per group (``trainer.advantage``), and
every rollout's calls become samples (prefix-merged, see
:mod:`tether.trainer.samples`). The update is skipped when nothing is left to
learn from (no kept group, every kept group with zero reward variance, or no
sample).
"""

from __future__ import annotations

from typing import Any

import torch

from tether.run._collect import RolloutOutcome
from tether.run._diagnostics import batch_diagnostics
from tether.trainer import algorithms as A
from tether.trainer.samples import build_samples

__all__ = ["learn_metrics"]


def learn_metrics(
    groups: list[list[RolloutOutcome]], advantage: str
) -> tuple[dict[str, float], list[Any]]:
    """(the batch's metrics, the samples to update on; empty: no update this step)."""
    kept = [g for g in groups if all(o.usable for o in g)]
    outcomes = [o for g in groups for o in g]
    rewards_all = [o.reward for o in outcomes if o.reward is not None]
    m: dict[str, float] = {
        "reward_mean": sum(rewards_all) / max(len(rewards_all), 1),
        "groups_dropped": float(len(groups) - len(kept)),
        "rollouts": float(len(outcomes)),
    }
    if not kept:
        return m, []
    rewards = torch.tensor([[o.reward for o in g] for g in kept], dtype=torch.float64)
    adv = A.compute_advantages(rewards, advantage)
    flat = [o for g in kept for o in g]
    samples, sstats = build_samples([o.calls for o in flat], adv.advantages.flatten().tolist())
    m["zero_variance_groups"] = float(adv.zero_variance_groups)
    m.update(batch_diagnostics(samples, len(flat), len(kept), adv.zero_variance_groups))
    m["merge_fraction"] = sstats.merge_fraction
    m["failed_calls"] = float(sstats.failed_calls)
    learns = adv.zero_variance_groups < len(kept) and samples
    return m, samples if learns else []
