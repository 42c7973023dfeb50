"""The coding grader: named in a run config as ``examples/coding/grader.py:grade``.

The agent's final answer is one JSON line, ``{"files": {path: content}}``:
the files it changed. ``grade(task, answer)`` rebuilds the repository from
the task's files in a fresh temporary directory, applies the changed source
files, adds the repository's hidden tests (``repos/NAME/hidden/``, which the
agent never saw) and runs them with pytest in a subprocess with a time limit.
It returns ``{"reward": float, "success": bool}``: the reward is the
fraction of hidden tests that pass (0.0 when the answer is not that JSON,
when the run times out, or when the tests cannot even be collected); success
means every hidden test passes, so the tests the bug made fail now pass. The
unchanged repository already passes a third to two thirds of its hidden
tests: that partial reward is a signal to learn from, not a success.

Only changes to the repository's own ``.py`` source files count: new files
(a ``conftest.py``, a ``pytest.py`` that would shadow pytest, a
``sitecustomize.py``) and edits to tests are ignored, so the agent cannot pass
by rewriting what is checked or how.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path, PurePosixPath
from typing import Any

from coding_workspace import Workspace, run_pytest

REPOS = Path(__file__).resolve().with_name("repos")
HIDDEN_DIR = "tests_hidden"
GRADE_TIMEOUT_S = 30.0


def hidden_tests(repo: str) -> dict[str, str]:
    """The hidden test files of ``repo``, by file name."""
    folder = REPOS / repo / "hidden"
    if not repo.isidentifier() or not folder.is_dir():
        raise ValueError(f"no hidden tests for repo {repo!r} under {REPOS}")
    return {p.name: p.read_text() for p in sorted(folder.glob("test_*.py"))}


def count_tests(source: str) -> int:
    """Top-level ``test_*`` functions in a test file (pytest may report more when parametrized)."""
    tree = ast.parse(source)
    return sum(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
        for node in tree.body
    )


def is_source(path: str, task: dict[str, Any]) -> bool:
    """Whether a changed file counts: one of the task's ``.py`` files that is not a test."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return (
        path in task["files"]
        and name.endswith(".py")
        and not name.startswith("test_")
        and name != "conftest.py"
        and "tests" not in parts[:-1]
    )


def changed_files(answer: str | None) -> dict[str, str] | None:
    """The ``files`` of the agent's answer, or None when the answer is not that JSON."""
    try:
        files = json.loads(answer or "")["files"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        return None
    return files


def grade(task: dict[str, Any], answer: str | None) -> dict[str, Any]:
    """``{"reward": fraction of task's hidden tests passing with the agent's changes,
    "success": whether all of them pass}`` (tether's grader result with a success flag)."""
    reward = hidden_pass_rate(task, answer)
    return {"reward": reward, "success": reward == 1.0}


def hidden_pass_rate(task: dict[str, Any], answer: str | None) -> float:
    """The fraction of ``task``'s hidden tests that pass with the agent's changes."""
    changes = changed_files(answer)
    if changes is None:
        return 0.0
    hidden = hidden_tests(task["repo"])
    expected = sum(count_tests(text) for text in hidden.values())
    with Workspace(task["files"], prefix="tether-grade-") as ws:
        for path, text in changes.items():
            if is_source(path, task):
                ws.write_file(path, text)
        for name, text in hidden.items():
            ws.write_file(f"{HIDDEN_DIR}/{name}", text)
        run = run_pytest(ws.root, [HIDDEN_DIR], GRADE_TIMEOUT_S)
    if run.timed_out:
        return 0.0
    return run.passed / max(expected, run.total, 1)
