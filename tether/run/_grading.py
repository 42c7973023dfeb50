"""The grader: loading it, calling it, reading what it returns, and what it raised.

A grader is ``grade(task, final_answer)`` returning the reward, or a mapping with the
``"reward"`` and ``"success": bool`` (whether the task was solved) and/or
``"turn_rewards": {seq: float}`` (intermediate rewards of the rollout's calls, stored as
the grader's and used by ``trainer.credit: turn``). :func:`record_turn_rewards` stores
them with the attempt; :func:`turn_rewards` reads back every intermediate reward of an
attempt (the agent's and the grader's), added up per call.

A grader that raises makes its rollout unusable, never the run's reward 0:
:func:`call_grader` turns the exception into a :class:`GraderFault`, its type and
message with the place in the grader's own file (``KeyError: 'answr' (grader.py:12
in grade)``) and the traceback's last frames, which the store keeps with the attempt
(``tether rollouts show ID``, the dashboard's rollout page).

A group grader (:class:`GroupGrader`: the judge of ``rollout.grader: judge``,
``_judge``) grades a whole group at once instead: ``grade_group(task, candidates)``
returns one :class:`GroupGrade` per rollout, each with what the grader saw and said
(``detail``, stored with the attempt as its ``grade_detail``). The prompt a group
shares (``detail["messages"]``) is stored once, with the group's first candidate;
the others name that attempt (``"prompt_from"``) and the store fills it back in.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from tether.errors import UserError
from tether.records import Call, Reward, RewardSource

if TYPE_CHECKING:
    from tether.gateway import OpenedRollout
    from tether.runner import AttemptResult
    from tether.store import Store

__all__ = [
    "GRADE_SHAPE",
    "AnyGrader",
    "Candidate",
    "Grade",
    "Grader",
    "GraderFault",
    "GroupGrade",
    "GroupGrader",
    "call_grader",
    "grader_fault",
    "group_verdicts",
    "is_success",
    "load_grader",
    "read_grade",
    "record_turn_rewards",
    "turn_rewards",
]

#: ``grade(task, final_answer)`` -> the reward, or ``{"reward": float, "success": bool}``
#: (``"success"`` and/or ``"turn_rewards": {seq: float}`` beside ``"reward"``).
Grader = Callable[[dict[str, Any], str | None], float | Mapping[str, Any]]
GRADE_SHAPE = (
    'a float (the reward) or {"reward": float, "success": bool}, '
    'and/or "turn_rewards": {call seq: float} beside "reward"'
)
_OPTIONAL = {"success", "turn_rewards"}


class Grade(NamedTuple):
    """What a grader returned: the raw reward (checked later), the success flag or None,
    and the intermediate rewards by call seq (empty when none)."""

    reward: Any
    success: bool | None = None
    turn_rewards: Mapping[int, Any] = MappingProxyType({})


_FRAMES = 6  # traceback frames kept (the last ones)


@dataclass(frozen=True)
class GraderFault:
    """What a grader raised: ``summary`` is one line, ``detail`` adds the traceback tail
    (for the judge: why its grade failed, and its answer). ``by`` names who failed."""

    summary: str  # "KeyError: 'answr' (grader.py:12 in grade)"
    detail: str
    by: str = "grader"  # or "judge"

    @property
    def line(self) -> str:
        """The rollout's error: ``the grader raised KeyError: ...`` / ``the judge failed: ...``."""
        return (
            f"the grader raised {self.summary}"
            if self.by == "grader"
            else (f"the {self.by} failed: {self.summary}")
        )


@dataclass(frozen=True)
class Candidate:
    """One rollout of a group as a group grader sees it: its final answer and calls."""

    answer: str | None
    calls: tuple[Call, ...] = ()


class GroupGrade(NamedTuple):
    """A group grader's verdict on one rollout: the grade, the fault that replaces it
    (None when graded), and what the grader saw and said (stored with the attempt)."""

    grade: Grade
    fault: GraderFault | None
    detail: dict[str, Any]


@runtime_checkable
class GroupGrader(Protocol):
    """Grades a group's rollouts at once (the judge): one :class:`GroupGrade` per candidate,
    in order; a failure is a fault on every one of them, never a raise."""

    async def grade_group(
        self, task: dict[str, Any], candidates: list[Candidate]
    ) -> list[GroupGrade]: ...


#: What ``rollout.grader`` loads to: a per-rollout grader, or a group grader.
AnyGrader = Grader | GroupGrader


def load_grader(spec: str) -> Grader | None:
    """Import ``"module:function"`` or ``"path/to/file.py:function"`` (relative to the
    working directory); an empty spec means the agent reports its own reward."""
    if not spec:
        return None
    module, sep, name = spec.partition(":")
    if not sep:
        raise UserError(f"rollout.grader ({spec!r}) must look like 'module:function'")
    if module.endswith(".py") or "/" in module:
        from tether.runner import load_callable

        try:
            return load_callable(spec)
        except (OSError, ImportError, AttributeError, TypeError, ValueError) as exc:
            raise UserError(f"rollout.grader ({spec!r}) cannot be loaded: {exc}") from None
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"rollout.grader ({spec!r}) cannot be imported: {exc}") from None
    return fn


def _source_file(grader: Any) -> str | None:
    for obj in (grader, type(grader).__call__):  # a function, or a callable object
        try:
            return inspect.getsourcefile(inspect.unwrap(obj))  # type: ignore[arg-type]
        except TypeError:
            continue
    return None


def grader_fault(exc: BaseException, grader: Any) -> GraderFault:
    """``exc`` as raised by ``grader``: the summary names the last frame in the grader's
    own file (the last frame at all when none is), the detail the frames from there on."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    own = _source_file(grader)
    first = next((i for i, f in enumerate(frames) if f.filename == own), 0)
    mine = [f for f in frames if f.filename == own]
    what = traceback.format_exception_only(type(exc), exc)[-1].strip()
    at = (mine or frames)[-1] if frames else None
    where = f" ({Path(at.filename).name}:{at.lineno} in {at.name})" if at else ""
    shown = frames[first:][-_FRAMES:]
    tail = "".join(traceback.format_list(shown))
    detail = f"{what}{where}\nTraceback (most recent call last):\n{tail}{what}"
    return GraderFault(f"{what}{where}", detail)


def call_grader(
    grader: Grader, task: dict[str, Any], answer: str | None
) -> tuple[Grade, GraderFault | None]:
    """``(grade, None)``, or ``(Grade(None), fault)`` when the grader raised. A malformed
    return value is a bug too but raises (:func:`read_grade`)."""
    try:
        value = grader(task, answer)
    except Exception as exc:  # a grader bug makes this rollout unusable, not the run
        return Grade(None), grader_fault(exc, grader)
    return read_grade(value), None


def read_grade(value: Any) -> Grade:
    """A grader's return value as a :class:`Grade`.

    A float is the reward (checked later: NaN, inf or a non-number make the
    rollout unusable). A mapping holds ``"reward"`` and one or both of
    ``"success"`` (a bool) and ``"turn_rewards"`` (a mapping of call seq, an int or
    its digits, to a reward; checked later like the reward); any other shape is a
    bug in the grader and raises :class:`UserError`.
    """
    if not isinstance(value, Mapping):
        return Grade(value)
    keys = set(value)
    success = value.get("success")
    turns = value.get("turn_rewards", {})
    if (
        "reward" not in keys
        or not keys - {"reward"}
        or keys - {"reward"} - _OPTIONAL
        or ("success" in keys and not isinstance(success, bool))
        or not isinstance(turns, Mapping)
        or not all(_seq(k) is not None for k in turns)
    ):
        shown = repr(dict(value))[:120]
        raise UserError(f"rollout.grader returned {shown}; it must return {GRADE_SHAPE}")
    return Grade(value["reward"], success, {_seq(k) or 0: v for k, v in turns.items()})


def _seq(key: Any) -> int | None:
    """A call seq as a grader may write it (``3``, or ``"3"`` from JSON), else None."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 0 else None
    return int(key) if isinstance(key, str) and key.isdigit() else None


def is_success(reward: float | None, flag: bool | None, threshold: float | None) -> bool:
    """Whether a graded rollout solved its task: the grader's ``flag`` when given, else
    ``reward > 0`` (``threshold`` None) or ``reward >= threshold``; never without a reward."""
    if reward is None:
        return False
    if flag is not None:
        return flag
    return reward > 0 if threshold is None else reward >= threshold


def record_turn_rewards(store: Store, opened: OpenedRollout, turns: Mapping[int, Any]) -> None:
    """Store the grader's intermediate rewards with the attempt (a seq naming no call of
    it is the grader's bug: :class:`UserError`)."""
    calls = {c.seq for c in store.calls(opened.rollout_id, attempt=opened.attempt)}
    for seq, value in sorted(turns.items()):
        if seq not in calls:
            made = f"calls 0..{max(calls)}" if calls else "no call"
            raise UserError(
                f"rollout.grader returned turn_rewards for call {seq} of rollout "
                f"{opened.rollout_id}, which made {made}; key turn_rewards by call seq"
            )
        value = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        store.record_reward(
            Reward(
                rollout_id=opened.rollout_id,
                value=float("nan") if value is None else float(value),
                source=RewardSource.GRADER,
                attempt=opened.attempt,
                call_seq=seq,
            )
        )


def turn_rewards(store: Store, opened: OpenedRollout) -> dict[int, float]:
    """The attempt's intermediate rewards by call seq, added up per call."""
    out: dict[int, float] = {}
    for r in store.rewards(opened.rollout_id):
        if r.attempt == opened.attempt and r.call_seq is not None:
            out[r.call_seq] = out.get(r.call_seq, 0.0) + r.value
    return out


async def group_verdicts(
    store: Store,
    graded: list[tuple[int, dict[str, Any], OpenedRollout, AttemptResult]],
    grader: GroupGrader,
) -> list[GroupGrade | None]:
    """The group grader's verdict on each (group, task row, attempt, result) of ``graded``
    (None where the attempt did not succeed: no candidate), one ``grade_group`` per group,
    the groups at once."""
    groups: dict[int, list[int]] = {}
    for i, (g, _, _, result) in enumerate(graded):
        if result.ok:
            groups.setdefault(g, []).append(i)
    out: list[GroupGrade | None] = [None] * len(graded)

    async def judge(members: list[int]) -> None:
        task = graded[members[0]][1]
        candidates = []
        for i in members:
            _, _, o, result = graded[i]
            calls = tuple(store.calls(o.rollout_id, attempt=o.attempt))
            candidates.append(Candidate(result.final_answer, calls))
        verdicts = await grader.grade_group(task, candidates)
        first = graded[members[0]][2]
        for k, (i, verdict) in enumerate(zip(members, verdicts, strict=True)):
            out[i] = verdict if k == 0 else _prompt_shared(verdict, verdicts[0], first)

    await asyncio.gather(*(judge(members) for members in groups.values()))
    return out


def _prompt_shared(verdict: GroupGrade, head: GroupGrade, first: OpenedRollout) -> GroupGrade:
    """``verdict`` without the prompt its group shares (``detail["messages"]``, the same as
    ``head``'s): it names where the group's first attempt keeps it instead,
    ``"prompt_from": {"rollout_id", "attempt"}``; the store fills it back in when read."""
    prompt = verdict.detail.get("messages")
    if prompt is None or prompt != head.detail.get("messages"):
        return verdict
    detail = {k: v for k, v in verdict.detail.items() if k != "messages"}
    detail["prompt_from"] = {"rollout_id": first.rollout_id, "attempt": first.attempt}
    return verdict._replace(detail=detail)
