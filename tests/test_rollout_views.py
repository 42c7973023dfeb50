"""``tether rollouts show`` on a training run's store: the run's task set and its token text.

A real ``TrainingRun`` records its tasks; ``tether rollouts show`` runs as a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.records import Call, Rollout, Split
from tether.run import TasksConfig, TrainConfig, TrainingRun
from tether.store import Store

TETHER = [sys.executable, "-m", "tether.cli"]


def _show(store: Path, rollout_id: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TETHER, "rollouts", "show", rollout_id, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def _add_rollout(db: Store, rollout_id: str, run_id: str, task_id: str | None, ids: list[int]):
    db.create_rollout(Rollout(id=rollout_id, run_id=run_id, task_id=task_id))
    attempt = db.start_attempt(rollout_id)
    db.record_call(
        Call(rollout_id, 0, [1, 2], ids, [-0.5] * len(ids), policy_version=0, attempt=attempt)
    )


def _token_rows(stdout: str) -> dict[int, str]:
    """token id -> the token column of ``rollouts show``'s token table."""
    rows = [ln.split() for ln in stdout.splitlines()]
    return {
        int(r[-3]): " ".join(r[1:-3])
        for r in rows
        if len(r) >= 5 and r[0].isdigit() and r[-3].isdigit()
    }


def test_a_run_records_its_tasks_and_show_prints_a_rollouts_task_and_tokens(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    cfg = TrainConfig(
        name="views", dir=str(tmp_path), tasks=TasksConfig(source="calc", train_size=40, val_size=4)
    )
    cfg.model.path = str(starter_dir)

    async def open_and_close() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            return run

    run = asyncio.run(open_and_close())
    rid = run.run_record.id
    path = tmp_path / "views" / "traces.sqlite"
    with Store(path) as db:
        stored = db.list_tasks(run_id=rid)
        assert [(t.id, t.split, t.data) for t in stored] == [
            (t.id, t.split, t.data) for t in run.train_tasks + run.val_tasks
        ]
        assert len(db.list_tasks(run_id=rid, split=Split.VAL)) == 4
        task = run.train_tasks[3]
        ids = tokenizer.encode("12 + 30 = 42")
        _add_rollout(db, "r-task", rid, task.id, ids)
    shown = _show(path, "r-task")
    assert shown.returncode == 0, shown.stderr
    # loading the tokenizer imports transformers, which imports torchao: none of its noise
    assert "Failed to load" not in shown.stderr and "_pytree" not in shown.stderr, shown.stderr
    assert f"task {task.id} (train): " in shown.stdout
    tokens = _token_rows(shown.stdout)
    assert set(ids) <= set(tokens)
    for tid in ids:
        assert tokens[tid] == repr(tokenizer.decode([tid], skip_special_tokens=False))


@pytest.mark.slow
def test_show_without_the_runs_tokenizer_keeps_a_dash_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "traces.sqlite"
    with Store(path) as db:
        db.create_run({"model": {"path": "starter"}}, run_id="r0")
        _add_rollout(db, "r-1", "r0", None, [5, 6, 7])
        db.create_run({"command": "serve", "model": str(tmp_path / "gone")}, run_id="r1")
        _add_rollout(db, "r-2", "r1", None, [5])
    empty_cache = tmp_path / "cache"
    shown = _show(path, "r-1", TETHER_CACHE=str(empty_cache))
    assert shown.returncode == 0, shown.stderr
    why = [ln for ln in shown.stdout.splitlines() if ln.startswith("token text not shown")]
    assert len(why) == 1 and "starter model is not built" in why[0], shown.stdout
    assert set(_token_rows(shown.stdout).values()) == {"-"}
    assert not empty_cache.exists()  # nothing was built to show the tokens
    shown = _show(path, "r-2")
    assert "is not on this machine" in shown.stdout and _token_rows(shown.stdout) == {5: "-"}


def test_tasks_sharing_an_id_are_not_stored_and_the_run_still_opens(
    starter_dir: Path, tmp_path: Path, caplog: Any
) -> None:
    source = tmp_path / "tasks.jsonl"
    source.write_text(
        '{"id": "same", "q": "1+1", "split": "train"}\n{"id": "same", "q": "2+2", "split": "train"}\n'
    )
    cfg = TrainConfig(name="dup", dir=str(tmp_path), tasks=TasksConfig(source=str(source)))

    async def open_and_close() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            return run

    with caplog.at_level("WARNING", logger="tether.run"):
        run = asyncio.run(open_and_close())
    assert len(run.train_tasks) == 2
    assert any(
        "tasks not stored" in r.getMessage() and "own id" in r.getMessage() for r in caplog.records
    )
    with Store(tmp_path / "dup" / "traces.sqlite") as db:
        assert db.list_tasks(run_id=run.run_record.id) == []  # all or nothing


def test_list_says_how_many_rollouts_it_left_out(tmp_path: Path) -> None:
    path = tmp_path / "traces.sqlite"
    with Store(path) as db:
        db.create_run({}, run_id="r0")
        for i in range(7):
            db.create_rollout(Rollout(id=f"r-{i}", run_id="r0"))
    listed = subprocess.run(
        [*TETHER, "rollouts", "list", "--store", str(path), "--limit", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert [ln.split("\t")[0] for ln in listed.stdout.splitlines()[1:]] == ["r-4", "r-5", "r-6"]
    assert "the newest 3 of 7 rollouts; --limit 7 for all" in listed.stderr
    every = subprocess.run(
        [*TETHER, "rollouts", "list", "--store", str(path)], capture_output=True, text=True
    )
    assert len(every.stdout.splitlines()) == 8 and "newest" not in every.stderr
