"""Run folders: checkpoints belong to their run, names are not reused, resume points, and
config-file paths relative to the file (the rules; the CLI end to end is in test_cli_runs.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tether.configio import load_config
from tether.errors import UserError
from tether.records import RunStatus
from tether.run import TrainConfig, check_new_run, holds_run
from tether.run._rundir import free_name, past_metrics, resume_point
from tether.store import Store
from tether.trainer.checkpoint import (
    checkpoint_state,
    latest_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from tether.trainer.errors import CheckpointConflict


def _fake_ckpt(d: Path, step: int, run: str | None, version: int | None = None) -> Path:
    p = d / f"step-{step:06d}"
    p.mkdir(parents=True)
    state = {"step": step, "run": run, "run_id": run and f"{run}-rec", "policy_version": version}
    (p / "state.json").write_text(json.dumps(state))
    return p


# -- pruning -----------------------------------------------------------------------------


def test_pruning_keeps_the_newest_of_its_own_run_and_never_touches_another(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        _fake_ckpt(tmp_path, step, "old")
    _fake_ckpt(tmp_path, 7, None)  # written before checkpoints named their run
    for step in (10, 11, 12):
        _fake_ckpt(tmp_path, step, "new")
    gone = prune_checkpoints(tmp_path, "new", keep=1)
    assert [p.name for p in gone] == ["step-000010", "step-000011"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"step-{s:06d}" for s in (1, 2, 3, 4, 7, 12)]
    # keep <= 0 keeps everything; an unnamed run prunes nothing
    assert prune_checkpoints(tmp_path, "old", keep=0) == []
    assert prune_checkpoints(tmp_path, None, keep=1) == []
    assert [p.name for p in prune_checkpoints(tmp_path, "old", keep=2)] == [
        "step-000001",
        "step-000002",
    ]


def test_a_new_one_step_run_keeps_its_checkpoint_beside_an_older_runs_higher_steps(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """The bug: keep=1 kept the highest step of the folder, deleting the new run's step-1."""
    from tether.models import load_model
    from tether.trainer import PolicyTrainer
    from tether.trainer.config import TrainerConfig

    trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig())
    _fake_ckpt(tmp_path, 20, "earlier-run")

    def save(step: int, run: str) -> Path:
        return save_checkpoint(
            tmp_path,
            step,
            trainer=trainer,
            tokenizer=tokenizer,
            base_model_dir=starter_dir,
            config={},
            keep=1,
            run=run,
            run_id=f"{run}-rec",
            policy_version=step,
        )

    mine = save(1, "this-run")
    assert mine.is_dir() and (tmp_path / "step-000020").is_dir()
    assert checkpoint_state(mine) == {
        "step": 1,
        "run": "this-run",
        "run_id": "this-run-rec",
        "policy_version": 1,
        "config": {},
    }
    save(2, "this-run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000002", "step-000020"]
    with pytest.raises(CheckpointConflict, match="belongs to another run"):
        save(20, "this-run")  # never replaces another run's checkpoint of the same step
    assert checkpoint_state(tmp_path / "step-000020")["run"] == "earlier-run"


# -- names and resume points ---------------------------------------------------------------


def test_a_name_that_holds_a_run_is_refused_with_both_fixes(tmp_path: Path) -> None:
    assert not holds_run(tmp_path / "calc")
    check_new_run(tmp_path, "calc")  # nothing there yet
    _fake_ckpt(tmp_path / "calc" / "checkpoints", 1, "r")
    _fake_ckpt(tmp_path / "calc-2" / "checkpoints", 1, "r2")
    with pytest.raises(UserError) as err:
        check_new_run(tmp_path, "calc")
    msg = str(err.value)
    assert "run 'calc' already exists in" in msg and "--resume" in msg and "name=calc-3" in msg
    assert free_name(tmp_path, "calc-2") == "calc-3" and free_name(tmp_path, "x") == "x-2"


def test_only_a_checkpoint_holds_a_name(tmp_path: Path) -> None:
    """An eval's record, a run stopped before its first checkpoint, one that failed at its
    first eval or after a step without a checkpoint: nothing to resume, the name is free."""
    (tmp_path / "calc").mkdir()
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        store.create_run({"name": "calc", "extra": {"command": "eval"}})
    assert not holds_run(tmp_path / "calc")
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        store.create_run({"name": "calc", "extra": {}})  # a run killed before its checkpoint
        broken = store.create_run({"name": "calc", "extra": {}})  # its agent failed at eval 0
        store.log_metrics(broken.id, 0, {"eval/sampled_success": 0.0})
        store.set_run_status(broken.id, RunStatus.FAILED)
        trained = store.create_run({"name": "calc", "extra": {}})  # failed after a step
        store.log_metrics(trained.id, 0, {"reward_mean": 0.5})
        store.set_run_status(trained.id, RunStatus.FAILED)
    assert not holds_run(tmp_path / "calc")
    check_new_run(tmp_path, "calc")  # train again under the same name
    with pytest.raises(
        UserError,
        match=r"cannot resume run 'calc': no checkpoint in .*; drop --resume to start it$",
    ):
        resume_point(tmp_path, "calc", 10)
    _fake_ckpt(tmp_path / "calc" / "checkpoints", 1, "r")
    assert holds_run(tmp_path / "calc")


def test_a_store_this_tether_cannot_read_holds_the_name(tmp_path: Path) -> None:
    (tmp_path / "calc").mkdir()
    (tmp_path / "calc" / "traces.sqlite").write_bytes(b"not a database" * 100)
    assert holds_run(tmp_path / "calc")
    with pytest.raises(UserError, match=r"cannot read .*: start a new run with name=calc-2"):
        check_new_run(tmp_path, "calc")


def test_resume_point_is_the_newest_checkpoint_and_says_when_there_is_none_or_nothing_left(
    tmp_path: Path,
) -> None:
    with pytest.raises(
        UserError, match=r"cannot resume run 'calc': no run folder .*; drop --resume to start it"
    ):
        resume_point(tmp_path, "calc", 10)
    d = tmp_path / "calc" / "checkpoints"
    _fake_ckpt(d, 2, "r", version=2)
    _fake_ckpt(d, 4, "r", version=3)
    (d / "step-000006.tmp-x").mkdir()  # a crash mid-write: ignored
    at = resume_point(tmp_path, "calc", 10)
    assert (at.path.name, at.step, at.policy_version, at.run, at.run_id) == (
        "step-000004",
        4,
        3,
        "r",
        "r-rec",
    )
    with pytest.raises(
        UserError, match=r"run 'calc' is finished: .* step 4 of trainer.steps=4; .* trainer.steps=8"
    ):
        resume_point(tmp_path, "calc", 4)
    assert latest_checkpoint(d).name == "step-000004"


def test_past_metrics_follow_the_resume_links_and_a_redone_step_is_the_later_sessions(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "t.sqlite") as store:
        store.create_run({"extra": {}}, run_id="a")
        store.create_run({"extra": {"resumed_from": "a", "resumed_at": 2}}, run_id="b")
        store.create_run({"extra": {"resumed_from": "b", "resumed_at": 3}}, run_id="c")
        store.log_metrics("a", 0, {"eval/sampled_success": 0.1})
        for s in (1, 2, 3):  # a finished steps 1-3, checkpointed after 2, was killed after 3
            store.log_metrics("a", s, {"reward_mean": 10 + s})
        store.log_metrics("a", 2, {"eval/sampled_success": 0.2})
        store.log_metrics("b", 3, {"reward_mean": 23})  # b redid step 3, checkpointed it
        store.log_metrics("b", 4, {"reward_mean": 24})  # and was killed after step 4
        store.log_metrics("c", 4, {"reward_mean": 34})  # c's own step: not "past"
        steps, evals = past_metrics(store, "b", 3)
    assert {s: m["reward_mean"] for s, m in steps.items()} == {1: 11, 2: 12, 3: 23}
    assert {s: m["eval/sampled_success"] for s, m in evals.items()} == {0: 0.1, 2: 0.2}


# -- config paths ---------------------------------------------------------------------


def test_paths_in_a_config_file_are_relative_to_its_folder_overrides_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    for name in ("agent.py", "grader.py", "run.sh", "data/tasks.jsonl"):
        (proj / name).write_text("")
    (proj / "config.yaml").write_text(
        "agent:\n"
        "  mode: process\n"
        "  command: python -u agent.py --tasks data/tasks.jsonl --name calc\n"
        "tasks:\n  source: data/tasks.jsonl\n"
        "rollout:\n  grader: grader.py:grade\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(TrainConfig, "../proj/config.yaml")
    p = proj.resolve()
    assert cfg.agent.command == [
        "python",
        "-u",
        str(p / "agent.py"),
        "--tasks",
        str(p / "data/tasks.jsonl"),
        "--name",
        "calc",
    ]
    assert cfg.tasks.source == str(p / "data/tasks.jsonl")
    assert cfg.rollout.grader == f"{p / 'grader.py'}:grade"
    assert cfg.dir == "runs"  # where runs go stays relative to the current directory
    # command-line overrides are what the user typed here: relative to the current directory
    cfg = load_config(
        TrainConfig,
        proj / "config.yaml",
        [
            "tasks.source=mine.jsonl",
            "rollout.grader=tether.starter.calc:grade",
            "agent.command=./run.sh",
        ],
    )
    assert (cfg.tasks.source, cfg.rollout.grader) == ("mine.jsonl", "tether.starter.calc:grade")
    assert cfg.agent.command == ["./run.sh"]


def test_a_pool_agent_file_with_a_cwd_is_relative_to_that_cwd(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "config.yaml").write_text(
        "agent:\n  mode: pool\n  cwd: work\n  entry: agent.py:main\n  command: [python, agent.py]\n"
    )
    cfg = load_config(TrainConfig, tmp_path / "config.yaml")
    work = (tmp_path / "work").resolve()
    assert cfg.agent.cwd == str(work) and cfg.agent.entry == f"{work / 'agent.py'}:main"
    assert cfg.agent.command == ["python", "agent.py"]  # runs in cwd: left as written
    # module specs and the built-in task set are not paths
    (tmp_path / "c2.yaml").write_text(
        "agent:\n  mode: inprocess\n  entry: tether.starter.calc:agent\ntasks:\n  source: calc\n"
    )
    cfg = load_config(TrainConfig, tmp_path / "c2.yaml")
    assert (cfg.agent.entry, cfg.tasks.source) == ("tether.starter.calc:agent", "calc")


def test_agent_entry_under_its_old_name_loads_with_one_notice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``agent.agent`` is ``agent.entry``'s old name: still a path relative to the file."""
    caplog.set_level(logging.WARNING, "tether.configio")
    (tmp_path / "config.yaml").write_text("agent:\n  mode: pool\n  agent: agent.py:main\n")
    cfg = load_config(TrainConfig, tmp_path / "config.yaml")
    assert cfg.agent.entry == f"{tmp_path.resolve() / 'agent.py'}:main"
    assert [r.getMessage() for r in caplog.records] == [
        "config key agent.agent is now agent.entry; please write agent.entry"
    ]
    caplog.clear()
    cfg = load_config(
        TrainConfig, None, ["agent.mode=pool", "agent.entry=tether.starter.calc:agent"]
    )
    assert cfg.agent.entry == "tether.starter.calc:agent" and not caplog.records
    with pytest.raises(UserError) as err:
        load_config(TrainConfig, tmp_path / "config.yaml", ["agent.entry=x.py:main"])
    assert str(err.value) == (
        f"{tmp_path / 'config.yaml'}:3: agent.agent is the old name of agent.entry: "
        "keep only agent.entry"
    )


def test_eval_tasks_zero_points_to_eval_enabled() -> None:
    with pytest.raises(UserError, match=r"eval\.enabled=false"):
        load_config(TrainConfig, None, ["eval.tasks=0"])
    assert load_config(TrainConfig, None, ["eval.enabled=false"]).eval.enabled is False


def test_the_demo_replaces_its_own_previous_run_and_says_so(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from tether.cli._train_run import demo_config, replace_demo_run

    cfg = demo_config(seed=3)
    run_dir = tmp_path / cfg.name
    _fake_ckpt(run_dir / "checkpoints", 150, "earlier-demo")
    out = io.StringIO()
    replace_demo_run(run_dir, Console(file=out, width=200))
    assert (
        not run_dir.exists() and f"replacing the previous demo run in {run_dir}" in out.getvalue()
    )
    replace_demo_run(run_dir, Console(file=out, width=200))  # nothing there: nothing to say
    assert out.getvalue().count("replacing") == 1


def test_the_demo_command_default_is_the_demo_config_default() -> None:
    """`tether demo` (tether/cli/_train.py keeps its import light) and demo_config agree on
    the length."""
    import inspect

    from tether.cli._train import demo
    from tether.cli._train_run import DEMO_STEPS, demo_config

    assert inspect.signature(demo).parameters["steps"].default == DEMO_STEPS
    cfg = demo_config()
    assert cfg.trainer.steps == DEMO_STEPS and cfg.eval.every == DEMO_STEPS // 4


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_looking_at_a_run_folder_writes_nothing_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """holds_run (check_new_run, free_name) opens the store read-only: no -wal/-shm made, no
    migration of a store an older tether wrote, every byte as it was."""
    from tether.store import _migrations

    current, old = tmp_path / "current", tmp_path / "old"
    for folder in (current, old):
        folder.mkdir()
    with Store(current / "traces.sqlite") as store:
        store.create_run({"name": "current", "extra": {}})
    with monkeypatch.context() as m:  # a store an older tether wrote (schema version 1)
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:1])
        with Store(old / "traces.sqlite") as store:
            store.create_run({"name": "old", "extra": {}})
    for folder in (current, old):
        before = _files(folder)
        # no checkpoint: nothing to resume; a store peek cannot read (an older schema) is kept
        assert holds_run(folder) == (folder is old), folder.name
        assert _files(folder) == before, folder.name
    check_new_run(tmp_path, "elsewhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "old"]
