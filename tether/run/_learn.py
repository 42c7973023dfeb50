"""What an update learns from: grade-filtered groups → advantages → samples, and their metrics.

Groups with any unusable reward are dropped (counted, never scored 0; with
``trainer.credit: turn`` an intermediate reward that is not a finite number
makes its rollout unusable too); the kept groups' rewards become advantages
(``trainer.advantage``, per rollout or per call as ``trainer.credit`` says, see
:mod:`tether.trainer.credit`), and every rollout's calls become samples
(prefix-merged, see :mod:`tether.trainer.samples`). With ``rollout.filter_groups``
only the first ``batch_groups`` kept groups that carry signal are trained
(``_filter_groups.py`` sampled more of them). The update is skipped when nothing is
left to learn from (no kept group, every kept group with zero reward variance,
or no sample).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.run._collect import RolloutOutcome
from tether.run._diagnostics import batch_diagnostics
from tether.run.config import TrainConfig
from tether.trainer.credit import (
    RolloutRewards,
    assign_credit,
    call_prompts,
    call_roles,
    carries_signal,
)
from tether.trainer.samples import build_samples, weigh_roles

__all__ = ["Learning", "has_signal", "learn_metrics", "rollout_rewards", "trainable"]


@dataclass(frozen=True)
class Learning:
    """How an update assigns credit and which groups it trains (the run config's values)."""

    advantage: str = "grpo"  # trainer.advantage
    credit: str = "trajectory"  # trainer.credit
    gamma: float = 1.0  # trainer.gamma
    #: rollout.filter_groups: train only groups that carry signal, at most this many
    #: (rollout.batch_groups); None = every kept group.
    signal_only: int | None = None
    #: Each configured role's loss weight (0: frozen, its samples are not trained).
    role_weights: Mapping[str, float] = field(default_factory=dict)
    grouping: str = "index"  # trainer.turn_grouping
    state_weight: float = 1.0  # trainer.state_weight

    @classmethod
    def of(cls, cfg: TrainConfig) -> Learning:
        t, r = cfg.trainer, cfg.rollout
        weights = {n: role.weight if role.train else 0.0 for n, role in cfg.roles.items()}
        only = r.batch_groups if r.filter_groups else None
        return cls(t.advantage, t.credit, t.gamma, only, weights, t.turn_grouping, t.state_weight)


def rollout_rewards(o: RolloutOutcome) -> RolloutRewards:
    """What credit needs of a usable outcome."""
    assert o.reward is not None
    turns = max((c.seq for c in o.calls), default=-1) + 1
    return RolloutRewards(
        o.reward, turns, o.turn_rewards, call_roles(o.calls, turns), call_prompts(o.calls, turns)
    )


def trainable(group: list[RolloutOutcome], credit: str) -> bool:
    """Every rollout usable (and, for turn credit, every intermediate reward finite)."""
    if not all(o.usable for o in group):
        return False
    return credit != "turn" or all(rollout_rewards(o).finite for o in group)


def learn_metrics(
    groups: list[list[RolloutOutcome]], how: Learning | str = "grpo"
) -> tuple[dict[str, float], list[Any]]:
    """(the batch's metrics, the samples to update on; empty: no update this step).

    ``how`` is a :class:`Learning`, or just the estimator's name (trajectory credit)."""
    how = Learning(how) if isinstance(how, str) else how
    kept = [g for g in groups if trainable(g, how.credit)]
    outcomes = [o for g in groups for o in g]
    rewards_all = [o.reward for o in outcomes if o.reward is not None]
    m: dict[str, float] = {
        "reward_mean": sum(rewards_all) / max(len(rewards_all), 1),
        "groups_dropped": float(len(groups) - len(kept)),
        "rollouts": float(len(outcomes)),
    }
    if how.signal_only is not None:
        signal = [g for g in kept if has_signal(g, how)]
        m["groups_no_signal"] = float(len(kept) - len(signal))
        m["groups_surplus"] = float(max(len(signal) - how.signal_only, 0))
        kept = signal[: how.signal_only]
        m["groups_kept"] = float(len(kept))
    if not kept:
        return m, []
    credit = assign_credit(
        [[rollout_rewards(o) for o in g] for g in kept],
        how.advantage,
        how.credit,
        how.gamma,
        how.grouping,
        how.state_weight,
    )
    flat = [o for g in kept for o in g]
    samples, sstats = build_samples([o.calls for o in flat], credit.advantages)
    built = len(samples)
    samples = weigh_roles(samples, how.role_weights)
    if how.role_weights:
        m["samples_frozen"] = float(built - len(samples))
    m["zero_variance_groups"] = float(credit.zero_variance_groups)
    m.update(batch_diagnostics(samples, len(flat), len(kept), credit.zero_variance_groups))
    m["merge_fraction"] = sstats.merge_fraction
    m["rollouts_one_sample"] = float(sstats.one_sample_rollouts)
    m["rollouts_forked"] = float(sstats.forked_rollouts)
    m["failed_calls"] = float(sstats.failed_calls)
    learns = credit.zero_variance_groups < len(kept) and samples
    return m, samples if learns else []


def has_signal(group: list[RolloutOutcome], how: Learning) -> bool:
    """Whether a trainable group would teach anything under ``how``'s credit."""
    rewards = [rollout_rewards(o) for o in group]
    return carries_signal(rewards, how.credit, how.gamma, how.grouping, how.state_weight)
