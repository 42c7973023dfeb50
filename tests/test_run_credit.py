"""What an update learns from under each credit option (``tether/run/_learn.py``):
``trajectory`` stays exactly the update tether made before; ``turn`` and
``rollout.filter_groups`` change which advantages and groups it trains."""

from __future__ import annotations

import random

import torch

from tether.records import Call, RolloutStatus
from tether.run._collect import RolloutOutcome
from tether.run._learn import Learning, learn_metrics
from tether.trainer.algorithms import compute_advantages
from tether.trainer.samples import build_samples, collate

# --------------------------------------------------------------------------- the update's input


def _outcome(rid: str, group: int, reward: float, calls: list[Call], turns: dict | None = None):
    return RolloutOutcome(
        rid, group, RolloutStatus.SUCCEEDED, reward, calls, turn_rewards=turns or {}
    )


def _groups(seed: int = 0) -> list[list[RolloutOutcome]]:
    """Three groups of three multi-call rollouts: merged calls, forks, a flat group."""
    rng = random.Random(seed)
    groups = []
    for g in range(3):
        group = []
        for i in range(3):
            rid, prompt, calls = f"g{g}-{i}", [1, 2, 3 + g], []
            for seq in range(rng.randint(1, 3)):
                completion = [rng.randint(10, 99) for _ in range(rng.randint(1, 4))]
                if seq == 2:  # a sub-agent's call: its own prompt, a new segment
                    prompt = [7, 7, seq]
                calls.append(
                    Call(rid, seq, list(prompt), completion, [-rng.random()] * len(completion), 0)
                )
                prompt = prompt + completion + [5]  # the tool result
            reward = 1.0 if g == 2 else float(rng.random() < 0.5) + i * 0.1
            turns = {0: rng.choice([0.0, 0.5])} if g == 1 else {}
            group.append(_outcome(rid, g, reward, calls, turns))
        groups.append(group)
    return groups


def test_trajectory_credit_is_the_update_tether_always_made() -> None:
    """The new path (learn_metrics with credit=trajectory, intermediate rewards present and
    ignored) gives the very samples, advantages and batch tensors of the old code path."""
    groups = _groups()
    kept = [g for g in groups if all(o.usable for o in g)]
    rewards = torch.tensor([[o.reward for o in g] for g in kept], dtype=torch.float64)
    before = compute_advantages(rewards, "grpo")  # what _learn.py did, line for line
    old, _ = build_samples([o.calls for g in kept for o in g], before.advantages.flatten().tolist())
    metrics, new = learn_metrics(groups, Learning("grpo", "trajectory"))
    assert new == old and all(s.token_advantages is None for s in new)
    assert metrics["zero_variance_groups"] == before.zero_variance_groups == 1
    for key, value in collate(old).items():
        assert torch.equal(collate(new)[key], value), key
    assert learn_metrics(groups, "grpo") == (metrics, new)  # the estimator's name alone


def test_turn_credit_drops_rollouts_with_an_unusable_intermediate_reward() -> None:
    groups = _groups()
    groups[0][1].turn_rewards = {0: float("nan")}
    traj, _ = learn_metrics(groups, Learning("grpo", "trajectory"))
    turn, samples = learn_metrics(groups, Learning("grpo", "turn"))
    assert traj["groups_dropped"] == 0 and turn["groups_dropped"] == 1
    assert {s.rollout_index for s in samples} <= set(range(6)) and samples
    assert all(s.token_advantages is not None for s in samples)


def test_filter_groups_trains_the_first_groups_with_signal() -> None:
    groups = _groups()  # group 2: every reward 1.0, no signal
    m, samples = learn_metrics(groups, Learning("grpo", signal_only=1))
    assert (m["groups_no_signal"], m["groups_surplus"], m["groups_kept"]) == (1.0, 1.0, 1.0)
    assert {s.rollout_index for s in samples} == {0, 1, 2}  # group 0's rollouts only
    assert m["zero_variance_groups"] == 0.0
