"""What a new user sees in the first hour, through the real ``tether`` command: the version,
help that fits 80 columns, what a run prints before its first eval ends, and
``tether rollouts list|show`` finding a run's store by its name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TETHER = [sys.executable, "-m", "tether.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [*TETHER, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def test_version() -> None:
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.startswith("tether "), r.stderr


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["serve"],
        ["train"],
        ["eval"],
        ["check"],
        ["demo"],
        ["rollouts"],
        ["rollouts", "list"],
        ["rollouts", "show"],
        ["dashboard"],
        ["export"],
        ["report"],
        ["config"],
    ],
)
def test_help_is_not_cut_at_80_columns(command: list[str]) -> None:
    env_cols = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run(
        [*TETHER, *command, "--help"], capture_output=True, text=True, timeout=60, env=env_cols
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not [ln for ln in lines if "…" in ln], r.stdout
    # click shortens a command's one-line summary with "..." when it does not fit
    assert not [ln for ln in lines[1:] if ln.rstrip().endswith("...")], r.stdout
    assert max(len(ln) for ln in lines) <= 80, r.stdout


def test_a_run_says_what_it_does_and_its_rollouts_are_found_by_run_name(
    starter_dir: Path, tmp_path: Path
) -> None:
    overrides = [
        f"model.path={starter_dir}",
        "tasks.train_size=8",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "trainer.steps=1",
        "eval.tasks=2",
        "eval.samples=2",
        "eval.greedy=true",
        "gateway.default_max_tokens=16",
    ]
    out = _run(
        "train", str(ROOT / "examples/calc/config.yaml"), *overrides, cwd=tmp_path, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    # Before the first eval ends: the model, the run folder and store, the eval and its progress.
    first_eval = text.index("eval @ step 0")
    for needle in (
        f"loading the model {starter_dir}",
        "run folder runs/calc  traces runs/calc/traces.sqlite",
        "starting the gateway",
        "evaluating at step 0: 2 tasks × 2 samples + greedy (6 rollouts)",
        "eval: 2/6 rollouts (33%)",
    ):
        assert 0 <= text.find(needle) < first_eval, (needle, text)
    assert " gap - " in text  # no update happened (all rewards 0): no gap to show, not "nan"

    listed = _run("rollouts", "list", "calc", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    ids = [ln.split("\t")[0] for ln in listed.stdout.splitlines()[1:]]
    assert len(ids) == 6 + 2 + 6 and all(i.startswith("calc-") for i in ids)
    # show finds the rollout in its run's store without being told where it is
    shown = _run("rollouts", "show", ids[0], cwd=tmp_path)
    assert shown.returncode == 0 and f"rollout {ids[0]}" in shown.stdout, shown.stderr
    # the default store does not exist here: the error names the runs that do
    bare = _run("rollouts", "list", cwd=tmp_path)
    assert bare.returncode == 2 and "tether rollouts list calc" in bare.stderr, bare.stderr
    missing = _run("rollouts", "list", "calcc", cwd=tmp_path)
    assert missing.returncode == 2 and "no run 'calcc'" in missing.stderr, missing.stderr
    # --store still works and wins
    by_store = _run("rollouts", "list", "--store", "runs/calc/traces.sqlite", cwd=tmp_path)
    assert by_store.returncode == 0 and ids[0] in by_store.stdout
