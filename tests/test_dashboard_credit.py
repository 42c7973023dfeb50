"""The dashboard and ``tether export`` show what each update recorded it trained: the
groups kept with their advantages (per call with turn credit, GiGPO's with
``trainer.turn_grouping: state``, each role's against its own baseline with roles), the
groups dropped and why, and "not recorded" for a run stored before updates were
recorded. The advantages are the trainer's; real runs check the records against what
they trained (tests/test_run_credit.py, tests/test_run_credit_state.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_stores import (
    GRPO,
    KEY,
    add_rollout,
    get_all,
    group_advantages,
    rollout_advantage,
    update_row,
    visible,
)
from tests.test_credit_roles import ref_role_credit
from tests.test_credit_state import ref_state_credit
from tether.dashboard import Catalog, create_server_app
from tether.dashboard._render import _num
from tether.records import (
    AttemptEnd,
    Call,
    GroupFate,
    Phase,
    Place,
    Reward,
    RewardSource,
    Rollout,
    RolloutStatus,
    UpdateGroup,
    UpdateRecord,
)
from tether.store import Store
from tether.tracking import export_attempts
from tether.trainer import RolloutRewards, assign_credit


def _fates_store(path: Path) -> None:
    """Run ``fa-1``: update 1 kept group 0 and dropped group 1 (no signal) and group 2 (a
    failed rollout); update 2 (async) dropped group 3 for lag, kept group 4 and made no
    new weights. Run ``old-1``: an update logged before tether recorded updates."""
    with Store(path / "fa" / "traces.sqlite") as db:
        db.create_run({"name": "fa"}, "fa-1")
        for g, rewards in enumerate([[1.0, 0.0], [0.5, 0.5], [1.0, None], [1.0, 0.0], [0.0, 1.0]]):
            phase, step = (Phase.TRAIN, 1) if g < 3 else (Phase.ASYNC, 2)
            for i, reward in enumerate(rewards):
                status = "failed" if reward is None else "succeeded"
                add_rollout(db, f"fa-1-g{g}-{i}", "fa-1", f"fa-1-g{g}", reward=reward,
                            status=status, place=Place(phase, step, g, i))  # fmt: skip
        ids = [(f"fa-1-g{g}-0", f"fa-1-g{g}-1") for g in range(5)]
        db.add_update(UpdateRecord("fa-1", 1, 1, GRPO, [
            UpdateGroup(0, ids[0], GroupFate.KEPT, (0.75, -0.75)),
            UpdateGroup(1, ids[1], GroupFate.NO_SIGNAL),
            UpdateGroup(2, ids[2], GroupFate.UNUSABLE),
        ]))  # fmt: skip
        db.add_update(UpdateRecord("fa-1", 2, None, GRPO, [
            UpdateGroup(3, ids[3], GroupFate.LAG),
            UpdateGroup(4, ids[4], GroupFate.KEPT, (0.0, 0.0)),
        ]))  # fmt: skip
    with Store(path / "old" / "traces.sqlite") as db:
        db.create_run({"name": "old"}, "old-1")
        db.log_metrics("old-1", 1, {"policy_version": 1.0})
        for i in range(2):
            add_rollout(db, f"old-1-s1-g0-{i}", "old-1", "old-1-s1-g0", reward=float(i),
                        place=Place(Phase.TRAIN, 1, 0, i))  # fmt: skip


def test_pages_and_export_show_each_updates_groups_trained_and_dropped_and_why(
    tmp_path: Path,
) -> None:
    """The run page lists each update's trained and dropped groups with why; the rollouts
    page and a rollout's page say what became of its group and show the recorded
    advantages; ``tether export`` writes the same; an old run says "not recorded"."""
    _fates_store(tmp_path)
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    run, table, kept, flat, lag, old_run, old_table, old_one = get_all(app, [
        "/ui/s/fa/run/fa-1", "/ui/s/fa/run/fa-1/rollouts", "/ui/s/fa/rollout/fa-1-g0-0",
        "/ui/s/fa/rollout/fa-1-g1-0", "/ui/s/fa/rollout/fa-1-g3-1", "/ui/s/old/run/old-1",
        "/ui/s/old/run/old-1/rollouts", "/ui/s/old/rollout/old-1-s1-g0-0",
    ])  # fmt: skip
    assert update_row(run.text, 1) == (
        "g0", "g1: no signal, every advantage 0 (rollout.filter_groups); "
        "g2: a rollout has no usable reward",
    )  # fmt: skip
    assert update_row(run.text, 2) == ("g4", "g3: too old for run.max_policy_lag")
    assert "no update" in visible(run.text) and "not recorded" not in visible(run.text)
    shown = visible(table.text)
    assert "trained at update 1" in shown and "dropped at update 2: too old" in shown
    assert "kept at update 2, which learned nothing" in shown
    assert group_advantages(table.text)["fa-1-g0-1"] == pytest.approx(-0.75)
    assert group_advantages(table.text)["fa-1-g1-0"] is None  # dropped: no advantage
    assert rollout_advantage(kept.text) == pytest.approx(0.75)
    assert "trained at update 1" in visible(kept.text)
    assert rollout_advantage(flat.text) is None and "dropped at update 1: no signal" in visible(
        flat.text
    )
    assert "dropped at update 2: too old for run.max_policy_lag" in visible(lag.text)
    for page in (old_run, old_table, old_one):  # stored before updates were recorded
        assert "not recorded: this store was written before tether kept" in visible(page.text)
    assert rollout_advantage(old_one.text) is None
    with Store(tmp_path / "fa" / "traces.sqlite") as db:
        rows = {row["rollout_id"]: row for row in export_attempts(db)}
    assert {rid: (row["update"], row["fate"], row["advantage"]) for rid, row in rows.items()} == {
        "fa-1-g0-0": (1, "kept", 0.75), "fa-1-g0-1": (1, "kept", -0.75),
        "fa-1-g1-0": (1, "no_signal", None), "fa-1-g1-1": (1, "no_signal", None),
        "fa-1-g2-0": (1, "unusable", None), "fa-1-g2-1": (1, "unusable", None),
        "fa-1-g3-0": (2, "lag", None), "fa-1-g3-1": (2, "lag", None),
        "fa-1-g4-0": (2, "kept", 0.0), "fa-1-g4-1": (2, "kept", 0.0),
    }  # fmt: skip
    with Store(tmp_path / "old" / "traces.sqlite") as db:
        old = list(export_attempts(db))
    assert [(r["update"], r["fate"], r["advantage"]) for r in old] == [(None, None, None)] * 2
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
                db.finish_rollout(AttemptEnd(rid, attempt, RolloutStatus.SUCCEEDED))
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
    credit = {**GRPO, "credit": "turn", "gamma": 0.9, "grouping": "state", "state_weight": 0.5}
    rows = shows(
        tmp_path, "st", STATE_GROUPS, credit, "turn credit by prompt state, ω 0.5", trainer
    )
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
                db.finish_rollout(AttemptEnd(rid, attempt, RolloutStatus.SUCCEEDED))
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
    roles = {**GRPO, "role_weights": {"solver": 1.0, "critic": 1.0}}
    shows(tmp_path, "ro", ROLES_GROUPS, roles, "grpo, per role", trainer)


def shows(
    tmp_path: Path,
    name: str,
    layout: list[Any],
    credit: dict[str, Any],
    label: str,
    trainer: list[Any],
) -> dict[str, Any]:
    """Store update 1 of run ``{name}-1`` (groups shaped as ``layout``) as the run records
    it: its ``credit`` settings and the advantages ``trainer``. The rollouts page (with
    ``label``, the credit's), each rollout's page and ``tether export`` then show per call those
    advantages; returns the export's rows by rollout id."""
    ids = [f"{name}-1-s1-g{g}-{i}" for g, members in enumerate(layout) for i in range(len(members))]
    flat = iter(trainer)
    groups = [
        UpdateGroup(
            g,
            tuple(f"{name}-1-s1-g{g}-{i}" for i in range(len(members))),
            GroupFate.KEPT,
            tuple(next(flat) for _ in members),
        )
        for g, members in enumerate(layout)
    ]
    with Store(tmp_path / name / "traces.sqlite") as db:
        db.add_update(UpdateRecord(f"{name}-1", 1, 1, credit, groups))
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
