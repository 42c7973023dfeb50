"""Credit assignment: which advantage each call of a rollout trains with (``trainer.credit``).

- ``trajectory`` (the default): every call of a rollout gets the rollout's
  advantage, the final reward against its group (:func:`advantages.compute_advantages`
  over ``[groups, n]``, exactly the update tether has always made). Intermediate
  rewards are ignored.
- ``turn``: call ``k`` (its ``seq``, the turn index) gets the advantage of its own
  return-to-go, its and later calls' intermediate rewards plus the final reward,
  discounted by ``gamma`` per call (:func:`advantages.returns_to_go`), against the
  returns of the other rollouts of its group at the same turn index
  (:func:`advantages.turn_advantages`).

Intermediate rewards come from the store (the agent's ``POST /rollouts/{id}/reward``
with ``call_seq``, the grader's ``turn_rewards``); several for one call add up. A
turn's index is its call's ``seq``, failed calls included (their rewards count
toward earlier turns' returns; they train nothing themselves).

Roles (several agents in one run, each call recording the role named in its URL):
when a batch's calls name two or more roles (no role counts as one), a role's
calls are compared only with the same role's calls in their group's rollouts
(:func:`advantages.keyed_advantages`): ``trajectory`` compares the final rewards
of the group's rollouts that made a call of that role, ``turn`` the returns of
the role's own ``k``-th call (its turn index among the role's calls). With one
role or none the advantages are the ones above, bit for bit.

The results feed :func:`tether.trainer.build_samples`: a float per rollout
(trajectory) or a mapping ``seq → advantage`` (turn, or several roles), which
gives a merged sample one advantage per call's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from tether.records import Call, Reward
from tether.trainer import advantages as A

__all__ = [
    "CREDIT_MODES",
    "Credit",
    "RolloutRewards",
    "assign_credit",
    "call_roles",
    "carries_signal",
]

#: The values of ``trainer.credit``.
CREDIT_MODES = ("trajectory", "turn")


@dataclass(frozen=True)
class RolloutRewards:
    """What credit needs of one usable rollout."""

    reward: float  # the final reward (finite)
    num_turns: int = 1  # its calls (the last call's seq + 1)
    turn_rewards: Mapping[int, float] = field(default_factory=dict)  # call seq → reward
    #: The role of each call, by seq (``Call.role``); () or a missing seq: no role.
    roles: tuple[str | None, ...] = ()

    @classmethod
    def of(
        cls, reward: float, calls: Sequence[Call], rewards: Sequence[Reward], attempt: int
    ) -> RolloutRewards:
        """From the stored records of one attempt: its calls, and its rewards (the others'
        and the final one are skipped; several for one call add up)."""
        turns: dict[int, float] = {}
        for w in rewards:
            if w.attempt == attempt and w.call_seq is not None:
                turns[w.call_seq] = turns.get(w.call_seq, 0.0) + w.value
        turns_n = max((c.seq for c in calls), default=-1) + 1
        return cls(float(reward), turns_n, turns, call_roles(calls, turns_n))

    def role_of(self, seq: int) -> str | None:
        return self.roles[seq] if seq < len(self.roles) else None

    @property
    def finite(self) -> bool:
        """Whether every intermediate reward is a finite number (else turn credit drops it)."""
        return all(math.isfinite(v) for v in self.turn_rewards.values())


def call_roles(calls: Sequence[Call], num_turns: int) -> tuple[str | None, ...]:
    """The role of each call of a rollout by seq (``RolloutRewards.roles``); () without roles."""
    if all(c.role is None for c in calls):
        return ()
    roles: list[str | None] = [None] * num_turns
    for c in calls:
        roles[c.seq] = c.role
    return tuple(roles)


@dataclass(frozen=True)
class Credit:
    """One advantage per rollout (flat, in group order): a float (``trajectory``) or a
    mapping call ``seq`` → advantage (``turn``); and the groups that carry no signal."""

    advantages: list[float | dict[int, float]]
    zero_variance_groups: int


def assign_credit(
    groups: Sequence[Sequence[RolloutRewards]],
    estimator: str = "grpo",
    credit: str = "trajectory",
    gamma: float = 1.0,
) -> Credit:
    """The advantages of ``groups`` (each the rollouts of one task) under ``credit``."""
    if credit not in CREDIT_MODES:
        raise ValueError(f"credit {credit!r} is unknown; choose one of {CREDIT_MODES}")
    if len({r.role_of(k) for g in groups for r in g for k in range(r.num_turns)}) > 1:
        return _role_credit(groups, estimator, credit, gamma)
    if credit == "trajectory":
        rewards = torch.tensor([[r.reward for r in g] for g in groups], dtype=torch.float64)
        adv = A.compute_advantages(rewards, estimator)
        return Credit(adv.advantages.flatten().tolist(), adv.zero_variance_groups)
    flat = [r for g in groups for r in g]
    if not flat:
        return Credit([], 0)
    returns = _returns(flat, gamma)
    lengths = torch.tensor([r.num_turns for r in flat], dtype=torch.long)
    group = torch.tensor([g for g, rs in enumerate(groups) for _ in rs], dtype=torch.long)
    adv = A.turn_advantages(returns, lengths, group, estimator)
    rows = adv.advantages.tolist()
    per_call: list[float | dict[int, float]] = [
        {k: rows[i][k] for k in range(r.num_turns)} for i, r in enumerate(flat)
    ]
    return Credit(per_call, adv.zero_variance_groups)


def _returns(flat: Sequence[RolloutRewards], gamma: float) -> torch.Tensor:
    """``[N, K]`` every rollout's return-to-go per turn (:func:`advantages.returns_to_go`)."""
    if not all(r.finite for r in flat):
        raise ValueError("turn rewards must be finite; drop rollouts with NaN/inf rewards first")
    width = max(max(r.num_turns for r in flat), 1)
    turn = torch.zeros((len(flat), width), dtype=torch.float64)
    for i, r in enumerate(flat):
        for seq, value in r.turn_rewards.items():
            if not 0 <= seq < r.num_turns:
                raise ValueError(
                    f"a turn reward for call {seq} of a rollout with {r.num_turns} calls"
                )
            turn[i, seq] += value
    final = torch.tensor([r.reward for r in flat], dtype=torch.float64)
    lengths = torch.tensor([r.num_turns for r in flat], dtype=torch.long)
    return A.returns_to_go(turn, final, lengths, gamma)


def _role_credit(
    groups: Sequence[Sequence[RolloutRewards]], estimator: str, credit: str, gamma: float
) -> Credit:
    """Per-role baselines: one entry per (rollout, role) with its final reward
    (``trajectory``) or per call with its return (``turn``), compared within its (group,
    role) or (group, role, the role's turn index); a mapping seq → advantage per rollout."""
    flat = [(g, r) for g, rs in enumerate(groups) for r in rs]
    turn = credit == "turn"
    returns = _returns([r for _, r in flat], gamma).tolist() if turn else []
    keys: dict[tuple[object, ...], int] = {}  # (group, role[, turn index]) → comparison id
    values: list[float] = []
    key_ids: list[int] = []
    owners: list[int] = []
    where: list[dict[int, int]] = []  # per rollout: call seq → its entry
    for i, (g, r) in enumerate(flat):
        entry_of: dict[tuple[object, ...], int] = {}
        seen: dict[str | None, int] = {}  # calls of each role so far: the role's turn index
        calls: dict[int, int] = {}
        for seq in range(r.num_turns):
            role = r.role_of(seq)
            nth = seen[role] = seen.get(role, -1) + 1
            slot = (role, nth) if turn else (role,)
            if slot not in entry_of:
                entry_of[slot] = len(values)
                values.append(returns[i][seq] if turn else r.reward)
                key_ids.append(keys.setdefault((g, *slot), len(keys)))
                owners.append(g)
            calls[seq] = entry_of[slot]
        where.append(calls)
    adv = A.keyed_advantages(
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(key_ids, dtype=torch.long),
        torch.tensor(owners, dtype=torch.long),
        estimator,
    )
    out = adv.advantages.tolist()
    per_call: list[float | dict[int, float]] = [{s: out[e] for s, e in w.items()} for w in where]
    return Credit(per_call, adv.zero_variance_groups + len(groups) - adv.num_groups)


def carries_signal(
    group: Sequence[RolloutRewards], credit: str = "trajectory", gamma: float = 1.0
) -> bool:
    """Whether the group would teach anything: not every rollout's reward equal
    (``trajectory``), or at some turn not every return equal (``turn``). The same for
    every estimator (each gives a flat group all zeros)."""
    return assign_credit([group], "dr_grpo", credit, gamma).zero_variance_groups == 0
