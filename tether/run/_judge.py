"""A judge model as the grader (``rollout.grader: judge``): one call per group.

As ART's RULER does, the judge sees the task and the group's candidates side by
side (each rollout's final answer, or with ``rollout.judge.conversation`` its
last call's messages and reply), labelled ``1``..``N``, and answers one JSON
object with a short explanation and a score in [0, 1] for every candidate.
Scores are relative within the group, which is all GRPO's group advantages use.

The judge is any OpenAI-compatible endpoint (``tether serve``'s record mode
included), called with the official ``openai`` client, ``response_format``
``json_schema`` unless ``rollout.judge.structured`` is off. The answer is read
strictly: text that is not that JSON object, a candidate missing or unknown, a
score outside [0, 1], or an endpoint that still fails after
``rollout.judge.retries`` make every rollout of the group a failed grade
(:class:`~tether.run._grading.GraderFault`, the judge's raw text kept), never a
reward 0. Only an explanation longer than the schema's 400 characters (from a
judge not held to the schema) is forgiven: it is cut and marked. The prompt, the
raw answer, the parsed scores and the model are kept with each rollout's attempt
(``grade_detail``).

The task the judge sees is the whole row, its grader-only fields too (a
reference answer helps a judge), as any grader gets it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tether.errors import UserError
from tether.run._grading import AnyGrader, Candidate, Grade, GraderFault, GroupGrade, load_grader
from tether.run.config import JudgeConfig, RolloutConfig

__all__ = [
    "DEFAULT_RUBRIC",
    "Judge",
    "JudgeFailed",
    "open_grader",
    "parse_scores",
    "response_schema",
]

DEFAULT_RUBRIC = """\
- A candidate that solves the task must score clearly higher than one that does not.
- Between two candidates that solve it, the more direct and correct one scores higher.
- Small differences in quality get small differences in score, large ones large.
- Partial progress towards the goal may earn partial credit."""

#: Each explanation's bound in the schema (a weak judge may never close a string); a
#: longer one read from an unconstrained judge is cut to it.
_EXPLANATION_CHARS = 400
_RETRIED = (408, 409, 429)  # the statuses the openai client retries, besides 5xx
_RAW_KEPT = 4000  # characters of a failed answer quoted in the attempt's grader error


class JudgeFailed(Exception):
    """The judge's answer is unusable (not the JSON asked for) or the endpoint failed."""


class _Score(BaseModel):
    """One candidate's verdict: the score strictly; an explanation past the schema's bound
    (a judge not held to it) is cut and marked, not refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    explanation: str
    score: float = Field(ge=0.0, le=1.0)

    @field_validator("explanation")
    @classmethod
    def _cut(cls, text: str) -> str:
        more = len(text) - _EXPLANATION_CHARS
        return text if more <= 0 else f"{text[:_EXPLANATION_CHARS]}… [{more} more characters cut]"


def _labels(n: int) -> list[str]:
    return [str(i) for i in range(1, n + 1)]


def response_schema(n: int) -> dict[str, Any]:
    """The JSON schema of the answer: ``{"1": {"explanation", "score"}, ..., "N": ...}``,
    every candidate required (so a grammar-constrained judge cannot leave one out)."""
    one = {
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "maxLength": _EXPLANATION_CHARS},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["explanation", "score"],
        "additionalProperties": False,
    }
    labels = _labels(n)
    return {
        "type": "object",
        "properties": dict.fromkeys(labels, one),
        "required": labels,
        "additionalProperties": False,
    }


def parse_scores(text: str, n: int) -> dict[str, _Score]:
    """The judge's answer for ``n`` candidates, read strictly; :class:`JudgeFailed` with
    one line saying what is wrong otherwise."""
    try:
        data = json.loads(_unfenced(text))
    except json.JSONDecodeError as e:
        raise JudgeFailed(f"the judge's answer is not JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(data, dict):
        raise JudgeFailed(f"the judge's answer is a JSON {type(data).__name__}, not an object")
    labels = _labels(n)
    missing = [k for k in labels if k not in data]
    unknown = [k for k in data if k not in labels]
    if missing or unknown:
        said = "; ".join(
            f"{what} {', '.join(keys)}"
            for what, keys in (("no score for candidate", missing), ("unknown candidate", unknown))
            if keys
        )
        raise JudgeFailed(f"the judge's answer has {said} (candidates 1..{n})")
    out: dict[str, _Score] = {}
    for k in labels:
        try:
            out[k] = _Score.model_validate(data[k])
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise JudgeFailed(
                f"candidate {k}'s score is unusable: {where or 'value'}: {first['msg']}"
            ) from None
    return out


def _unfenced(text: str) -> str:
    """``text`` without one surrounding Markdown code fence (```json ... ```)."""
    s = text.strip()
    if s.startswith("```") and s.endswith("```") and len(s) >= 6:
        s = s[3:-3]
        s = s.split("\n", 1)[1] if s.startswith(("json\n", "JSON\n")) else s
    return s.strip()


class Judge:
    """Scores a group's candidates through one judge call (see the module docstring)."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.rubric = _rubric(config)

    def _key(self) -> str:
        env = self.config.api_key_env
        if not env:
            return "none"  # the client needs one; an endpoint without auth ignores it
        key = os.environ.get(env)
        if not key:
            raise UserError(
                f"rollout.judge.api_key_env names {env}, which is not set: export {env}=... "
                "(the judge's API key), or set rollout.judge.api_key_env to the variable holding it"
            )
        return key

    async def check(self) -> None:
        """At the start of a run: the key is there and the endpoint answers (one line else)."""
        c = self.config
        client = openai.AsyncOpenAI(
            base_url=c.base_url, api_key=self._key(), timeout=min(c.timeout_s, 10.0), max_retries=0
        )
        try:
            await client.models.list()
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise UserError(
                f"rollout.judge.base_url ({c.base_url}) is unreachable ({type(e).__name__}): start "
                "the judge's server or fix the URL"
            ) from None
        except openai.AuthenticationError:
            raise UserError(
                f"the judge at {c.base_url} refused the key (401): check "
                f"{c.api_key_env or 'rollout.judge.api_key_env'}"
            ) from None
        except openai.APIStatusError:
            pass  # it answers; an endpoint may not list models
        finally:
            await client.close()

    def messages(self, task: dict[str, Any], candidates: list[Candidate]) -> list[dict[str, str]]:
        """The judge's prompt: the rules and rubric (system), the task and candidates (user)."""
        n = len(candidates)
        system = (
            f"You are a strict grader. The {n} candidates below each attempted the same task. "
            "Compare them with each other and give each a score between 0 and 1.\n\n"
            f"Grading standards:\n{self.rubric}\n\n"
            "Answer with one JSON object and nothing else: a key for every candidate id "
            f'("1" to "{n}"), each holding "explanation" (one or two sentences, first) and '
            '"score" (a number from 0 to 1), e.g. '
            '{"1": {"explanation": "...", "score": 0.8}, "2": {"explanation": "...", "score": 0.1}}'
        )
        parts = [f"<task>\n{json.dumps(task, ensure_ascii=False)}\n</task>"]
        for label, c in zip(_labels(n), candidates, strict=True):
            parts.append(f'<candidate id="{label}">\n{self._shown(c)}\n</candidate>')
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def _shown(self, c: Candidate) -> str:
        answer = "(no final answer)" if c.answer is None else c.answer
        if not (self.config.conversation and c.calls):
            return answer
        last = c.calls[-1]
        turns = [*last.request.get("messages", []), {"role": "assistant", **(last.response or {})}]
        return f"conversation: {json.dumps(turns, ensure_ascii=False)}\nfinal answer: {answer}"

    async def grade_group(
        self, task: dict[str, Any], candidates: list[Candidate]
    ) -> list[GroupGrade]:
        """One :class:`GroupGrade` per candidate, in order: their scores, or every one a
        failed grade with the judge's text (never a reward 0)."""
        messages = self.messages(task, candidates)
        detail: dict[str, Any] = {
            "judge": "judge",
            "model": self.config.model,
            "messages": messages,
        }
        raw: str | None = None
        try:
            raw = await self._ask(messages, len(candidates))
            detail["raw"] = raw
            scores = parse_scores(raw, len(candidates))
        except JudgeFailed as e:
            return [
                _failed(str(e), raw, dict(detail, candidate=k)) for k in _labels(len(candidates))
            ]
        table = {k: s.score for k, s in scores.items()}
        why = {k: s.explanation for k, s in scores.items()}
        detail.update(scores=table, explanations=why)
        return [
            GroupGrade(Grade(s.score), None, dict(detail, candidate=k)) for k, s in scores.items()
        ]

    async def _ask(self, messages: list[dict[str, str]], n: int) -> str:
        """The judge's raw answer text; :class:`JudgeFailed` when the endpoint fails."""
        c = self.config
        extra: dict[str, Any] = {}
        if c.structured:
            schema = {"name": "scores", "schema": response_schema(n), "strict": True}
            extra["response_format"] = {"type": "json_schema", "json_schema": schema}
        try:
            async with openai.AsyncOpenAI(
                base_url=c.base_url, api_key=self._key(), timeout=c.timeout_s, max_retries=c.retries
            ) as client:
                reply = await client.chat.completions.create(
                    model=c.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=c.temperature,
                    max_tokens=c.max_tokens,
                    **extra,
                )
        except openai.APIStatusError as e:
            again = e.status_code in _RETRIED or e.status_code >= 500
            after = f" after {c.retries} retries" if again else ""
            raise JudgeFailed(
                f"the judge at {c.base_url} answered HTTP {e.status_code}{after}: {e.message}"
            ) from None
        except openai.OpenAIError as e:  # connection, timeout
            raise JudgeFailed(
                f"the judge at {c.base_url} failed after {c.retries} retries: {type(e).__name__}: {e}"
            ) from None
        if not reply.choices:
            raise JudgeFailed("the judge's reply has no choices")
        return reply.choices[0].message.content or ""


def _failed(why: str, raw: str | None, detail: dict[str, Any]) -> GroupGrade:
    text = "(no answer)" if raw is None else raw[:_RAW_KEPT]
    fault = GraderFault(why, f"{why}\nthe judge's answer:\n{text}", by="judge")
    return GroupGrade(Grade(None), fault, detail)


def _rubric(c: JudgeConfig) -> str:
    if c.rubric_file:
        try:
            return Path(c.rubric_file).read_text().strip()
        except OSError as e:
            raise UserError(
                f"rollout.judge.rubric_file ({c.rubric_file}) cannot be read: {e.strerror}; "
                "fix the path (in a config file, relative to its folder)"
            ) from None
    return c.rubric.strip() or DEFAULT_RUBRIC


async def open_grader(rollout: RolloutConfig) -> AnyGrader | None:
    """What ``rollout.grader`` names: the judge (its key and endpoint checked now), a
    ``module:function`` grader, or None (the agent's own reward)."""
    if rollout.grader != "judge":
        return load_grader(rollout.grader)
    judge = Judge(rollout.judge)
    await judge.check()
    return judge
