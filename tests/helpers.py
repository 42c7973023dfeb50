"""Helpers shared by several test modules (test modules do not import each other).

Agent and grader specs in test configs may point here too, e.g.
``grader="tests.helpers:alternating_grader"``.
"""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import psutil

from tether.runner import Launch

__all__ = ["ADMIN_KEY", "alive", "alternating_grader", "launch", "script"]

ADMIN_KEY = "test-admin-key-0123456789"  # the admin key of the test gateways (conftest)


def launch(i: int = 0, task: dict | None = None, **kw) -> Launch:
    """The launch of rollout ``r{i}`` (attempt 1) against a gateway at ``http://gw``."""
    kw.setdefault("reward_url", f"http://gw/rollouts/r{i}/reward")
    return Launch(f"r{i}", 1, f"http://gw/rollouts/r{i}/v1", f"tok-{i}", task or {"x": i}, **kw)


def script(tmp_path: Path, name: str, code: str) -> str:
    """Write a dedented agent script to ``tmp_path/name``; returns its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_graded: collections.Counter[str] = collections.Counter()


def alternating_grader(task: dict, answer: str | None) -> float:
    """Rewards 0, 1, 0, 1, ... per task in grading order: every group of even size has variance.

    Counted per task, not globally: rollouts of concurrent groups finish interleaved, and a
    global count could hand one group 0, 0 (no variance, so no update).
    """
    n = _graded[task["id"]]
    _graded[task["id"]] += 1
    return float(n % 2)
