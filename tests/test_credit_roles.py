"""Per-role baselines (several agents in one run): a role's calls are compared only with
the same role's calls of their group, against plain loops; with one role, or none, the
credit is exactly the credit without roles; a role never shares a sample with another."""

from __future__ import annotations

import random

import pytest

from tests.test_algorithms import ref_advantages
from tests.test_credit import ref_returns
from tether.records import Call
from tether.trainer import RolloutRewards, assign_credit
from tether.trainer.algorithms import ADVANTAGE_ESTIMATORS
from tether.trainer.samples import build_samples

ROLES = ("solver", "critic", None)


def _groups(seed: int) -> list[list[RolloutRewards]]:
    """Ragged groups of rollouts whose calls have random roles and turn rewards."""
    rng = random.Random(seed)
    groups = []
    for _ in range(4):
        group = []
        for _ in range(rng.randint(2, 5)):
            n = rng.randint(0, 5)
            roles = tuple(rng.choice(ROLES) for _ in range(n))
            turns = {k: rng.choice([0.0, 0.5, -1.0]) for k in range(n) if rng.random() < 0.3}
            group.append(RolloutRewards(rng.choice([0.0, 1.0, 0.25]), n, turns, roles))
        groups.append(group)
    solver_only = (("solver",) * 2, ("critic",))  # one solver rollout, one critic: no baseline
    groups.append(
        [RolloutRewards(1.0, 2, {}, solver_only[0]), RolloutRewards(0.0, 1, {}, solver_only[1])]
    )
    return groups


def ref_role_credit(
    groups: list[list[RolloutRewards]], name: str, turn: bool, gamma: float = 1.0
) -> list[dict[int, float]]:
    """Each call's advantage by a loop: per group, per role (and per the role's turn index
    with ``turn``), the entries of the group's rollouts that reach it form one cell."""
    cells: list[list[float]] = []
    cell_of: dict[tuple, int] = {}
    entries: list[list[tuple[int, int]]] = []  # per rollout, per call: (cell, position)
    for g, rollouts in enumerate(groups):
        for r in rollouts:
            G = ref_returns(
                [r.turn_rewards.get(k, 0.0) for k in range(r.num_turns)], r.reward, gamma
            )
            counts: dict[str | None, int] = {}
            mine: list[tuple[int, int]] = []
            placed: dict[tuple, tuple[int, int]] = {}
            for k in range(r.num_turns):
                role = r.roles[k]
                nth = counts[role] = counts.get(role, -1) + 1
                key = (g, role, nth) if turn else (g, role)
                if key not in placed:
                    c = cell_of.setdefault(key, len(cells))
                    if c == len(cells):
                        cells.append([])
                    placed[key] = (c, len(cells[c]))
                    cells[c].append(G[k] if turn else r.reward)
                mine.append(placed[key])
            entries.append(mine)
    adv = ref_advantages(cells, name)
    return [{k: adv[c][p] for k, (c, p) in enumerate(mine)} for mine in entries]


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("credit", ["trajectory", "turn"])
def test_per_role_advantages_match_a_loop_over_groups_and_roles(name: str, credit: str) -> None:
    for seed in range(3):
        groups = _groups(seed)
        got = assign_credit(groups, name, credit, gamma=0.9)
        ref = ref_role_credit(groups, name, credit == "turn", gamma=0.9)
        assert len(got.advantages) == len(ref)
        for a, b in zip(got.advantages, ref, strict=True):
            assert isinstance(a, dict) and a.keys() == b.keys()
            assert list(a.values()) == pytest.approx(list(b.values()), abs=1e-9)


def test_a_roles_calls_are_compared_only_with_the_same_roles() -> None:
    """Two rollouts both call the solver; only the first calls the critic: the critic's
    call has no baseline (0), the solvers' calls are compared with each other."""
    a = RolloutRewards(1.0, 2, {}, ("solver", "critic"))
    b = RolloutRewards(0.0, 1, {}, ("solver",))
    got = assign_credit([[a, b]], "dr_grpo")
    assert got.advantages == [{0: 0.5, 1: 0.0}, {0: -0.5}]
    assert got.zero_variance_groups == 0
    flat = assign_credit([[a, RolloutRewards(1.0, 1, {}, ("solver",))]], "dr_grpo")
    assert flat.zero_variance_groups == 1  # every role's comparison is flat
    empty = assign_credit([[a, b], [RolloutRewards(1.0, 0), RolloutRewards(0.0, 0)]], "grpo")
    assert empty.zero_variance_groups == 1  # a group without calls teaches nothing


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("credit", ["trajectory", "turn"])
def test_one_role_gives_exactly_the_credit_without_roles(name: str, credit: str) -> None:
    groups = [g[:2] for g in _groups(7)]  # equal groups, as the trajectory path takes
    bare = [[RolloutRewards(r.reward, r.num_turns, r.turn_rewards) for r in g] for g in groups]
    one = [[RolloutRewards(r.reward, r.num_turns, r.turn_rewards, ("solver",) * r.num_turns)
            for r in g] for g in groups]  # fmt: skip
    assert assign_credit(one, name, credit, 0.9) == assign_credit(bare, name, credit, 0.9)


def _call(seq: int, prompt: list[int], completion: list[int], role: str | None) -> Call:
    return Call("r", seq, prompt, completion, [-0.5] * len(completion), 0, role=role)


def test_calls_of_different_roles_are_different_samples_with_their_own_advantages() -> None:
    """The critic's call extends the solver's tokens but is its own sample (other weights
    may serve it); the solver's next call still merges with its first."""
    calls = [
        _call(0, [1, 2], [3], "solver"),
        _call(1, [1, 2, 3, 4], [5], "critic"),  # extends call 0's tokens
        _call(2, [1, 2, 3, 6], [7], "solver"),
    ]
    samples, stats = build_samples([calls], [{0: 1.0, 1: -2.0, 2: 1.0}])
    assert [(s.role, s.call_seqs) for s in samples] == [("solver", [0, 2]), ("critic", [1])]
    assert samples[1].completion_advantages() == [-2.0]
    assert stats.forked_rollouts == 1 and stats.merged_calls == 1
