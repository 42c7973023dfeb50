"""The dashboard's advantages follow the run's ``trainer.credit``: with ``turn`` each
rollout shows its advantage per call, as the trainer computed them."""

from __future__ import annotations

from pathlib import Path

from tether.dashboard._render import _num
from tether.dashboard._views import advantages
from tether.records import Call, Reward, RewardSource, Rollout, RolloutStatus
from tether.store import Store
from tether.trainer import RolloutRewards, assign_credit


def _rollout(db: Store, rid: str, reward: float, calls: int, turn: float | None) -> Rollout:
    db.create_rollout(Rollout(id=rid, group_id="g"))
    attempt = db.start_attempt(rid)
    for seq in range(calls):
        db.record_call(Call(rid, seq, [1, 2 + seq], [3], [-0.5], 0, attempt=attempt))
    if turn is not None:
        db.record_reward(Reward(rid, turn, RewardSource.AGENT, attempt, call_seq=0))
    db.record_reward(Reward(rid, reward, RewardSource.GRADER, attempt))
    db.finish_rollout(rid, RolloutStatus.SUCCEEDED, attempt=attempt)
    got = db.get_rollout(rid)
    assert got is not None
    return got


def test_turn_credit_advantages_per_call_from_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as db:
        members = [_rollout(db, "a", 1.0, 2, 0.5), _rollout(db, "b", 1.0, 3, None)]
        turn = advantages(members, "grpo", credit="turn", gamma=0.9, store=db)
        trajectory = advantages(members, "grpo")
    expect = assign_credit(
        [[RolloutRewards(1.0, 2, {0: 0.5}), RolloutRewards(1.0, 3)]], "grpo", "turn", 0.9
    ).advantages
    assert turn == {"a": expect[0], "b": expect[1]}
    assert isinstance(turn["a"], dict) and turn["a"][0] > 0 > turn["b"][0]  # a earned more
    assert trajectory == {"a": 0.0, "b": 0.0}  # equal final rewards: nothing without turns
    assert _num({0: 0.70710678, 1: -0.5}) == "0: 0.707 · 1: -0.5"
