"""A stored run's updates: which groups each sync update trained, and their advantages.

Where a rollout belongs is its stored :class:`~tether.records.Place` (phase, step, group,
index), written by the code that opened it. :func:`step_groups` recomputes the groups
and advantages of each sync update exactly as the loop did: the groups of the update's
step whose rollouts all have a usable reward (with ``rollout.filter_groups``, the first
``batch_groups`` of them that carry signal), in group order, through the trainer's
``assign_credit`` with the run's ``trainer.advantage``, ``credit``, ``gamma``,
``turn_grouping`` and ``state_weight`` (each call's prompt state read from its stored
prompt ids). :func:`group_credit` credits one group the same way, for the dashboard: one
code path for what an update trained, what ``tether export`` writes and what the pages
show. :func:`place_kind` names a rollout's place in one word, as export and the dashboard
show it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tether.records import Phase, Rollout

if TYPE_CHECKING:
    from tether.store import Store
    from tether.trainer import RolloutRewards

__all__ = [
    "RunCredit",
    "StepGroups",
    "group_credit",
    "place_kind",
    "run_credit",
    "step_groups",
    "stored_rewards",
]


def place_kind(rollout: Rollout) -> str:
    """``train`` (a sync update), ``eval_sampled``, ``eval_greedy``, ``async`` or ``other``
    (opened through the admin API, or by ``tether serve``), from the stored place."""
    p = rollout.place
    if p is None:
        return "other"
    if p.phase is Phase.EVAL:
        return "eval_greedy" if p.greedy else "eval_sampled"
    return p.phase.value


@dataclass(frozen=True)
class RunCredit:
    """How a run's sync updates chose their groups and advantages (its config's values)."""

    estimator: str = "grpo"  # trainer.advantage
    credit: str = "trajectory"  # trainer.credit
    gamma: float = 1.0  # trainer.gamma
    signal_only: int | None = None  # rollout.filter_groups: rollout.batch_groups, else None
    #: roles: each role's loss weight, 0 for a frozen one (``trainer.samples.weigh_roles``)
    role_weights: dict[str, float] = field(default_factory=dict)
    grouping: str = "index"  # trainer.turn_grouping
    state_weight: float = 1.0  # trainer.state_weight

    @property
    def reads_calls(self) -> bool:
        """Whether credit needs each rollout's calls and intermediate rewards, not only its
        final reward: turn credit, or roles (each role's calls against its own baseline)."""
        return self.credit != "trajectory" or bool(self.role_weights)


@dataclass
class StepGroups:
    """One sync update's groups: ``kept`` (the trained ones, in group order) and their
    advantages (``advantages[i][j]`` of ``kept[i][j]``: a float, or per call seq with turn
    credit); ``dropped`` groups had an unusable rollout, or (``rollout.filter_groups``) no
    signal or no room left in the batch."""

    step: int
    kept: list[list[Rollout]]
    dropped: list[list[Rollout]]
    advantages: list[list[float | dict[int, float]]]
    zero_variance_groups: int


RewardsOf = Callable[[Rollout], "RolloutRewards"]


def step_groups(
    rollouts: list[Rollout], how: RunCredit | str, rewards_of: RewardsOf | None = None
) -> dict[int, StepGroups]:
    """The sync updates among ``rollouts`` (one run record's), by step, chosen and credited
    as the loop did (``tether/run/_learn.py``). ``how`` is the run's :class:`RunCredit` (or
    its estimator's name); ``rewards_of`` gives a usable rollout's rewards as credit needs
    them (its calls and intermediate rewards: needed for turn credit and roles)."""
    how = RunCredit(how) if isinstance(how, str) else how
    rewards_of = _reader(how, rewards_of)
    by_step: dict[int, dict[int, list[tuple[int, Rollout]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rollouts:
        p = r.place
        if p is not None and p.phase is Phase.TRAIN and p.step is not None and p.group is not None:
            by_step[p.step][p.group].append((p.index if p.index is not None else 0, r))
    out: dict[int, StepGroups] = {}
    for step, groups in sorted(by_step.items()):
        ordered = [[r for _, r in sorted(groups[g], key=lambda x: x[0])] for g in sorted(groups)]
        out[step] = _credited(step, ordered, how, rewards_of)
    return out


def group_credit(
    members: list[Rollout], how: RunCredit, store: Store | None = None
) -> dict[str, float | dict[int, float]] | None:
    """Each rollout's advantage in its group, rollout id → a float, or per call seq (turn
    credit, roles), as an update credits the group (:func:`step_groups`' code, the group
    alone, with or without signal); None when the group is dropped (a rollout without a
    usable reward or, with turn credit, a non-finite intermediate one) or not finished.
    Each rollout's calls and intermediate rewards come from ``store`` when credit needs
    them (:attr:`RunCredit.reads_calls`), else only its final reward is read."""
    if not members or not all(r.usable for r in members):
        return None
    reader = stored_rewards(store) if how.reads_calls and store is not None else None
    found = _credited(0, [members], replace(how, signal_only=None), _reader(how, reader))
    if not found.advantages:
        return None
    return {r.id: a for r, a in zip(members, found.advantages[0], strict=True)}


def stored_rewards(store: Store) -> RewardsOf:
    """``rollout → RolloutRewards`` of its last attempt as the store holds it: the final
    reward, the number of calls, the intermediate rewards added up per call."""
    from tether.trainer import RolloutRewards

    def of(r: Rollout) -> RolloutRewards:
        calls = store.calls(r.id, attempt=r.attempt)
        return RolloutRewards.of(float(r.reward or 0.0), calls, store.rewards(r.id), r.attempt)

    return of


def _reader(how: RunCredit, rewards_of: RewardsOf | None) -> RewardsOf:
    """``rewards_of``, or without one (trajectory credit, no roles) the final reward alone."""
    from tether.trainer import RolloutRewards

    if rewards_of is not None:
        return rewards_of
    if how.reads_calls:
        raise ValueError(
            f"credit {how.credit!r} with roles {sorted(how.role_weights)} needs each "
            "rollout's calls and rewards: pass rewards_of"
        )
    return lambda r: RolloutRewards(float(r.reward or 0.0))


def _credited(
    step: int, ordered: list[list[Rollout]], how: RunCredit, rewards_of: RewardsOf
) -> StepGroups:
    from tether.trainer import assign_credit, carries_signal

    rewards = {r.id: rewards_of(r) for g in ordered if all(r.usable for r in g) for r in g}
    kept = [
        g
        for g in ordered
        if all(r.id in rewards for r in g)
        and (how.credit != "turn" or all(rewards[r.id].finite for r in g))
    ]
    settings = (how.credit, how.gamma, how.grouping, how.state_weight)
    if how.signal_only is not None:
        kept = [g for g in kept if carries_signal([rewards[r.id] for r in g], *settings)]
        kept = kept[: how.signal_only]
    dropped = [g for g in ordered if g not in kept]
    advantages: list[list[float | dict[int, float]]] = []
    zero = 0
    if kept and (how.credit != "trajectory" or len({len(g) for g in kept}) == 1):
        credit = assign_credit([[rewards[r.id] for r in g] for g in kept], how.estimator, *settings)
        flat = iter(credit.advantages)
        advantages = [[next(flat) for _ in g] for g in kept]
        zero = credit.zero_variance_groups
    return StepGroups(step, kept, dropped, advantages, zero)


def run_credit(config: dict[str, Any]) -> RunCredit:
    """A run record's config as :class:`RunCredit` (the defaults for what it names not)."""
    trainer = config.get("trainer")
    trainer = trainer if isinstance(trainer, dict) else {}
    rollout = config.get("rollout")
    rollout = rollout if isinstance(rollout, dict) else {}
    batch = int(rollout.get("batch_groups") or 8)
    roles = config.get("roles")
    weights = {
        str(name): float(role.get("weight", 1.0)) if role.get("train", True) else 0.0
        for name, role in (roles if isinstance(roles, dict) else {}).items()
        if isinstance(role, dict)
    }
    return RunCredit(
        str(trainer.get("advantage") or "grpo"),
        str(trainer.get("credit") or "trajectory"),
        float(trainer.get("gamma", 1.0)),
        batch if rollout.get("filter_groups") else None,
        weights,
        str(trainer.get("turn_grouping") or "index"),
        float(trainer.get("state_weight", 1.0)),
    )
