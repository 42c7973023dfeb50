"""``tether train`` / ``tether eval`` through the real CLI: run names, --resume, config paths,
eval controls. Tiny runs on the untrained starter model with the in-process calc agent."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tether.run import holds_run
from tether.store import Store
from tether.trainer.checkpoint import checkpoint_state

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calc/config.yaml"
_graded = itertools.count()


def grade_alternately(task: dict, answer: str | None) -> float:
    """0, 1, 0, 1, ... in grading order: with one group of 2 per step, every update happens."""
    return float(next(_graded) % 2)


def _tether(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def _tiny(out: Path, model: Path, *more: str) -> list[str]:
    return [
        f"dir={out}",
        f"model.path={model}",
        "tasks.train_size=10",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "rollout.grader=tests.test_cli_runs:grade_alternately",
        "eval.tasks=1",
        "eval.samples=2",
        "eval.greedy=false",
        "gateway.default_max_tokens=16",
        "run.collapse_patience=0",
        *more,
    ]


@pytest.mark.slow
def test_a_name_is_one_run_and_resume_continues_it(starter_dir: Path, tmp_path: Path) -> None:
    """Two steps, a second run of the name refused, the run resumed to three steps (step,
    policy version, history and evals carry on), then a run under a new name: nothing lost."""
    tiny = _tiny(tmp_path, starter_dir, "checkpoint.every=1", "checkpoint.keep=1")
    first = _tether("train", str(CONFIG), *tiny, "trainer.steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    ckpts = tmp_path / "calc" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000002"]  # keep=1 of its own
    assert checkpoint_state(ckpts / "step-000002")["policy_version"] == 2

    again = _tether("train", str(CONFIG), *tiny, "trainer.steps=2")
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0, again.stderr  # one line
    assert "run 'calc' already exists in" in again.stderr
    assert "--resume" in again.stderr and "name=calc-2" in again.stderr

    resumed = _tether("train", str(CONFIG), *tiny, "trainer.steps=3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    assert "resumed from " in out and "step-000002: step 3/3 next" in out
    assert "eval @ step 0" not in out and "eval @ step 3" in out  # step-0 eval not repeated
    (line3,) = [ln for ln in out.splitlines() if ln.startswith("step   3/3")]
    assert " v3 " in line3 and "left 0.0 min" in line3, line3  # continues at v2 -> v3
    assert "after update 3" in out  # the history holds all three updates
    assert "held-out success: before " in out and ", 3 steps, " in out
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000003"]
    assert checkpoint_state(ckpts / "step-000003")["policy_version"] == 3
    assert (tmp_path / "calc" / "reward_curve.png").is_file()
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        first_rec, second_rec = store.list_runs()
        assert second_rec.config["extra"]["resumed_from"] == first_rec.id
        assert second_rec.config["extra"]["resumed_at"] == 2
        assert checkpoint_state(ckpts / "step-000003")["run"] == first_rec.id
        calls = [
            c
            for r in store.list_rollouts(run_id=second_rec.id)
            if "-s3-" in r.id
            for c in store.calls(r.id)
        ]
        assert calls and {c.policy_version for c in calls} == {2}  # step 3 sampled by v2
        before = {m.step for m in store.metrics(first_rec.id, "reward_mean")}
        after = {m.step for m in store.metrics(second_rec.id, "reward_mean")}
        assert (before, after) == ({1, 2}, {3})

    done = _tether("train", str(CONFIG), *tiny, "trainer.steps=3", "--resume")
    assert done.returncode == 2 and "run 'calc' is finished" in done.stderr
    assert "trainer.steps=6" in done.stderr

    nothing = _tether("train", str(CONFIG), *tiny, "name=never", "--resume")
    assert nothing.returncode == 2
    assert "cannot resume run 'never'" in nothing.stderr and "drop --resume" in nothing.stderr

    other = _tether("train", str(CONFIG), *tiny, "name=calc-2", "trainer.steps=1")
    assert other.returncode == 0, other.stderr[-3000:]
    assert (tmp_path / "calc-2" / "checkpoints" / "step-000001").is_dir()
    assert (ckpts / "step-000003").is_dir()  # the first run lost nothing

    ev = _tether(
        "eval", str(CONFIG), *tiny, "name=evalonly", "--checkpoint", str(ckpts / "step-000003")
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "eval @ step 3:" in ev.stdout + ev.stderr  # the checkpoint's step, not 0
    assert (tmp_path / "evalonly" / "traces.sqlite").is_file()
    assert not holds_run(tmp_path / "evalonly")  # an eval's record does not take the name


def test_a_config_elsewhere_with_relative_paths_and_no_evals(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Agent file, task file and grader file named relative to the config's folder, run from
    another directory; eval.enabled=false skips every eval and the summary says so."""
    from tether.starter.calc import make_tasks

    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    rows = [{**t, "split": "train"} for t in make_tasks(4, "train", 0)]
    rows += [{**t, "split": "val"} for t in make_tasks(2, "val", 0)]
    (proj / "data" / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (proj / "my_agent.py").write_text("from tether.starter.calc import agent  # noqa: F401\n")
    (proj / "grader.py").write_text(
        "def grade(task, answer):\n    return 1.0 if task['id'].startswith('calc-train') else 0.5\n"
    )
    (proj / "config.yaml").write_text(
        "name: moved\n"
        "agent:\n  mode: inprocess\n  entry: my_agent.py:agent\n"
        "tasks:\n  source: data/tasks.jsonl\n"
        "rollout:\n  n: 2\n  batch_groups: 1\n  grader: grader.py:grade\n"
        "trainer:\n  steps: 1\n"
        "eval:\n  enabled: false\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(CONFIG, elsewhere / "decoy.yaml")  # nothing of the repo's cwd is needed
    r = _tether(
        "train",
        "../proj/config.yaml",
        f"model.path={starter_dir}",
        "gateway.default_max_tokens=16",
        "dir=runs",
        cwd=elsewhere,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "reward 1.000" in out  # every rollout ran the agent and was graded by grader.py
    assert "eval @" not in out
    assert "no held-out eval (eval.enabled is false, or no val tasks), 1 steps" in out
    assert (elsewhere / "runs" / "moved" / "checkpoints" / "step-000001").is_dir()


@pytest.mark.slow
def test_a_resumed_run_numbers_its_steps_once(starter_dir: Path, tmp_path: Path) -> None:
    """Stopped after the checkpoint of step 2, resumed to 4: every step number the run writes
    (metrics, checkpoints, TensorBoard scalars and samples, the progress lines) is 1..4 once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tiny = _tiny(
        tmp_path,
        starter_dir,
        "checkpoint.every=1",
        "checkpoint.keep=4",
        "eval.enabled=false",
        "tracking.log_samples=true",
    )
    first = _tether("train", str(CONFIG), *tiny, "trainer.steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _tether("train", str(CONFIG), *tiny, "trainer.steps=4", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = [
        ln.split()[1]
        for out in (first, resumed)
        for ln in (out.stdout + out.stderr).splitlines()
        if ln.startswith("step ")
    ]
    assert lines == ["1/2", "2/2", "3/4", "4/4"], lines
    run_dir = tmp_path / "calc"
    with Store(run_dir / "traces.sqlite") as store:
        steps = [m.step for r in store.list_runs() for m in store.metrics(r.id, "reward_mean")]
        assert steps == [1, 2, 3, 4]
        ckpts = [c.step for r in store.list_runs() for c in store.checkpoints(r.id)]
        assert sorted(ckpts) == [1, 2, 3, 4]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        f"step-{s:06d}" for s in (1, 2, 3, 4)
    ]
    ea = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    ea.Reload()
    assert sorted(e.step for e in ea.Scalars("train/reward_mean")) == [1, 2, 3, 4]
    assert sorted(e.step for e in ea.Tensors("samples/text_summary")) == [1, 2, 3, 4]
