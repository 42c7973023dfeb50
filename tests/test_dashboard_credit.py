"""The dashboard's advantages follow the run's ``trainer.credit``: with ``turn`` each
rollout shows its advantage per call, as the trainer computed them; with
``trainer.turn_grouping: state`` the dashboard and ``tether export`` show GiGPO's, as the
trainer trains them; with roles, each role's against its own baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_stores import KEY, get_all, group_advantages, rollout_advantage, visible
from tests.test_credit_roles import ref_role_credit
from tests.test_credit_state import ref_state_credit
from tether.dashboard import Catalog, create_server_app
from tether.dashboard._render import _num
from tether.dashboard._views import advantages
from tether.records import Call, Phase, Place, Reward, RewardSource, Rollout, RolloutStatus
from tether.store import Store
from tether.tracking import RunCredit, export_attempts
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
        turn = advantages(members, RunCredit("grpo", "turn", 0.9), db)
        trajectory = advantages(members, "grpo")
    expect = assign_credit(
        [[RolloutRewards(1.0, 2, {0: 0.5}), RolloutRewards(1.0, 3)]], "grpo", "turn", 0.9
    ).advantages
    assert turn is not None and turn == {"a": expect[0], "b": expect[1]}
    a, b = turn["a"], turn["b"]
    assert isinstance(a, dict) and isinstance(b, dict) and a[0] > 0 > b[0]  # a earned more
    assert trajectory == {"a": 0.0, "b": 0.0}  # equal final rewards: nothing without turns
    assert _num({0: 0.70710678, 1: -0.5}) == "0: 0.707 · 1: -0.5"


# --------------------------------------------------------------------------- state grouping

STATE_RUN = {"name": "st", "model": {"path": "nowhere"}, "trainer": {
    "advantage": "grpo", "credit": "turn", "gamma": 0.9, "turn_grouping": "state",
    "state_weight": 0.5,
}}  # fmt: skip
P0, P1, DETOUR, P2 = [1, 2], [1, 2, 9], [1, 2, 8], [1, 2, 7]
# Per group, each rollout's (final reward, its calls' prompts, intermediate rewards): in
# group 0 the second rollout reaches the first's state P1 a call later (a detour); in group
# 1 the final rewards are equal and only the returns at the shared P1 tell them apart.
STATE_GROUPS = [
    [(1.0, [P0, P1], {0: 0.5}), (0.0, [P0, DETOUR, P1], {}), (0.5, [P0, P2], {})],
    [(1.0, [P0, P1], {}), (1.0, [P0, P1], {1: -1.0})],
]


def _state_store(path: Path) -> list[list[RolloutRewards]]:
    """A store of one run with ``trainer.turn_grouping: state`` and STATE_GROUPS as the
    groups of its update 1; the same rollouts as credit sees them."""
    groups = []
    with Store(path) as db:
        db.create_run(STATE_RUN, "st-1")
        for g, members in enumerate(STATE_GROUPS):
            group = []
            for i, (reward, prompts, turns) in enumerate(members):
                gid = f"st-1-s1-g{g}"
                rid = f"{gid}-{i}"
                db.create_rollout(
                    Rollout(id=rid, run_id="st-1", group_id=gid, task_id=f"t{g}",
                            place=Place(Phase.TRAIN, 1, g, i))
                )  # fmt: skip
                attempt = db.start_attempt(rid)
                for seq, prompt in enumerate(prompts):
                    db.record_call(Call(rid, seq, prompt, [3 + seq], [-0.5], 0, attempt=attempt))
                for seq, value in turns.items():
                    db.record_reward(Reward(rid, value, RewardSource.AGENT, attempt, call_seq=seq))
                db.record_reward(Reward(rid, reward, RewardSource.GRADER, attempt))
                db.finish_rollout(rid, RolloutStatus.SUCCEEDED, attempt=attempt)
                prompts_ids = tuple(tuple(p) for p in prompts)
                group.append(RolloutRewards(reward, len(prompts), turns, (), prompts_ids))
            groups.append(group)
    return groups


def test_state_grouping_the_dashboard_and_the_export_show_what_the_trainer_trains(
    tmp_path: Path,
) -> None:
    """A run with turn_grouping: state: the rollouts page, each rollout's page and
    ``tether export`` show per call the GiGPO advantages of the loop reference (the
    trainer's function on the same rollouts), not the turn-index ones."""
    groups = _state_store(tmp_path / "st" / "traces.sqlite")
    trainer = assign_credit(groups, "grpo", "turn", 0.9, "state", 0.5).advantages
    for got, ref in zip(trainer, ref_state_credit(groups, "grpo", 0.9, 0.5), strict=True):
        assert isinstance(got, dict) and got == pytest.approx(ref, abs=1e-9)
    index = assign_credit(groups, "grpo", "turn", 0.9).advantages
    assert [_num(a) for a in trainer] != [_num(a) for a in index]  # what the grouping changes
    rows = shows(tmp_path, "st", STATE_GROUPS, "turn credit by prompt state, ω 0.5", trainer)
    assert all(row["advantage"] is None for row in rows.values())  # per call with turn credit


# --------------------------------------------------------------------------- roles

ROLES_RUN = {"name": "ro", "model": {"path": "nowhere"}, "trainer": {"advantage": "grpo"},
             "roles": {"solver": {}, "critic": {}}}  # fmt: skip
# Per group, each rollout's (final reward, the role of each of its calls): some rollouts
# never call the critic, so the critic's baseline is over fewer rollouts than the
# solver's, and each role's calls get their own advantage.
ROLES_GROUPS = [
    [(1.0, ["solver", "critic"]), (0.0, ["solver"]), (0.0, ["solver", "critic"])],
    [(0.5, ["critic", "solver", "solver"]), (1.0, ["solver"]), (0.0, ["critic"])],
]


def _roles_store(path: Path) -> list[list[RolloutRewards]]:
    """A store of one run with two trained roles and trajectory credit, ROLES_GROUPS the
    groups of its update 1; the same rollouts as credit sees them."""
    groups = []
    with Store(path) as db:
        db.create_run(ROLES_RUN, "ro-1")
        for g, members in enumerate(ROLES_GROUPS):
            group = []
            for i, (reward, roles) in enumerate(members):
                gid = f"ro-1-s1-g{g}"
                rid = f"{gid}-{i}"
                db.create_rollout(
                    Rollout(id=rid, run_id="ro-1", group_id=gid, task_id=f"t{g}",
                            place=Place(Phase.TRAIN, 1, g, i))
                )  # fmt: skip
                attempt = db.start_attempt(rid)
                for seq, role in enumerate(roles):
                    db.record_call(
                        Call(rid, seq, [1, 2 + seq], [3], [-0.5], 0, attempt=attempt, role=role)
                    )
                db.record_reward(Reward(rid, reward, RewardSource.GRADER, attempt))
                db.finish_rollout(rid, RolloutStatus.SUCCEEDED, attempt=attempt)
                group.append(RolloutRewards(reward, len(roles), {}, tuple(roles)))
            groups.append(group)
    return groups


def test_roles_the_dashboard_shows_each_roles_advantage_as_the_trainer_trains_it(
    tmp_path: Path,
) -> None:
    """A run with two trained roles and ``trainer.credit: trajectory``: the rollouts page and
    each rollout's page show per call the per-role advantages of the loop reference (the
    trainer's ``assign_credit`` on the same rollouts), not one number per rollout from its
    final reward; ``tether export`` writes the same; the page says they are per role."""
    groups = _roles_store(tmp_path / "ro" / "traces.sqlite")
    trainer = assign_credit(groups, "grpo").advantages
    for got, ref in zip(trainer, ref_role_credit(groups, "grpo", turn=False), strict=True):
        assert isinstance(got, dict) and got == pytest.approx(ref, abs=1e-9)
    plain = assign_credit([[RolloutRewards(r.reward) for r in g] for g in groups], "grpo")
    assert any(  # one number per rollout is not what the update trained
        a != pytest.approx(b, rel=1e-2)
        for per_call, b in zip(trainer, plain.advantages, strict=True)
        for a in (per_call.values() if isinstance(per_call, dict) else [per_call])
    )
    shows(tmp_path, "ro", ROLES_GROUPS, "grpo, per role", trainer)


def shows(
    tmp_path: Path, name: str, layout: list[Any], label: str, trainer: list[Any]
) -> dict[str, Any]:
    """The rollouts page (with ``label``), each rollout's page and ``tether export`` of the
    store ``name`` (run ``{name}-1``, step 1, groups shaped as ``layout``) show per call the
    advantages ``trainer``; returns the export's rows by rollout id."""
    ids = [f"{name}-1-s1-g{g}-{i}" for g, members in enumerate(layout) for i in range(len(members))]
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    table, *pages = get_all(
        app, [f"/ui/s/{name}/run/{name}-1/rollouts"] + [f"/ui/s/{name}/rollout/{r}" for r in ids]
    )
    assert label in visible(table.text)
    table_shows = group_advantages(table.text)
    assert table_shows.keys() == set(ids)
    for rid, adv, page in zip(ids, trainer, pages, strict=True):  # 3 significant digits
        assert table_shows[rid] == pytest.approx(adv, rel=1e-2, abs=1e-3), rid
        assert rollout_advantage(page.text) == pytest.approx(adv, rel=1e-2, abs=1e-3), rid
    with Store(tmp_path / name / "traces.sqlite") as db:
        rows = {row["rollout_id"]: row for row in export_attempts(db)}
    for rid, adv in zip(ids, trainer, strict=True):
        assert {c["seq"]: c["advantage"] for c in rows[rid]["calls"]} == adv
    return rows
