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
or no sample). :func:`learn_metrics` also says each group's fate (kept, or dropped and
why) with the kept ones' advantages; the run stores them as the update's
:class:`~tether.records.UpdateRecord` (:func:`update_record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from tether.records import GroupFate, UpdateGroup, UpdateRecord
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

__all__ = [
    "Learned",
    "Learning",
    "decided",
    "has_signal",
    "learn_metrics",
    "rollout_rewards",
    "trainable",
    "update_record",
]


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


class Learned(NamedTuple):
    """What an update learns from its groups: the batch's metrics, the samples (empty: no
    update this step) and each group's fate, the kept ones with their advantages."""

    metrics: dict[str, float]
    samples: list[Any]
    groups: list[UpdateGroup]


def decided(group: list[RolloutOutcome], fate: GroupFate, advantages: Any = None) -> UpdateGroup:
    """``group``'s fate as an update records it (its number, its rollouts in order)."""
    number = group[0].group if group else -1
    ids = tuple(o.rollout_id for o in group)
    return UpdateGroup(number, ids, fate, None if advantages is None else tuple(advantages))


def _fates(
    groups: list[list[RolloutOutcome]], how: Learning
) -> tuple[list[list[RolloutOutcome]], dict[int, GroupFate]]:
    """(the groups to learn from, each dropped group's fate by its position)."""
    fates: dict[int, GroupFate] = {}
    kept: list[int] = []
    for i, g in enumerate(groups):
        if not trainable(g, how.credit):
            fates[i] = GroupFate.UNUSABLE
        elif how.signal_only is not None and not has_signal(g, how):
            fates[i] = GroupFate.NO_SIGNAL
        elif how.signal_only is not None and len(kept) >= how.signal_only:
            fates[i] = GroupFate.SURPLUS
        else:
            kept.append(i)
    return [groups[i] for i in kept], fates


def learn_metrics(groups: list[list[RolloutOutcome]], how: Learning | str = "grpo") -> Learned:
    """The batch's metrics, the samples to update on and each group's fate.

    ``how`` is a :class:`Learning`, or just the estimator's name (trajectory credit)."""
    how = Learning(how) if isinstance(how, str) else how
    kept, fates = _fates(groups, how)
    dropped = [decided(g, fates[i]) for i, g in enumerate(groups) if i in fates]
    outcomes = [o for g in groups for o in g]
    rewards_all = [o.reward for o in outcomes if o.reward is not None]
    m: dict[str, float] = {
        "reward_mean": sum(rewards_all) / max(len(rewards_all), 1),
        "groups_dropped": float(sum(f is GroupFate.UNUSABLE for f in fates.values())),
        "rollouts": float(len(outcomes)),
    }
    if how.signal_only is not None:
        m["groups_no_signal"] = float(sum(f is GroupFate.NO_SIGNAL for f in fates.values()))
        m["groups_surplus"] = float(sum(f is GroupFate.SURPLUS for f in fates.values()))
        m["groups_kept"] = float(len(kept))
    if not kept:
        return Learned(m, [], dropped)
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
    per = iter(credit.advantages)
    trained = [decided(g, GroupFate.KEPT, [next(per) for _ in g]) for g in kept]
    ordered = sorted(dropped + trained, key=lambda u: u.group)
    return Learned(m, samples if learns else [], ordered)


def has_signal(group: list[RolloutOutcome], how: Learning) -> bool:
    """Whether a trainable group would teach anything under ``how``'s credit."""
    rewards = [rollout_rewards(o) for o in group]
    return carries_signal(rewards, how.credit, how.gamma, how.grouping, how.state_weight)


def update_record(
    run_id: str, step: int, version: int | None, how: Learning, groups: list[UpdateGroup]
) -> UpdateRecord:
    """Update ``step``'s record: ``groups`` (every group decided at it) in group order."""
    credit = {**asdict(how), "role_weights": dict(how.role_weights)}
    return UpdateRecord(run_id, step, version, credit, sorted(groups, key=lambda u: u.group))
