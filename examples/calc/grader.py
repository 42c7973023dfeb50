"""The calc grader, named in a run config as ``examples/calc/grader.py:grade``.

``grade(task, answer)`` is 1.0 when the last number in the agent's final
answer equals ``task["grader"]["answer"]`` (the row's grader-only object, which
the agent never receives), else 0.0.
"""

from __future__ import annotations

from tether.starter.calc import grade

__all__ = ["grade"]
