"""Running groups of rollouts through the gateway and a runner, and grading them.

Attempts: a rollout's attempt that ends by an infrastructure fault
(``AttemptResult.infra``: a foreign kill, a lost worker or node, an evicted
pod, an unreachable gateway) is closed as ``failed`` and the rollout is run
again as a new attempt with a new token (:meth:`Gateway.retry_rollout`), up
to the runner config's ``max_attempts``; the agent's own failures and
timeouts are retried only with ``retry_agent_failures``. Whatever happens,
the trainer sees exactly one attempt per rollout: the last one, its calls
and its reward; writes still arriving from an older attempt are refused.
Every attempt's end (status, error, exit code, output tail) is kept in the
store, retried ones too.

Success: a grader returns the reward as a float, or ``{"reward": float,
"success": bool}`` to say itself whether the task was solved (a coding task:
the failing tests now pass, not merely a partial reward). Beside the reward it
may return ``"turn_rewards": {seq: float}``, intermediate rewards of the
rollout's calls: they are stored as the grader's (a seq naming no call of the
attempt is a grader bug), and with the agent's own intermediate rewards they
are the outcome's ``turn_rewards`` (for ``trainer.credit: turn``). Without that
flag a usable reward counts as a success when it is above 0, or at least
``rollout.success_threshold`` when that is set (:func:`is_success`).

Failures: whatever goes wrong, every rollout a collection opened ends
``succeeded``, ``failed`` or ``cancelled`` before the error reaches the run.
A rollout whose runner raises cancels its siblings (:func:`gather_ended`); a
grader bug (a malformed result) ends its rollout ``failed``, the others are
still graded, and the first error is raised after all of them ended; a
failure while opening the rollouts cancels the ones already opened. A grader
that raises ends only that rollout unusable, its exception kept with the
attempt (``_grading``); ``_failures`` says it once per collection.

A group grader (``rollout.grader: judge``) grades each group once all its
rollouts' attempts ended (:func:`finish_groups`): the rollouts whose attempt
succeeded are its candidates; its verdict on each is then stored exactly as a
grader's return value would be, with what it saw and said (``grade_detail``).
A per-rollout grader is called as before, one rollout at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tether.gateway import Gateway, OpenedRollout
from tether.records import Call, RewardSource, RolloutStatus, Task
from tether.run._grading import (
    AnyGrader,
    Grade,
    Grader,
    GraderFault,
    GroupGrade,
    GroupGrader,
    call_grader,
    clean_reward,
    group_verdicts,
    is_success,
    load_grader,
    read_grade,
    record_turn_rewards,
    turn_rewards,
)
from tether.runner import AttemptResult, Launch, Runner

__all__ = [
    "Collected",
    "Grader",
    "RetryPolicy",
    "RolloutOutcome",
    "cancel_opened",
    "collect_groups",
    "end_quietly",
    "finish_all",
    "finish_groups",
    "finish_outcome",
    "gather_ended",
    "is_success",
    "load_grader",
    "read_grade",
    "run_attempts",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


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


@dataclass
class Collected:
    outcomes: list[RolloutOutcome]
    wall_s: float
    completion_tokens: int

    def groups(self) -> list[list[RolloutOutcome]]:
        by: dict[int, list[RolloutOutcome]] = {}
        for o in self.outcomes:
            by.setdefault(o.group, []).append(o)
        return [by[k] for k in sorted(by)]


#: How one rollout is graded: by a per-rollout grader, by a group grader's verdict on it,
#: or (None) by the agent's own reward.
RolloutGrader = Grader | GroupGrade | None


def _reward(
    result: AttemptResult, task: dict[str, Any], grader: RolloutGrader, gw: Gateway
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
        for r in gw.store.rewards(result.rollout_id)
        if r.call_seq is None and r.attempt == result.attempt
    ]
    return Grade(finals[-1].value if finals else None), RewardSource.AGENT, None


@dataclass(frozen=True)
class RetryPolicy:
    """When a finished attempt is followed by another (see the module docstring)."""

    max_attempts: int = 1
    retry_agent_failures: bool = False

    @classmethod
    def of(cls, runner: Runner) -> RetryPolicy:
        """The policy in the runner's config (``max_attempts``, ``retry_agent_failures``)."""
        cfg = getattr(runner, "config", None)
        return cls(
            int(getattr(cfg, "max_attempts", 1)),
            bool(getattr(cfg, "retry_agent_failures", False)),
        )

    def retries(self, result: AttemptResult) -> bool:
        if result.attempt >= self.max_attempts or result.status is RolloutStatus.CANCELLED:
            return False
        if result.infra is not None:
            return True
        return self.retry_agent_failures and not result.ok


def _launch(gw: Gateway, o: OpenedRollout, task: Task, run_id: str | None) -> Launch:
    return Launch(
        rollout_id=o.rollout_id,
        attempt=o.attempt,
        base_url=o.base_url,
        token=o.token,
        task=task.for_agent,  # never the grader-only fields
        reward_url=o.reward_url if gw.config.allow_agent_rewards else None,
        run_id=run_id,
    )


async def run_attempts(
    gw: Gateway,
    runner: Runner,
    o: OpenedRollout,
    task: Task,
    policy: RetryPolicy,
    sampling: dict[str, float] | None = None,
    run_id: str | None = None,
) -> tuple[OpenedRollout, AttemptResult]:
    """Run the rollout's attempts until one is final; return that attempt and its result.

    Cancelled (the run is stopping): the agent is stopped by the runner, the current
    attempt ends ``cancelled`` in the store, and no further attempt starts. A runner that
    raises ends the attempt ``failed`` and the error goes on.
    """
    while True:
        try:
            result = await runner.run(_launch(gw, o, task, run_id))
        except asyncio.CancelledError:
            end_quietly(gw, o, RolloutStatus.CANCELLED, "cancelled")
            raise
        except Exception as exc:  # the runner itself broke: the attempt ends failed, the run stops
            end_quietly(gw, o, RolloutStatus.FAILED, f"the runner raised: {exc!r}")
            raise
        if not result.ok and result.infra is None and gw.lost_engine(o.rollout_id, o.attempt):
            result = dataclasses.replace(result, infra="engine_lost")  # retried on another replica
        if not policy.retries(result):
            return o, result
        why = f"infrastructure fault ({result.infra})" if result.infra else "agent failure"
        log.warning(
            "rollout %s attempt %d ended by %s: %s; retrying as attempt %d",
            o.rollout_id,
            o.attempt,
            why,
            result.error,
            o.attempt + 1,
        )
        status = result.status if result.status is RolloutStatus.TIMEOUT else RolloutStatus.FAILED
        gw.finish_rollout(
            o.rollout_id,
            status,
            attempt=o.attempt,
            error=f"{why}: {result.error}; retried",
            exit_code=result.exit_code,
            output_tail=result.output_tail,
        )
        o = gw.retry_rollout(o.rollout_id, sampling=sampling, queued=True)


def finish_outcome(
    gw: Gateway,
    opened: OpenedRollout,
    task: Task,
    result: AttemptResult,
    grader: RolloutGrader,
    group: int,
    success_threshold: float | None = None,
) -> RolloutOutcome:
    """Grade one attempt, end its rollout in the store (with the attempt's output tail
    and success), and read back its calls."""
    reward: float | None = None
    flag: bool | None = None
    fault: GraderFault | None = None
    source = RewardSource.GRADER
    if result.ok:
        try:
            grade, source, fault = _reward(result, task.data, grader, gw)
            raw, flag = grade.reward, grade.success
            record_turn_rewards(gw, opened, grade.turn_rewards)
        except Exception as exc:  # a grader bug (UserError) or a store fault: end it, then raise
            end_quietly(
                gw, opened, RolloutStatus.FAILED, f"grading failed: {exc}",
                exit_code=result.exit_code, output_tail=result.output_tail,
            )  # fmt: skip
            raise
        reward = clean_reward(raw)
    error = result.error
    if fault is not None:
        error = fault.line
    elif result.ok and reward is None:
        error = "no usable reward (missing, NaN, inf or not a number)"
    success = result.ok and is_success(reward, flag, success_threshold)
    rollout = gw.finish_rollout(
        opened.rollout_id,
        result.status,
        attempt=opened.attempt,
        reward=reward,
        source=source,
        final_answer=result.final_answer,
        error=error,
        exit_code=result.exit_code,
        output_tail=result.output_tail,
        success=success if result.ok else None,
        grader_error=fault.detail if fault else None,
        grade_detail=grader.detail if isinstance(grader, GroupGrade) and result.ok else None,
    )
    calls = gw.store.calls(opened.rollout_id, attempt=opened.attempt)
    rewards_per_call = turn_rewards(gw, opened)
    return RolloutOutcome(
        opened.rollout_id,
        group,
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


async def collect_groups(
    gw: Gateway,
    runner: Runner,
    tasks: list[Task],
    n: int,
    *,
    grader: AnyGrader | None,
    run_id: str,
    tag: str,
    sampling: dict[str, float] | None = None,
    retry: RetryPolicy | None = None,
    success_threshold: float | None = None,
    first_group: int = 0,
) -> Collected:
    """Run ``n`` rollouts of every task (one group per task), grade them, return their calls.

    ``retry`` defaults to :meth:`RetryPolicy.of` the runner. Groups are numbered from
    ``first_group`` (a later collection of the same ``tag`` continues the numbering).
    """
    t0 = time.perf_counter()
    policy = retry or RetryPolicy.of(runner)
    opened: list[tuple[int, Task, OpenedRollout]] = []
    try:
        for g, task in enumerate(tasks, start=first_group):
            for i in range(n):
                o = gw.open_rollout(
                    task.for_agent,
                    rollout_id=f"{run_id}-{tag}-g{g}-{i}",
                    run_id=run_id,
                    group_id=f"{run_id}-{tag}-g{g}",
                    task_id=task.id,
                    sampling=sampling,
                    queued=True,  # running once the runner starts its agent
                )
                opened.append((g, task, o))
    except BaseException:
        cancel_opened(gw, [o for _, _, o in opened], "opening the batch's rollouts failed")
        raise
    finals = await gather_ended(
        [run_attempts(gw, runner, o, task, policy, sampling, run_id) for _, task, o in opened]
    )
    graded = [(g, task, o, r) for (g, task, _), (o, r) in zip(opened, finals, strict=True)]
    outcomes = await finish_groups(gw, graded, grader, success_threshold)
    tokens = sum(len(c.completion_ids) for o in outcomes for c in o.calls)
    return Collected(outcomes, time.perf_counter() - t0, tokens)


async def gather_ended(aws: list[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather`` of rollouts' attempts, where the first to raise cancels the others
    (their rollouts end ``cancelled``, see :func:`run_attempts`) and is raised once they ended;
    cancelling the gather cancels them all the same way."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


Ended = tuple[int, Task, OpenedRollout, AttemptResult]  # (group, task, attempt, its result)


async def finish_groups(
    gw: Gateway, graded: list[Ended], grader: AnyGrader | None, success_threshold: float | None
) -> list[RolloutOutcome]:
    """:func:`finish_all`, after a group grader judged each group (one call per group, the
    groups at once); a per-rollout grader goes straight to :func:`finish_all`. Should the
    judging itself raise or be cancelled, every rollout still ends first."""
    if not isinstance(grader, GroupGrader):
        return finish_all(gw, graded, [grader] * len(graded), success_threshold)
    try:
        verdicts = await group_verdicts(gw, [(g, t.data, o, r) for g, t, o, r in graded], grader)
    except BaseException as exc:
        cancelled = isinstance(exc, asyncio.CancelledError)
        status = RolloutStatus.CANCELLED if cancelled else RolloutStatus.FAILED
        for _, _, o, _ in graded:
            end_quietly(gw, o, status, "cancelled" if cancelled else f"grading failed: {exc}")
        raise
    return finish_all(gw, graded, verdicts, success_threshold)


def finish_all(
    gw: Gateway,
    graded: list[Ended],
    graders: Sequence[RolloutGrader],
    success_threshold: float | None,
) -> list[RolloutOutcome]:
    """:func:`finish_outcome` of each (group, task, attempt, result) with its grader; every
    rollout ends even when grading one raises (that one ends ``failed``), then the first
    error is raised."""
    outcomes: list[RolloutOutcome] = []
    first: Exception | None = None
    for (g, task, o, result), grader in zip(graded, graders, strict=True):
        try:
            outcomes.append(finish_outcome(gw, o, task, result, grader, g, success_threshold))
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first
    return outcomes


def cancel_opened(gw: Gateway, opened: list[OpenedRollout], why: str) -> None:
    """End rollouts that were opened but will not run as ``cancelled`` (``why`` as the error)."""
    for o in opened:
        end_quietly(gw, o, RolloutStatus.CANCELLED, f"cancelled: {why}")


def end_quietly(
    gw: Gateway,
    opened: OpenedRollout,
    status: RolloutStatus,
    error: str,
    *,
    current: bool = False,
    **attempt_end: Any,
) -> None:
    """End ``opened``'s attempt (``current``: whatever attempt the rollout is at) with
    ``status`` and ``error`` on the way out of a failure; a rollout that already ended
    stays as it ended, and a store fault here must not hide the failure being handled."""
    try:
        attempt = None if current else opened.attempt
        gw.finish_rollout(opened.rollout_id, status, attempt=attempt, error=error, **attempt_end)
    except Exception as exc:
        log.debug("rollout %s not ended as %s: %s", opened.rollout_id, status.value, exc)
