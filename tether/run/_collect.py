"""Running groups of rollouts through the gateway and a runner, then grading them.

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

Grading, success and what a group grader (the judge) does: ``_finish``.

Failures: whatever goes wrong, every rollout a collection opened ends
``succeeded``, ``failed`` or ``cancelled`` before the error reaches the run.
A rollout whose runner raises cancels its siblings (:func:`gather_ended`); a
grader bug (a malformed result) ends its rollout ``failed``, the others are
still graded, and the first error is raised after all of them ended; a
failure while opening the rollouts cancels the ones already opened. A grader
that raises ends only that rollout unusable, its exception kept with the
attempt (``_grading``); ``_failures`` says it once per collection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from tether.gateway import Gateway, OpenedRollout
from tether.records import AttemptEnd, Phase, Place, RolloutStatus, Task
from tether.run._finish import (
    RolloutOutcome,
    end_quietly,
    finish_all,
    finish_groups,
    finish_outcome,
)
from tether.run._grading import AnyGrader, Grader, is_success, load_grader, read_grade
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
    "group_tag",
    "is_success",
    "load_grader",
    "read_grade",
    "run_attempts",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


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
        error = f"{why}: {result.error}; retried"
        gw.finish_rollout(
            AttemptEnd(
                o.rollout_id,
                o.attempt,
                status,
                error=error,
                exit_code=result.exit_code,
                output_tail=result.output_tail,
            )
        )
        o = gw.retry_rollout(o.rollout_id, sampling=sampling, queued=True)


async def collect_groups(
    gw: Gateway,
    runner: Runner,
    tasks: list[Task],
    n: int,
    *,
    grader: AnyGrader | None,
    run_id: str,
    phase: Phase,
    step: int,
    greedy: bool = False,
    sampling: dict[str, float] | None = None,
    retry: RetryPolicy | None = None,
    success_threshold: float | None = None,
    first_group: int = 0,
) -> Collected:
    """Run ``n`` rollouts of every task (one group per task), grade them, return their calls.

    Each rollout is stored with its :class:`~tether.records.Place`: ``phase`` and ``step``
    (a sync update's, or the step an eval runs at), ``greedy`` (an eval's greedy pass), its
    group's number and its own in the group. ``retry`` defaults to :meth:`RetryPolicy.of`
    the runner. Groups are numbered from ``first_group`` (a later collection of the same
    phase and step continues the numbering).
    """
    t0 = time.perf_counter()
    policy = retry or RetryPolicy.of(runner)
    opened: list[tuple[int, Task, OpenedRollout]] = []
    try:
        tag = group_tag(phase, step, greedy)
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
                    place=Place(phase, step, g, i, greedy),
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


def group_tag(phase: Phase, step: int, greedy: bool = False) -> str:
    """The middle of the ids a collection mints (``{run}-{tag}-g{k}``, rollouts
    ``{group}-{i}``): ``s{step}`` for an update, ``eval{step}-s`` / ``eval{step}-g`` for an
    eval's sampled / greedy pass. Names only: what a rollout is for is its stored place, and
    its name seeds its sampling (the gateway's ``derived_seed``), so it never changes."""
    if phase is Phase.EVAL:
        return f"eval{step}-{'g' if greedy else 's'}"
    return f"s{step}"


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


def cancel_opened(gw: Gateway, opened: list[OpenedRollout], why: str) -> None:
    """End rollouts that were opened but will not run as ``cancelled`` (``why`` as the error)."""
    for o in opened:
        end_quietly(gw, o, RolloutStatus.CANCELLED, f"cancelled: {why}")
