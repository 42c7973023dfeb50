"""Issue 34's six deliberate mistakes, each through the real command in a subprocess.

Five mistakes in what the user gave (a typo'd key, a missing grader file, a YAML
syntax error, ``model: X``, a bad choice value) give one line on stderr and exit
status 2, before any model loads; a broken agent (every rollout fails) gives one
line and exit status 1, a runtime failure. Each runs ``tether train`` on a copy of
examples/calc/config.yaml (with its agent beside it) in ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import TINY_RUN

ROOT = Path(__file__).resolve().parents[1]
TETHER = [sys.executable, "-m", "tether.cli"]

# A process agent that fails every rollout, like a Node agent without its node_modules.
BROKEN_AGENT = """\
import sys
sys.stderr.write("Error: Cannot find module 'openai'\\n")
sys.exit(1)
"""

# The smallest run (tests.helpers.TINY_RUN) with no tracking sink.
TINY = [*TINY_RUN, "tracking=[]"]


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _typo(text: str) -> str:
    return _edit(text, "  lr: 1.0e-4", "  lrr: 1.0e-4")


def _grader(text: str) -> str:
    return _edit(text, "grader: tether.starter.calc:grade", "grader: gradr.py:grade")


def _yaml(text: str) -> str:
    return _edit(text, "  n: 8 ", "  n: [8 ")


def _model(text: str) -> str:
    return re.sub(r"^model:\n(  .*\n)+", "model: Qwen/Qwen2.5-1.5B-Instruct\n", text, flags=re.M)


def _choice(text: str) -> str:
    return text + "engine:\n  kind: vlm\n"


def _broken(text: str) -> str:
    return _edit(
        text,
        "  mode: pool\n  entry: agent.py:main",
        "  mode: process\n  command: [python, broken.py]",
    )


def _line(text: str, start: str) -> int:
    """The line number of the first line of ``text`` that starts with ``start``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(start))


@pytest.mark.parametrize(
    "edit,status,line",
    [
        (_typo, 2, "{config}:{line:  lrr}: unknown config key 'trainer.lrr' (did you mean 'lr'?)"),
        (
            _grader,
            2,
            "rollout.grader names {folder}/gradr.py, which does not exist: fix the path "
            "(in a config file, relative to its folder)",
        ),
        (
            _yaml,
            2,
            "{config}:{line:  batch_groups}:3: not valid YAML: expected ',' or ']', but got "
            "'<scalar>' (while parsing a flow sequence)",
        ),
        (
            _model,
            2,
            "{config}:{line:model}: model: expected a mapping with keys path, device, "
            "train_dtype, max_batch_size, rollout_dtype, got 'Qwen/Qwen2.5-1.5B-Instruct'; "
            "write model.path: Qwen/Qwen2.5-1.5B-Instruct",
        ),
        (
            _choice,
            2,
            "{config}:{line:  kind}: engine.kind ('vlm') must be one of 'transformers', "
            "'vllm', 'sglang'",
        ),
        (_broken, 1, "all 4 rollouts of the step-0 eval failed; first failure: "),
    ],
    ids=["typo", "missing-grader", "yaml", "model-scalar", "bad-choice", "broken-agent"],
)
def test_each_mistake_is_one_line_and_its_exit_status(
    edit: Callable[[str], str], status: int, line: str, starter_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "calc"
    shutil.copytree(ROOT / "examples/calc", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "broken.py").write_text(BROKEN_AGENT)
    config = folder / "config.yaml"
    text = edit(config.read_text())
    config.write_text(text)
    # a run needs a model: the starter, built once for the tests (TETHER_TEST_CACHE)
    run = [f"model.path={starter_dir}", *TINY] if status == 1 else []
    done = subprocess.run(
        [*TETHER, "train", str(config), *run],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "300"},
    )
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == status, done.stderr[-3000:]
    assert len(lines) == 1, done.stderr[-3000:]
    expected = re.sub(r"\{line:([^}]*)\}", lambda m: str(_line(text, m[1])), line)
    expected = "error: " + expected.format(config=config, folder=folder)
    assert lines[0].startswith(expected), lines[0]
    print(lines[0])  # pytest -s shows the six lines (issue 34's closing note lists them)
