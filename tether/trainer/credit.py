"""Credit assignment: which advantage each call of a rollout trains with (``trainer.credit``).

- ``trajectory`` (the default): every call of a rollout gets the rollout's
  advantage, the final reward against its group (:func:`advantages.compute_advantages`
  over ``[groups, n]``, exactly the update tether has always made). Intermediate
  rewards are ignored.
- ``turn``: call ``k`` (its ``seq``, the turn index) gets the advantage of its own
  return-to-go, its and later calls' intermediate rewards plus the final reward,
  discounted by ``gamma`` per call (:func:`advantages.returns_to_go`), against the
  returns of the other rollouts of its group at the same turn index
  (:func:`advantages.turn_advantages`). With ``trainer.turn_grouping: state``
  (GiGPO) the comparison is instead with the calls of the group whose prompt is
  identical token for token, added to the trajectory advantage:
  ``A = A_episode + state_weight · A_step`` (:func:`advantages.state_advantages`).

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
    "TURN_GROUPINGS",
    "Credit",
    "RolloutRewards",
    "assign_credit",
    "call_prompts",
    "call_roles",
    "carries_signal",
]

#: The values of ``trainer.credit``.
CREDIT_MODES = ("trajectory", "turn")
#: The values of ``trainer.turn_grouping``: which calls a turn's return is compared with.
TURN_GROUPINGS = ("index", "state")


@dataclass(frozen=True)
class RolloutRewards:
    """What credit needs of one usable rollout."""

    reward: float  # the final reward (finite)
    num_turns: int = 1  # its calls (the last call's seq + 1)
    turn_rewards: Mapping[int, float] = field(default_factory=dict)  # call seq → reward
    #: The role of each call, by seq (``Call.role``); () or a missing seq: no role.
    roles: tuple[str | None, ...] = ()
    #: The prompt token ids of each call, by seq (``Call.prompt_ids``): the state that
    #: ``turn_grouping: state`` groups by; () or a missing seq: a state no other call has.
    prompts: tuple[tuple[int, ...] | None, ...] = ()

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
        return cls(
            float(reward),
            turns_n,
            turns,
            call_roles(calls, turns_n),
            call_prompts(calls, turns_n),
        )

    def prompt_of(self, seq: int) -> tuple[int, ...] | None:
        return self.prompts[seq] if seq < len(self.prompts) else None

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


def call_prompts(calls: Sequence[Call], num_turns: int) -> tuple[tuple[int, ...] | None, ...]:
    """The prompt token ids of each call of a rollout by seq (``RolloutRewards.prompts``)."""
    prompts: list[tuple[int, ...] | None] = [None] * num_turns
    for c in calls:
        prompts[c.seq] = tuple(c.prompt_ids)
    return tuple(prompts)


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
    grouping: str = "index",
    state_weight: float = 1.0,
) -> Credit:
    """The advantages of ``groups`` (each the rollouts of one task) under ``credit``; with
    ``turn``, ``grouping`` says which calls a call is compared with (``index``: the same
    turn index; ``state``: the identical prompt, weighted by ``state_weight``)."""
    if credit not in CREDIT_MODES:
        raise ValueError(f"credit {credit!r} is unknown; choose one of {CREDIT_MODES}")
    if grouping not in TURN_GROUPINGS:
        raise ValueError(f"grouping {grouping!r} is unknown; choose one of {TURN_GROUPINGS}")
    if grouping == "state":
        if credit != "turn":
            raise ValueError("grouping 'state' compares calls: use it with credit 'turn'")
        return _state_credit(groups, estimator, gamma, state_weight)
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


def _state_credit(
    groups: Sequence[Sequence[RolloutRewards]], estimator: str, gamma: float, weight: float
) -> Credit:
    """GiGPO: per call, its rollout's trajectory advantage (per role with roles) plus
    ``weight`` × its return against the returns of the calls of its group (and role) whose
    prompt is identical; a mapping seq → advantage per rollout."""
    flat = [(g, r) for g, rs in enumerate(groups) for r in rs]
    if not flat:
        return Credit([], 0)
    episode = _episode_advantages(groups, estimator)
    returns = _returns([r for _, r in flat], gamma).tolist()
    keys: dict[tuple[object, ...], int] = {}  # (group, role, prompt) → state id
    values: list[float] = []
    states: list[int] = []
    owners: list[int] = []
    episodes: list[float] = []
    for i, (g, r) in enumerate(flat):
        ep = episode[i]
        for seq in range(r.num_turns):
            prompt = r.prompt_of(seq)
            state = (g, r.role_of(seq), prompt) if prompt is not None else ("alone", i, seq)
            values.append(returns[i][seq])
            states.append(keys.setdefault(state, len(keys)))
            owners.append(g)
            episodes.append(ep[seq] if isinstance(ep, dict) else float(ep))
    adv = A.state_advantages(
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(states, dtype=torch.long),
        torch.tensor(owners, dtype=torch.long),
        torch.tensor(episodes, dtype=torch.float64),
        weight,
        estimator,
    )
    out = iter(adv.advantages.tolist())
    per_call: list[float | dict[int, float]] = [
        {seq: next(out) for seq in range(r.num_turns)} for _, r in flat
    ]
    return Credit(per_call, adv.zero_variance_groups + len(groups) - adv.num_groups)


def _episode_advantages(
    groups: Sequence[Sequence[RolloutRewards]], estimator: str
) -> list[float | dict[int, float]]:
    """``trajectory`` credit of groups of any sizes (per role when calls name roles)."""
    if len({r.role_of(k) for g in groups for r in g for k in range(r.num_turns)}) > 1:
        return assign_credit(groups, estimator, "trajectory").advantages
    rewards = torch.tensor([r.reward for g in groups for r in g], dtype=torch.float64)
    index = torch.tensor([g for g, rs in enumerate(groups) for _ in rs], dtype=torch.long)
    return list(A.compute_advantages(rewards, estimator, group_index=index).advantages.tolist())


def carries_signal(
    group: Sequence[RolloutRewards],
    credit: str = "trajectory",
    gamma: float = 1.0,
    grouping: str = "index",
    state_weight: float = 1.0,
) -> bool:
    """Whether the group would teach anything: not every rollout's reward equal
    (``trajectory``), or at some turn not every return equal (``turn``; with ``state``
    grouping: not every final reward equal, or some state's returns differ). The same for
    every estimator (each gives a flat group all zeros)."""
    credited = assign_credit([group], "dr_grpo", credit, gamma, grouping, state_weight)
    return credited.zero_variance_groups == 0
