"""Ending a rollout's final attempt: grading it, storing its end, reading it back.

Success: a grader returns the reward as a float, or ``{"reward": float,
"success": bool}`` to say itself whether the task was solved (a coding task:
the failing tests now pass, not merely a partial reward). Beside the reward it
may return ``"turn_rewards": {seq: float}``, intermediate rewards of the
rollout's calls: they are stored as the grader's (a seq naming no call of the
attempt is a grader bug), and with the agent's own intermediate rewards they
are the outcome's ``turn_rewards`` (for ``trainer.credit: turn``). Without that
flag a usable reward counts as a success when it is above 0, or at least
``rollout.success_threshold`` when that is set (:func:`is_success`).

A grader bug (a malformed result) ends its rollout ``failed``; the collector
(``_collect``) still ends the others, then raises the first error. A grader that
raises ends only that rollout unusable, its exception kept with the attempt
(``_grading``).

A group grader (``rollout.grader: judge``) grades each group once all its
rollouts' attempts ended (``Collector.finish``): the rollouts whose attempt
succeeded are its candidates; its verdict on each is then stored exactly as a
grader's return value would be, with what it saw and said (``grade_detail``).
A per-rollout grader is called as before, one rollout at a time.

The gateway ends an attempt (its token stops working); the attempt's calls and
rewards are read from, and the grader's intermediate rewards written to, the store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tether.gateway import Gateway, OpenedRollout
from tether.records import AttemptEnd, Call, RewardSource, RolloutStatus, Task, read_reward
from tether.run._grading import (
    Grade,
    Grader,
    GraderFault,
    GroupGrade,
    call_grader,
    is_success,
    record_turn_rewards,
    turn_rewards,
)
from tether.runner import AttemptResult
from tether.store import Store

__all__ = ["Ended", "RolloutGrader", "RolloutOutcome", "end_quietly", "finish_outcome"]

log = logging.getLogger(__name__)


@dataclass
class RolloutOutcome:
    rollout_id: str
    group: int
    status: RolloutStatus
    reward: float | None  # None when missing or unusable (NaN/inf/not a number)
    calls: list[Call] = field(default_factory=list)
    final_answer: str | None = None
    attempt: int = 1  # the attempt whose calls and reward these are (the last one)
    success: bool = False  # usable and solved (the grader's flag, or the threshold)
    error: str | None = None  # why the attempt failed or is unusable
    output_tail: str = ""  # what the agent printed last (see AttemptResult.output_tail)
    #: What the grader raised, on one line ("KeyError: 'answr' (grader.py:12 in grade)").
    grader_error: str | None = None
    #: Intermediate rewards of the attempt (the agent's and the grader's) by call seq,
    #: several for one call added up; NaN/inf where one was not a finite number.
    turn_rewards: dict[int, float] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.status is RolloutStatus.SUCCEEDED and self.reward is not None


#: How one rollout is graded: by a per-rollout grader, by a group grader's verdict on it,
#: or (None) by the agent's own reward.
RolloutGrader = Grader | GroupGrade | None


class Ended(NamedTuple):
    """A rollout's final attempt and its result, with its group's number and task."""

    group: int
    task: Task
    rollout: OpenedRollout
    result: AttemptResult


def _reward(
    result: AttemptResult, task: dict[str, Any], grader: RolloutGrader, store: Store
) -> tuple[Grade, RewardSource, GraderFault | None]:
    """(what the reward is, its source, what the grader raised); ``task`` is the whole
    row, its grader-only fields too."""
    if isinstance(grader, GroupGrade):
        return grader.grade, RewardSource.GRADER, grader.fault
    if grader is not None:
        grade, fault = call_grader(grader, task, result.final_answer)
        if fault is not None:  # said once per collection by _failures, kept with the attempt
            log.debug("the grader raised on rollout %s: %s", result.rollout_id, fault.detail)
        return grade, RewardSource.GRADER, fault
    if result.agent_value is not None:
        return Grade(result.agent_value), RewardSource.AGENT, None
    finals = [
        r
        for r in store.rewards(result.rollout_id)
        if r.call_seq is None and r.attempt == result.attempt
    ]
    return Grade(finals[-1].value if finals else None), RewardSource.AGENT, None


def finish_outcome(
    gw: Gateway,
    store: Store,
    ended: Ended,
    grader: RolloutGrader,
    success_threshold: float | None = None,
) -> RolloutOutcome:
    """Grade one final attempt, end its rollout (with the attempt's output tail and
    success), and read back its calls."""
    _, task, opened, result = ended
    reward: float | None = None
    flag: bool | None = None
    fault: GraderFault | None = None
    source = RewardSource.GRADER
    if result.ok:
        try:
            grade, source, fault = _reward(result, task.data, grader, store)
            raw, flag = grade.reward, grade.success
            record_turn_rewards(store, opened, grade.turn_rewards)
        except Exception as exc:  # a grader bug (UserError) or a store fault: end it, then raise
            end_quietly(
                gw, opened, RolloutStatus.FAILED, f"grading failed: {exc}",
                exit_code=result.exit_code, output_tail=result.output_tail,
            )  # fmt: skip
            raise
        reward, _ = read_reward(raw)
    error = result.error
    if fault is not None:
        error = fault.line
    elif result.ok and reward is None:
        error = "no usable reward (missing, NaN, inf or not a number)"
    success = result.ok and is_success(reward, flag, success_threshold)
    end = AttemptEnd(
        opened.rollout_id,
        opened.attempt,
        result.status,
        error=error,
        exit_code=result.exit_code,
        output_tail=result.output_tail,
        success=success if result.ok else None,
        grader_error=fault.detail if fault else None,
        grade_detail=grader.detail if isinstance(grader, GroupGrade) and result.ok else None,
    )
    rollout = gw.finish_rollout(end, reward=reward, source=source, final_answer=result.final_answer)
    calls = store.calls(opened.rollout_id, attempt=opened.attempt)
    rewards_per_call = turn_rewards(store, opened)
    return RolloutOutcome(
        opened.rollout_id,
        ended.group,
        rollout.status,
        reward if rollout.usable else None,
        calls,
        result.final_answer,
        attempt=opened.attempt,
        success=success and rollout.usable,
        error=error,
        output_tail=result.output_tail,
        grader_error=fault.summary if fault else None,
        turn_rewards=rewards_per_call,
    )


def end_quietly(
    gw: Gateway,
    opened: OpenedRollout,
    status: RolloutStatus,
    error: str,
    *,
    exit_code: int | None = None,
    output_tail: str = "",
) -> None:
    """End ``opened``'s attempt with ``status`` and ``error`` on the way out of a failure;
    a rollout that already ended stays as it ended, and a store fault here must not hide
    the failure being handled."""
    end = AttemptEnd(
        opened.rollout_id,
        opened.attempt,
        status,
        error=error,
        exit_code=exit_code,
        output_tail=output_tail,
    )
    try:
        gw.finish_rollout(end)
    except Exception as exc:
        log.debug("rollout %s not ended as %s: %s", opened.rollout_id, status.value, exc)
