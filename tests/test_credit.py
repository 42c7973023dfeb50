"""Credit assignment (``trainer.credit``): returns-to-go, turn-level advantages and per-call
samples against plain loops; ``trajectory`` stays exactly the update tether made before."""

from __future__ import annotations

import random

import pytest
import torch

from tests.test_algorithms import ref_advantages, ref_aggregate
from tether.records import Call
from tether.trainer import RolloutRewards, assign_credit, carries_signal
from tether.trainer.algorithms import (
    ADVANTAGE_ESTIMATORS,
    aggregate,
    returns_to_go,
    turn_advantages,
)
from tether.trainer.samples import build_samples, collate

# --------------------------------------------------------------------------- references


def ref_returns(turns: list[float], final: float, gamma: float) -> list[float]:
    """Return-to-go of each turn of one rollout, by the definition: a sum over later turns."""
    n = len(turns)
    rewards = [r + (final if k == n - 1 else 0.0) for k, r in enumerate(turns)]
    return [sum(gamma ** (j - k) * rewards[j] for j in range(k, n)) for k in range(n)]


def ref_turn_advantages(
    groups: list[list[list[float]]], name: str, eps: float = 1e-6
) -> list[list[list[float]]]:
    """``groups[g][i]`` = rollout i's returns per turn → advantages per turn: the returns
    at turn k of the group's rollouts that reached k, as one group of the estimator."""
    cells: list[list[float]] = []  # one comparison group per (group, turn), in order
    where: dict[tuple[int, int, int], tuple[int, int]] = {}
    for g, rollouts in enumerate(groups):
        for k in range(max((len(r) for r in rollouts), default=0)):
            members = [(i, r[k]) for i, r in enumerate(rollouts) if k < len(r)]
            for pos, (i, _) in enumerate(members):
                where[(g, i, k)] = (len(cells), pos)
            cells.append([v for _, v in members])
    adv = ref_advantages(cells, name, eps)
    return [
        [
            [adv[c][p] for k in range(len(r)) for c, p in [where[(g, i, k)]]]
            for i, r in enumerate(rs)
        ]
        for g, rs in enumerate(groups)
    ]


# --------------------------------------------------------------------------- the math


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5, 0.0])
def test_returns_to_go_match_the_definition(gamma: float) -> None:
    rng = random.Random(0)
    rollouts = [
        [rng.choice([0.0, 0.0, 0.3, -1.0]) for _ in range(rng.randint(0, 5))] for _ in range(7)
    ]
    finals = [rng.random() for _ in rollouts]
    width = max(len(r) for r in rollouts)
    turns = torch.tensor([r + [9.0] * (width - len(r)) for r in rollouts])  # 9: past the end
    lengths = torch.tensor([len(r) for r in rollouts])
    got = returns_to_go(turns, torch.tensor(finals), lengths, gamma)
    assert got.shape == (7, width) and got.dtype == torch.float64
    for i, (r, f) in enumerate(zip(rollouts, finals, strict=True)):
        expect = ref_returns(r, f, gamma) + [0.0] * (width - len(r))
        torch.testing.assert_close(got[i], torch.tensor(expect, dtype=torch.float64))
    # undiscounted, no intermediate rewards: every turn's return is the final reward
    flat = returns_to_go(torch.zeros(2, 3), torch.tensor([0.25, -1.0]), torch.tensor([3, 2]))
    assert flat.tolist() == [[0.25, 0.25, 0.25], [-1.0, -1.0, 0.0]]


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_turn_advantages_match_a_loop_over_groups_and_turns(name: str) -> None:
    rng = random.Random(1)
    groups = [
        [[rng.choice([0.0, 0.5, 1.0]) for _ in range(rng.randint(1, 4))] for _ in range(4)]
        for _ in range(3)
    ]
    groups.append([[1.0, 1.0], [1.0, 1.0, 1.0]])  # no signal at any turn (turn 2 alone)
    flat = [r for g in groups for r in g]
    width = max(len(r) for r in flat)
    returns = torch.tensor([r + [0.0] * (width - len(r)) for r in flat], dtype=torch.float64)
    lengths = torch.tensor([len(r) for r in flat])
    ids = [11, 4, 7, 30]  # any integer ids
    group = torch.tensor([ids[g] for g, rs in enumerate(groups) for _ in rs])
    got = turn_advantages(returns, lengths, group, name)
    ref = ref_turn_advantages(groups, name)
    expect = [a + [0.0] * (width - len(a)) for g in ref for a in g]
    torch.testing.assert_close(got.advantages, torch.tensor(expect, dtype=torch.float64))
    assert got.num_groups == 4 and got.zero_variance_groups == 1


def test_turn_credit_without_turn_rewards_equals_trajectory_credit_at_equal_lengths() -> None:
    """γ = 1, no intermediate reward, every rollout of a group as long: each turn's return is
    the final reward, so every call gets its rollout's trajectory advantage."""
    rewards = [[1.0, 0.0, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2]]
    groups = [[RolloutRewards(r, 3) for r in g] for g in rewards]
    traj = assign_credit(groups, "grpo")
    turn = assign_credit(groups, "grpo", "turn")
    assert traj.zero_variance_groups == turn.zero_variance_groups == 1
    for a, per_call in zip(traj.advantages, turn.advantages, strict=True):
        assert isinstance(per_call, dict) and sorted(per_call) == [0, 1, 2]
        assert all(v == pytest.approx(a) for v in per_call.values())


def test_turn_rewards_move_credit_to_the_call_that_earned_it() -> None:
    """Two rollouts end with the same reward; one earned +1 at its first call, the other −1
    at its second: trajectory credit sees no signal, turn credit does, per call."""
    a = RolloutRewards(1.0, 2, {0: 1.0})
    b = RolloutRewards(1.0, 2, {1: -1.0})
    assert not carries_signal([a, b]) and carries_signal([a, b], "turn")
    got = assign_credit([[a, b]], "dr_grpo", "turn", gamma=0.5)
    # returns: a = [1 + .5·1, 1] = [1.5, 1]; b = [.5·(−1 + 1), 0] = [0, 0]
    assert got.advantages == [{0: 0.75, 1: 0.5}, {0: -0.75, 1: -0.5}]
    with pytest.raises(ValueError, match="finite"):
        assign_credit([[a, RolloutRewards(0.0, 2, {1: float("nan")})]], "grpo", "turn")


# --------------------------------------------------------------------------- samples


def _call(rid: str, seq: int, prompt: list[int], completion: list[int]) -> Call:
    return Call(rid, seq, prompt, completion, [-0.5] * len(completion), 0)


def test_a_merged_sample_carries_each_calls_advantage_on_its_own_tokens() -> None:
    c0 = _call("r", 0, [1, 2], [3, 4])
    c1 = _call("r", 1, [1, 2, 3, 4, 5], [6])  # extends c0: merged, tool token 5 masked
    side = _call("r", 2, [9], [8, 7])  # a new segment (its prompt breaks the prefix)
    samples, stats = build_samples(
        [[c0, c1, side], [_call("q", 0, [1], [2])]], [{0: 0.5, 1: -1.0, 2: 2.0}, 0.25]
    )
    assert stats.merged_calls == 1 and len(samples) == 3
    merged, fork, whole = samples
    assert merged.token_advantages == [0.0, 0.0, 0.5, 0.5, 0.0, -1.0]
    assert merged.completion_advantages() == [0.5, 0.5, -1.0] and merged.advantage == pytest.approx(
        0.0
    )
    assert merged.trains and fork.token_advantages == [0.0, 2.0, 2.0]
    assert whole.token_advantages is None and whole.completion_advantages() == [0.25]
    batch = collate(samples)  # one per-call sample makes the advantages per token: [B, L]
    assert batch["advantages"].shape == batch["loss_mask"].shape
    assert batch["advantages"][0].tolist() == merged.token_advantages
    assert batch["advantages"][2, :2].tolist() == [0.25, 0.25]
    assert collate([whole])["advantages"].shape == (1,)  # none: [B] as before
    with pytest.raises(ValueError, match="no advantage for call r#1"):
        build_samples([[c0, c1]], [{0: 1.0}])


# --------------------------------------------------------------------------- segments


def _context_reset() -> list[Call]:
    """Two calls of one conversation, then the agent summarises its history and goes on
    from the summary: calls 2 and 3 are a second segment."""
    c0 = _call("reset", 0, [1, 2, 3], [10, 11])
    c1 = _call("reset", 1, [1, 2, 3, 10, 11, 4], [12, 13, 14])
    c2 = _call("reset", 2, [1, 2, 9, 9], [15])  # system prompt + summary: the prefix broke
    c3 = _call("reset", 3, [1, 2, 9, 9, 15, 4], [16, 17])
    return [c0, c1, c2, c3]


def _sub_agent() -> list[Call]:
    """The main agent calls, a sub-agent with its own prompt makes two calls, the main
    agent goes on with the sub-agent's answer as a tool result."""
    main0 = _call("sub", 0, [1, 2, 3], [20, 21])
    sub1 = _call("sub", 1, [1, 7, 7], [30])
    sub2 = _call("sub", 2, [1, 7, 7, 30, 5], [31, 32])
    main3 = _call("sub", 3, [1, 2, 3, 20, 21, 5, 31, 32], [22])
    return [main0, sub1, sub2, main3]


def test_a_context_reset_and_a_sub_agent_make_segments() -> None:
    rollouts = [_context_reset(), _sub_agent(), [_call("one", 0, [1], [2, 3])]]
    samples, stats = build_samples(rollouts, [1.0, -1.0, {0: 0.5}])
    assert [s.call_seqs for s in samples] == [[0, 1], [2, 3], [0, 3], [1, 2], [0]]
    assert [s.rollout_index for s in samples] == [0, 0, 1, 1, 2]
    assert (stats.one_sample_rollouts, stats.forked_rollouts, stats.merged_calls) == (1, 2, 4)
    assert all(s.advantage == 1.0 for s in samples[:2])  # each segment: the rollout's credit
    per_call, _ = build_samples([_sub_agent()], [{0: 1.0, 1: -1.0, 2: 0.5, 3: 2.0}])
    assert [s.completion_advantages() for s in per_call] == [[1.0, 1.0, 2.0], [-1.0, 0.5, 0.5]]


@pytest.mark.parametrize("mode", ["token_mean", "rollout_mean", "seq_mean"])
def test_segments_of_a_rollout_weigh_as_the_aggregation_says(mode: str) -> None:
    """token_mean: every trained token alike (a rollout's segments as if merged);
    rollout_mean: every rollout alike, its segments' tokens averaged together; seq_mean:
    every segment alike. Against the loop reference of test_algorithms.py."""
    samples, _ = build_samples(
        [_context_reset(), _sub_agent(), [_call("o", 0, [1], [2])]], [1.0] * 3
    )
    batch = collate(samples)
    loss = torch.rand(batch["loss_mask"].shape, generator=torch.Generator().manual_seed(0))
    got = aggregate(loss, batch["loss_mask"], mode, rollout_index=batch["rollout_index"])
    mask = batch["loss_mask"].tolist()
    expect = ref_aggregate(loss.tolist(), mask, mode, batch["rollout_index"].tolist())
    assert got.item() == pytest.approx(expect, rel=1e-6)
    if mode == "rollout_mean":  # by hand: the two segments of rollout 0 share one mean
        per = [[v for row, m, r in zip(loss.tolist(), mask, batch["rollout_index"].tolist(), strict=True)
                if r == k for v, x in zip(row, m, strict=True) if x] for k in range(3)]  # fmt: skip
        assert got.item() == pytest.approx(sum(sum(p) / len(p) for p in per) / 3, rel=1e-6)
