"""The wordmath grader: named in a run config as ``examples/wordmath/grader.py:grade``.

``grade(task, answer)`` is 1.0 when the last number in the agent's final
answer equals ``task["answer"]`` (``$``, thousands separators and a trailing
``.0`` are fine), else 0.0. The last number counts, so "12 + 7 = 19" scores
and "19, no wait, 20" does not.
"""

from __future__ import annotations

import math
import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def final_number(text: str | None) -> float | None:
    """The last number in ``text``, or None when there is none."""
    if not text:
        return None
    found = _NUMBER.findall(_THOUSANDS.sub("", text))
    return float(found[-1]) if found else None


def grade(task: dict[str, Any], answer: str | None) -> float:
    """1.0 if the final number of ``answer`` equals ``task["answer"]``, else 0.0."""
    got = final_number(answer)
    if got is None:
        return 0.0
    return 1.0 if math.isclose(got, float(task["answer"]), rel_tol=1e-9, abs_tol=1e-6) else 0.0
