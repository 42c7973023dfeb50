"""The README's "train your own agent" quickstart: its files are the ones in
examples/quickstart/, its own commands train 2 updates on the starter model, and the
README stays under 250 lines."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART = ROOT / "examples" / "quickstart"
FILES = ("tasks.jsonl", "grader.py", "config.yaml", "agent.py")
# what the README's quickstart runs, made small enough for a test: 2 updates of 2 groups
# of 2 rollouts, one sampled eval rollout (the starter model stands for the hub model)
SMALL = ("trainer.steps=2", "rollout.n=2", "eval.samples=1", "eval.greedy=false")


def _blocks() -> list[tuple[str, str]]:
    """Each fenced code block of the README: (the line after its fence, its body)."""
    found = re.findall(r"^```[^\n]*\n(.*?)^```$", README.read_text(), flags=re.S | re.M)
    return [(body.split("\n", 1)[0], body) for body in found]


def _block_for(name: str) -> str:
    """The README's block that shows examples/quickstart/<name>: it opens with a
    ``# examples/quickstart/<name>`` line (or the file's own first line for JSONL)."""
    for first, body in _blocks():
        if first.strip() == f"# examples/quickstart/{name}":
            return body.split("\n", 1)[1]
    raise AssertionError(f"README.md has no code block opening with # examples/quickstart/{name}")


def _commands() -> list[list[str]]:
    """The README's quickstart commands: the block whose first line is ``tether train``."""
    for first, body in _blocks():
        if first.startswith("tether train examples/quickstart/"):
            lines = [ln.split("#", 1)[0].strip() for ln in body.splitlines()]
            return [shlex.split(ln) for ln in lines if ln]
    raise AssertionError("README.md has no block starting with tether train examples/quickstart/")


def test_readme_is_at_most_250_lines() -> None:
    n = len(README.read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; move detail into docs/ (250 at most)"


@pytest.mark.parametrize("name", FILES)
def test_the_readme_shows_the_quickstart_files_as_they_are(name: str) -> None:
    if name == "tasks.jsonl":
        body = next(b for f, b in _blocks() if f.startswith('{"question"'))
    else:
        body = _block_for(name)
    assert body == (QUICKSTART / name).read_text(), (
        f"README.md's examples/quickstart/{name} differs from the file; make them equal"
    )


def _tether(args: list[str], cwd: Path, starter_dir: Path) -> subprocess.CompletedProcess:
    assert args[0] == "tether", args
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # the agent's command is `python agent.py`: the python that has the openai SDK
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
    }
    extra = [f"model.path={starter_dir}", *SMALL] if args[1] == "train" else []
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", *args[1:], *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


@pytest.mark.slow
def test_the_readme_commands_train_two_updates(starter_dir: Path, tmp_path: Path) -> None:
    from tether.store import Store

    shutil.copytree(QUICKSTART, tmp_path / "examples" / "quickstart")
    commands = _commands()
    assert [c[:2] for c in commands] == [
        ["tether", "train"],
        ["tether", "rollouts"],
        ["tether", "dashboard"],
    ]
    train, listing = (_tether(c, tmp_path, starter_dir) for c in commands[:2])
    assert train.returncode == 0, train.stderr[-3000:]
    assert "step   2/2" in train.stderr + train.stdout, train.stderr[-3000:]
    assert listing.returncode == 0 and "quickstart-" in listing.stdout, listing.stderr

    store = Store(tmp_path / "runs" / "quickstart" / "traces.sqlite")
    try:
        (run,) = store.list_runs()
        versions = [m.value for m in store.metrics(run.id, "policy_version")]
        rewards = [r.reward for r in store.list_rollouts(run.id) if r.reward is not None]
    finally:
        store.close()
    assert max(versions) == 2, versions  # two updates, each raising the policy version
    assert len(rewards) >= 2 * 2 * 2, rewards  # every training rollout graded
