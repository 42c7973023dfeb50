"""GiGPO-style grouping (``trainer.turn_grouping: state``): a call's return is compared with
the returns of its group's calls whose prompt is identical, at any turn index, and added
to the trajectory advantage, ``A = A_episode + ω · A_step``; against plain loops. The
default ``index`` grouping stays the turn credit tether made before, bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from tests.test_algorithms import ref_advantages
from tests.test_credit import ref_returns
from tests.test_credit_roles import ref_role_credit
from tether.errors import UserError
from tether.trainer import RolloutRewards, TrainerConfig, assign_credit, carries_signal
from tether.trainer.algorithms import ADVANTAGE_ESTIMATORS, state_advantages

# --------------------------------------------------------------------------- references


def ref_step(entries: list[tuple[object, float]], name: str) -> list[float]:
    """``entries`` = (state key, return) per call → the step advantage of each: the returns
    of one key's calls as one group of the estimator (a key with one call: 0)."""
    cells: dict[object, list[int]] = {}
    for i, (key, _) in enumerate(entries):
        cells.setdefault(key, []).append(i)
    order = list(cells.values())
    adv = ref_advantages([[entries[i][1] for i in c] for c in order], name)
    out = [0.0] * len(entries)
    for c, members in enumerate(order):
        for p, i in enumerate(members):
            out[i] = adv[c][p]
    return out


def ref_state_credit(
    groups: list[list[RolloutRewards]], name: str, gamma: float, weight: float
) -> list[dict[int, float]]:
    """Each call's GiGPO advantage by loops: the episode advantage (the final reward against
    the group's, per role when calls name roles) + ω × the step advantage within the calls
    of the group and role with the identical prompt (no prompt: a state of its own)."""
    roles = {r.role_of(k) for g in groups for r in g for k in range(r.num_turns)}
    if len(roles) > 1:
        episode = ref_role_credit(groups, name, turn=False)
    else:
        per = ref_advantages([[r.reward for r in g] for g in groups], name)
        pairs = [
            (a, r) for g, rs in zip(per, groups, strict=True) for a, r in zip(g, rs, strict=True)
        ]
        episode = [dict.fromkeys(range(r.num_turns), a) for a, r in pairs]
    entries: list[tuple[object, float]] = []
    for g, rollouts in enumerate(groups):
        for i, r in enumerate(rollouts):
            G = ref_returns([r.turn_rewards.get(k, 0.0) for k in range(r.num_turns)], r.reward,
                            gamma)  # fmt: skip
            for k in range(r.num_turns):
                p = r.prompts[k] if k < len(r.prompts) else None
                key = (g, r.role_of(k), p) if p is not None else ("alone", g, i, k)
                entries.append((key, G[k]))
    step = iter(ref_step(entries, name))
    flat = [r for g in groups for r in g]
    return [{k: e[k] + weight * next(step) for k in range(r.num_turns)}
            for e, r in zip(episode, flat, strict=True)]  # fmt: skip


PROMPTS = [(1, 2), (1, 2, 3), (1, 2, 4), (1, 2, 3, 5), (7,)]


def _groups(seed: int, roles: tuple[str | None, ...] = (None,)) -> list[list[RolloutRewards]]:
    """Groups of 4 rollouts whose calls draw their prompts from a few, so that states
    recur within a group at different turn indices; one call has a prompt of its own, one
    has none recorded."""
    rng = random.Random(seed)
    groups = []
    for g in range(4):
        group = []
        for _ in range(4):
            n = rng.randint(1, 4)
            prompts = tuple(rng.choice(PROMPTS[: 2 + g]) for _ in range(n))
            turns = {k: rng.choice([0.0, 0.5, -1.0]) for k in range(n) if rng.random() < 0.3}
            rs = tuple(rng.choice(roles) for _ in range(n))
            group.append(RolloutRewards(rng.choice([0.0, 1.0, 0.25]), n, turns, rs, prompts))
        groups.append(group)
    groups[0][0] = RolloutRewards(1.0, 2, {}, (roles[0],) * 2, ((9, 9, 9), (1, 2)))  # unique
    groups[1][1] = RolloutRewards(0.0, 2, {}, (roles[0],) * 2, ((1, 2),))  # seq 1: no prompt
    return groups


# --------------------------------------------------------------------------- the math


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("weight", [1.0, 0.4, 0.0])
def test_state_advantages_match_a_loop_over_states(name: str, weight: float) -> None:
    rng = random.Random(3)
    owners = [o for o in (5, 2, 8) for _ in range(rng.randint(3, 7))]  # any integer ids
    states = [o * 10 + rng.choice([0, 1, 2]) for o in owners]
    states[0] = 999  # a state one call reached
    returns = [rng.choice([0.0, 0.5, 1.0, -1.0]) for _ in owners]
    episode = [rng.choice([0.0, 0.3, -0.7]) for _ in owners]
    # owner 8: every episode advantage 0 and every state flat: no signal
    for i, o in enumerate(owners):
        if o == 8:
            episode[i], returns[i] = 0.0, 1.0
    got = state_advantages(torch.tensor(returns), torch.tensor(states), torch.tensor(owners),
                           torch.tensor(episode), weight, name)  # fmt: skip
    step = ref_step(list(zip(states, returns, strict=True)), name)
    expect = [e + weight * s for e, s in zip(episode, step, strict=True)]
    torch.testing.assert_close(got.advantages, torch.tensor(expect, dtype=torch.float64))
    assert got.num_groups == 3 and got.zero_variance_groups == 1
    assert got.advantages[0] == pytest.approx(episode[0])  # its step advantage is 0


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("roles", [(None,), ("solver", "critic")])
def test_state_credit_matches_a_loop_over_groups_and_states(
    name: str, roles: tuple[str | None, ...]
) -> None:
    for seed in range(3):
        groups = _groups(seed, roles)
        got = assign_credit(groups, name, "turn", 0.9, "state", 0.5)
        ref = ref_state_credit(groups, name, 0.9, 0.5)
        assert len(got.advantages) == len(ref)
        for a, b in zip(got.advantages, ref, strict=True):
            assert isinstance(a, dict) and a.keys() == b.keys()
            assert list(a.values()) == pytest.approx(list(b.values()), abs=1e-9)


def test_a_shared_prompt_compares_calls_across_turn_indices() -> None:
    """a reaches state P1 at its second call, b at its third: their returns are compared
    there; b's P2 and c's P3 are states of one call (step advantage 0)."""
    p0, p1, p2, p3 = (1,), (1, 2), (1, 3), (1, 4)
    a = RolloutRewards(1.0, 2, prompts=(p0, p1))
    b = RolloutRewards(0.0, 3, prompts=(p0, p2, p1))
    c = RolloutRewards(0.5, 2, prompts=(p0, p3))
    got = assign_credit([[a, b, c]], "dr_grpo", "turn", grouping="state")
    # episode: .5, −.5, 0; step at P0: .5, −.5, 0; at P1: a +.5, b −.5
    assert got.advantages == [{0: 1.0, 1: 1.0}, {0: -1.0, 1: -0.5, 2: -1.0}, {0: 0.0, 1: 0.0}]
    index = assign_credit([[a, b, c]], "dr_grpo", "turn")
    assert index.advantages == [{0: 0.5, 1: 0.5}, {0: -0.5, 1: -0.5, 2: 0.0}, {0: 0.0, 1: 0.0}]
    # ω = 0: the trajectory advantage on every call
    zero = assign_credit([[a, b, c]], "dr_grpo", "turn", grouping="state", state_weight=0.0)
    assert zero.advantages == [{0: 0.5, 1: 0.5}, {0: -0.5, 1: -0.5, 2: -0.5}, {0: 0.0, 1: 0.0}]


def test_state_grouping_signal_is_an_episode_or_a_state_with_differing_returns() -> None:
    """Equal final rewards: a group teaches only if some shared state's returns differ."""
    a = RolloutRewards(1.0, 2, {1: 1.0}, prompts=((1,), (1, 2)))
    b = RolloutRewards(1.0, 2, {}, prompts=((1,), (1, 3)))
    assert carries_signal([a, b], "turn", grouping="state")  # differ at the shared (1,)
    alone = [RolloutRewards(1.0, 2, {1: 1.0}, prompts=((2,), (2, 2))), b]
    assert not carries_signal(alone, "turn", grouping="state")  # no state in common
    assert not carries_signal([a, b], "turn", grouping="state", state_weight=0.0)
    got = assign_credit([alone, [a, b]], "grpo", "turn", grouping="state")
    assert got.zero_variance_groups == 1


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_index_grouping_is_the_default_and_the_turn_credit_of_before(name: str) -> None:
    groups = [g[:3] for g in _groups(5)]
    bare = [[RolloutRewards(r.reward, r.num_turns, r.turn_rewards) for r in g] for g in groups]
    before = assign_credit(bare, name, "turn", 0.9)
    assert assign_credit(groups, name, "turn", 0.9, "index", 0.3) == before
    assert assign_credit(groups, name, "turn", 0.9) == before
    assert TrainerConfig().turn_grouping == "index" and TrainerConfig().state_weight == 1.0


def test_the_grouping_settings_are_checked() -> None:
    TrainerConfig(credit="turn", turn_grouping="state", state_weight=0.0)
    with pytest.raises(UserError, match=r"needs trainer.credit: turn .*set trainer.credit=turn"):
        TrainerConfig(turn_grouping="state")
    with pytest.raises(UserError, match=r"trainer.turn_grouping \('prompt'\) must be"):
        TrainerConfig(credit="turn", turn_grouping="prompt")  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"trainer.state_weight \(-1.0\) must be"):
        TrainerConfig(credit="turn", turn_grouping="state", state_weight=-1.0)
    with pytest.raises(ValueError, match="use it with credit 'turn'"):
        assign_credit([[RolloutRewards(1.0)]], "grpo", "trajectory", grouping="state")
