"""``rollout.judge``: the judge model of ``rollout.grader: judge`` (docs/judge.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tether.errors import UserError
from tether.run._checks import at_least

__all__ = ["JudgeConfig"]


@dataclass
class JudgeConfig:
    #: The judge's OpenAI-compatible endpoint, e.g. https://api.openai.com/v1, or a
    #: tether serve's record mode http://127.0.0.1:8000/v1; needed by rollout.grader=judge.
    base_url: str = ""
    #: The judge model's name at that endpoint, e.g. gpt-4.1-mini.
    model: str = ""
    #: The name of the environment variable that holds the judge's API key (e.g.
    #: OPENAI_API_KEY); the key itself is never in the config or the store. Empty: no key.
    api_key_env: str = ""
    #: Grading standards added to the judge's prompt (text); empty = tether's default rubric.
    rubric: str = ""
    #: A text file holding the rubric instead (in a config file, relative to its folder).
    rubric_file: str = ""
    #: Show the judge each rollout's conversation (its last call's messages and reply),
    #: not only its final answer.
    conversation: bool = False
    #: Ask for the answer's JSON shape with response_format json_schema (false for an
    #: endpoint that refuses it: the prompt alone then asks for the shape).
    structured: bool = True
    #: Seconds one judge request may take.
    timeout_s: float = 60.0
    #: Most tokens of the judge's answer.
    max_tokens: int = 1024
    #: The judge's sampling temperature (0: its most likely verdict).
    temperature: float = 0.0
    #: Retries of a request that fails in transport (connection, timeout, 429, 5xx); an
    #: answer that does not parse is not retried: the group's grade fails with its text.
    retries: int = 2

    def __post_init__(self) -> None:
        at_least(0, "rollout.judge.retries", self.retries, "0 sends each request once")
        at_least(1, "rollout.judge.max_tokens", self.max_tokens, "e.g. 1024")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UserError(f"rollout.judge.timeout_s ({self.timeout_s}) must be > 0; e.g. 60")
        t = self.temperature
        if isinstance(t, bool) or not (math.isfinite(t) and t >= 0):
            raise UserError(f"rollout.judge.temperature ({t}) must be >= 0; e.g. 0")
        if self.rubric and self.rubric_file:
            raise UserError(
                "rollout.judge.rubric and rollout.judge.rubric_file are both set: keep one"
            )

    def check_ready(self) -> None:
        """What ``rollout.grader: judge`` needs: an endpoint and a model."""
        for key, fix in (("base_url", "http://127.0.0.1:8000/v1"), ("model", "gpt-4.1-mini")):
            if not getattr(self, key):
                raise UserError(
                    f"rollout.grader=judge needs rollout.judge.{key}; set it, e.g. "
                    f"rollout.judge.{key}={fix}"
                )
