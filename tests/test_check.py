"""``tether check``: the plan and "ok" for a good config, every problem at once for a bad
one (exit status 2), and ``tether train`` stopping on the same problems before the model
loads. Through the real command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calc/config.yaml"
TETHER = [sys.executable, "-m", "tether.cli"]


def _tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TETHER, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "300"},
    )


def test_a_good_config_prints_the_plan_and_ok(starter_dir: Path, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "question": f"1 + {i}", "split": "val" if i < 2 else "train"}
            for i in range(7)]  # fmt: skip
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _tether("check", str(CONFIG), f"model.path={starter_dir}", f"tasks.source={tasks}",
                   "trainer.steps=3", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[-1] == "ok" and done.stderr == "", done.stdout + done.stderr
    assert f"agent: {ROOT}/examples/calc/agent.py:main (pool, 32 at a time), imported" in out
    assert "grader: tether.starter.calc:grade, imported" in out
    assert f"tasks: {tasks}: 5 train, 2 val" in out
    assert f"model: {starter_dir} on cpu, trained in float32" in out
    (prompt,) = [x for x in out if x.startswith("prompt: ")]
    assert prompt.startswith("prompt: task t2 as a user message is ")
    assert "updates: 3 (sync), grpo; 8 groups x 8 rollouts = 64 rollouts per update" in out
    assert "store: runs/calc/traces.sqlite" in out
    assert not (tmp_path / "runs").exists()  # a check makes nothing


def test_every_problem_is_its_own_line(starter_dir: Path, tmp_path: Path) -> None:
    done = _tether(
        "check", str(CONFIG), f"model.path={starter_dir}", "agent.entry=nothere.py:main",
        "rollout.grader=gradr.py:grade", f"tasks.source={tmp_path / 'no.jsonl'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    errors = done.stderr.splitlines()
    assert errors[0] == "error: 3 problems found before loading the model:", done.stderr
    assert errors[1].startswith("  cannot import agent ('nothere.py:main'): FileNotFoundError: ")
    assert errors[2] == (
        "  rollout.grader names gradr.py, which does not exist: fix the path (in a config "
        "file, relative to its folder)"
    )
    assert errors[3] == (
        f"  tasks.source ('{tmp_path / 'no.jsonl'}') must be 'calc' or a JSONL file that exists"
    )
    assert len(errors) == 4, done.stderr
    assert "ok" not in done.stdout.splitlines()


def test_train_stops_on_a_missing_tasks_file_before_the_model_loads(
    starter_dir: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = _tether("train", str(CONFIG), f"model.path={starter_dir}",
                   f"tasks.source={tmp_path / 'tasks.jsonl'}", cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: tasks.source ('{tmp_path / 'tasks.jsonl'}') must be 'calc' or a JSONL file "
        "that exists"
    ]
    assert "loading the model" not in done.stdout
    assert not (tmp_path / "runs").exists()
    print(f"tether train refused a missing tasks file in {took:.1f} s")


def test_an_agent_that_raises_on_import_is_one_line(starter_dir: Path, tmp_path: Path) -> None:
    """A pool agent is imported as a worker imports it, its argv its own file."""
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import sys\nassert sys.argv == [__file__], sys.argv\nraise RuntimeError('no key')\n"
    )
    done = _tether("check", str(CONFIG), f"model.path={starter_dir}", f"agent.entry={agent}:main",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"error: cannot import agent ('{agent}:main'): RuntimeError: no key"
    ]
