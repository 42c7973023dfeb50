"""A run's task set: the held-out split of a file without one, evals that never run
over zero tasks, and the task fields kept from the agent.

What the agent receives of a task is its row without the row's ``grader`` object and
without ``tasks.private_fields``; the grader gets the whole row. Checked through the
real CLI (process and in-process agents) and the admin API; the pieces with
:func:`load_task_set`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.engine.testing import NullEngine
from tether.gateway import create_app
from tether.records import Split
from tether.run import TasksConfig, load_tasks
from tether.run._tasks import exposed_fields, load_task_set
from tether.starter import calc

from .helpers import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[1]
TETHER = [sys.executable, "-m", "tether.cli"]


def _write_tasks(path: Path, n: int, **fields: Any) -> Path:
    rows = [{"id": f"t{i}", "question": f"1 + {i}", **fields} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train(tmp_path: Path, starter_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "rollout.n=2",
        "rollout.batch_groups=2",
        "trainer.steps=1",
        "run.collapse_patience=0",
        "eval.tasks=2",
        "eval.samples=1",
        "eval.greedy=false",
        "checkpoint.every=0",
        "agent.concurrency=4",
        *extra,
    ]
    return subprocess.run(
        [*TETHER, "train", str(ROOT / "examples/calc/config.yaml"), *overrides],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "300"},
    )


# -- splits ------------------------------------------------------------------------------


def test_a_file_without_split_fields_holds_out_a_seeded_tenth(tmp_path: Path) -> None:
    path = _write_tasks(tmp_path / "tasks.jsonl", 60)
    got = load_task_set(TasksConfig(source=str(path), seed=3))
    assert (len(got.train), len(got.val)) == (54, 6)
    assert got.note == (
        "tasks.jsonl: no split field: holding out 10% = 6 of 60 tasks as val "
        "(seed 3; tasks.holdout)"
    )
    assert {t.split for t in got.val} == {Split.VAL} and {t.split for t in got.train} == {
        Split.TRAIN
    }
    again = load_task_set(TasksConfig(source=str(path), seed=3))
    assert [t.id for t in again.val] == [t.id for t in got.val]  # seeded
    other = load_task_set(TasksConfig(source=str(path), seed=4))
    assert [t.id for t in other.val] != [t.id for t in got.val]
    assert not {t.id for t in got.val} & {t.id for t in got.train}
    # a file that has split fields is split by them, as before, with no note
    (tmp_path / "split.jsonl").write_text('{"split": "train"}\n{"split": "val"}\n{}\n')
    train, val = load_tasks(TasksConfig(source=str(tmp_path / "split.jsonl")))
    assert (len(train), len(val)) == (2, 1)
    assert load_task_set(TasksConfig(source=str(tmp_path / "split.jsonl"))).note is None


def test_holdout_is_validated() -> None:
    from tether.errors import UserError

    for bad in (1.0, -0.1, True):
        with pytest.raises(UserError, match=r"tasks\.holdout"):
            TasksConfig(holdout=bad)


def test_a_run_without_val_tasks_runs_and_records_no_eval(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Every line says "train": the evals are skipped, said once, and no 0% is stored."""
    tasks = _write_tasks(tmp_path / "tasks.jsonl", 4, split="train", grader={"answer": 7})
    out = _train(
        tmp_path,
        starter_dir,
        f"tasks.source={tasks}",
        f"agent.command={sys.executable} -c print(7)",
        "agent.mode=process",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    both = out.stdout + out.stderr
    assert both.count("no val tasks: the held-out evals are skipped") == 2  # status + log
    assert "evaluating at step" not in both and "sampled success" not in both
    assert "0 held-out tasks" not in both
    assert "no held-out eval (eval.enabled is false, or no val tasks)" in out.stdout
    with sqlite3.connect(tmp_path / "calc" / "traces.sqlite") as conn:
        names = {r[0] for r in conn.execute("SELECT DISTINCT name FROM metrics")}
    assert "reward_mean" in names and not {n for n in names if n.startswith("eval/")}


def test_a_run_on_a_split_less_file_says_its_holdout_and_evaluates_it(
    starter_dir: Path, tmp_path: Path
) -> None:
    tasks = _write_tasks(tmp_path / "tasks.jsonl", 20, grader={"answer": 7})
    out = _train(
        tmp_path,
        starter_dir,
        f"tasks.source={tasks}",
        f"agent.command={sys.executable} -c print(7)",
        "agent.mode=process",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no split field: holding out 10% = 2 of 20 tasks as val" in out.stdout
    assert "evaluating at step 0: 2 tasks × 1 sample" in out.stdout
    assert "1 samples" not in out.stdout


# -- what the agent receives ---------------------------------------------------------------

PRINTING_AGENT = "import os\n\nprint(os.environ['TETHER_TASK'])\n"

RECORDING_GRADER = """\
import json, os


def grade(task, answer):
    with open(os.environ["SEEN_BY_GRADER"], "a") as f:
        f.write(json.dumps(task) + "\\n")
    return 1.0 if json.loads(answer)["id"] == task["id"] else 0.0
"""

INPROCESS_AGENT = """\
import json


async def main(task, client):
    return json.dumps(task)
"""


@pytest.mark.parametrize("mode", ["process", "inprocess"])
def test_the_agent_never_receives_private_fields_and_the_grader_gets_them(
    mode: str, starter_dir: Path, tmp_path: Path
) -> None:
    tasks = _write_tasks(tmp_path / "tasks.jsonl", 6, answer=3, solution="1 + 2", grader={"key": 9})
    (tmp_path / "grader.py").write_text(RECORDING_GRADER)
    (tmp_path / "agent.py").write_text(INPROCESS_AGENT)
    (tmp_path / "print_agent.py").write_text(PRINTING_AGENT)
    agent = (
        ["agent.mode=process", f"agent.command={sys.executable} {tmp_path / 'print_agent.py'}"]
        if mode == "process"
        else ["agent.mode=inprocess", f"agent.entry={tmp_path / 'agent.py'}:main"]
    )
    seen = tmp_path / "seen.jsonl"
    os.environ["SEEN_BY_GRADER"] = str(seen)  # the grader runs in the training process
    try:
        out = _train(
            tmp_path,
            starter_dir,
            f"tasks.source={tasks}",
            f"rollout.grader={tmp_path / 'grader.py'}:grade",
            "tasks.private_fields=[answer]",
            *agent,
        )
    finally:
        del os.environ["SEEN_BY_GRADER"]
    assert out.returncode == 0, out.stderr[-3000:]
    with sqlite3.connect(tmp_path / "calc" / "traces.sqlite") as conn:
        rows = conn.execute("SELECT task, final_answer, reward FROM rollouts").fetchall()
    assert rows
    for task, answer, reward in rows:
        for received in (json.loads(task), json.loads(answer)):  # stored, and as the agent saw it
            assert set(received) == {"id", "question", "solution"}, received
        assert reward == 1.0
    graded = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(graded) == len(rows)
    assert all(g["answer"] == 3 and g["grader"] == {"key": 9} for g in graded)
    # "solution" reached the agent: one warning for the whole run, naming it
    warnings = [line for line in out.stderr.splitlines() if "the agent receives" in line]
    assert len(warnings) == 1, out.stderr[-3000:]
    assert "task field(s) solution:" in warnings[0]
    assert "tasks.private_fields=[solution]" in warnings[0]


def test_calc_tasks_keep_their_answer_from_the_agent_and_the_grader_reads_it() -> None:
    train, val = load_tasks(TasksConfig(train_size=5, val_size=2))
    for t in train + val:
        assert set(t.for_agent) == {"id", "question"}
        assert calc.grade(t.data, f"The answer is {t.data['grader']['answer']}.") == 1.0
    assert exposed_fields(train + val) == []
    assert exposed_fields(load_tasks(TasksConfig(train_size=2, private_fields=[]))[0]) == []


async def test_the_admin_route_stores_the_task_without_its_grader_field(
    make_gateway: Any,
) -> None:
    gw = make_gateway(NullEngine())
    transport = httpx.ASGITransport(app=create_app(gw))
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        task = {"q": "2+2", "grader": {"answer": 4}}
        r = await c.post("/admin/rollouts", json={"task": task, "rollout_id": "r-p"}, headers=admin)
        assert r.status_code == 201
        got = (await c.get("/admin/rollouts/r-p", headers=admin)).json()
    assert got["task"] == {"q": "2+2"}
    assert gw.store.get_rollout("r-p").task == {"q": "2+2"}


def test_tether_eval_without_val_tasks_is_one_line(starter_dir: Path, tmp_path: Path) -> None:
    tasks = _write_tasks(tmp_path / "tasks.jsonl", 3, split="train", grader={"answer": 7})
    out = subprocess.run(
        [*TETHER, "eval", str(ROOT / "examples/calc/config.yaml"), f"dir={tmp_path}",
         f"model.path={starter_dir}", f"tasks.source={tasks}"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: tether eval: {tasks} gives no val tasks to evaluate on; mark some with "
        '"split": "val" (or drop every split field to hold out tasks.holdout of them)'
    ], out.stderr[-3000:]
    assert "sampled success" not in out.stdout
