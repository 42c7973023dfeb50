"""The search grader: named in a run config as ``examples/search/grader.py:grade``.

``grade(task, answer)`` is 1.0 when the agent's answer, normalized, equals
one of ``task["answers"]`` normalized, else 0.0. The answer is the text after
the last "answer is" when there is one (the agent is asked to reply "The
answer is X."), else the whole reply. Normalizing (as SQuAD's exact match
does): lower case, punctuation and the articles a/an/the dropped, spaces
collapsed — so "The answer is the Lantern Festival." matches "Lantern
Festival", while a longer reply that merely contains the answer does not.
"""

from __future__ import annotations

import re
import string
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_IS = re.compile(r"answer is\s*:?", re.IGNORECASE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def extract(answer: str) -> str:
    """The part of the reply that states the answer."""
    parts = _ANSWER_IS.split(answer)
    return parts[-1] if len(parts) > 1 else answer


def grade(task: dict[str, Any], answer: str | None) -> float:
    """1.0 if the stated answer matches one of ``task["answers"]`` after normalizing."""
    if not answer:
        return 0.0
    got = normalize(extract(answer))
    return 1.0 if got and got in {normalize(a) for a in task["answers"]} else 0.0
