"""The collection service: :class:`Collector` opens groups of rollouts, runs their
attempts through a runner, grades them and ends them, for a sync step's or an eval's
groups (:meth:`Collector.collect`) and for async mode's one group at a time
(:meth:`Collector.group`, ``_async``). Attempts are minted and ended through the
gateway (their tokens); calls and rewards are read from the store.

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
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from tether.gateway import Gateway, OpenedRollout
from tether.records import AttemptEnd, Phase, Place, RolloutStatus, Task
from tether.run._finish import Ended, RolloutGrader, RolloutOutcome, end_quietly, finish_outcome
from tether.run._grading import AnyGrader, GroupGrader, group_verdicts
from tether.runner import AttemptResult, Launch, Runner
from tether.store import Store

__all__ = [
    "Collected",
    "Collector",
    "RetryPolicy",
    "RolloutOutcome",
    "Started",
    "collect_groups",
    "gather_ended",
    "group_tag",
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


class Started(NamedTuple):
    """A rollout opened in its group, before its attempts run."""

    group: int
    task: Task
    rollout: OpenedRollout


class Collector:
    """Collects a run's rollouts: opens them (each group's ``n`` queued at their
    :class:`~tether.records.Place`), runs their attempts with ``retry`` (by default
    :meth:`RetryPolicy.of` the runner), grades them with ``grader`` and ends them.
    Built once per run (``_loop``); :meth:`with_runner` for an eval's counting runner."""

    def __init__(
        self,
        gateway: Gateway,
        store: Store,
        runner: Runner,
        *,
        run_id: str,
        grader: AnyGrader | None,
        success_threshold: float | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.gateway, self.store, self.runner = gateway, store, runner
        self.run_id, self.grader, self.success_threshold = run_id, grader, success_threshold
        self.retry = retry or RetryPolicy.of(runner)

    def with_runner(self, runner: Runner) -> Collector:
        """This collector with its retry policy, running attempts on ``runner``."""
        return Collector(
            self.gateway, self.store, runner, run_id=self.run_id, grader=self.grader,
            success_threshold=self.success_threshold, retry=self.retry,
        )  # fmt: skip

    # -- sync steps and evals, async groups -----------------------------------------

    async def collect(
        self,
        tasks: list[Task],
        n: int,
        at: Place,
        *,
        sampling: dict[str, float] | None = None,
        first_group: int = 0,
    ) -> Collected:
        """Run ``n`` rollouts of every task (one group per task) at ``at`` (phase, step,
        greedy), then grade them all; groups are numbered from ``first_group`` (a later
        collection of the same phase and step continues the numbering)."""
        t0 = time.perf_counter()
        opened = self.open_groups(list(enumerate(tasks, start=first_group)), n, at, sampling)
        ended = await self._gathered(opened, [self.attempts(s, sampling) for s in opened])
        outcomes = await self.finish(ended)
        tokens = sum(len(c.completion_ids) for o in outcomes for c in o.calls)
        return Collected(outcomes, time.perf_counter() - t0, tokens)

    async def group(self, index: int, task: Task, n: int, at: Place) -> list[RolloutOutcome]:
        """One group of ``n`` rollouts of ``task`` (async mode): each graded as soon as its
        attempts ended, or with a group grader all at once after the last one; the first
        rollout to raise cancels its siblings, which end before the group does."""
        opened = self.open_groups([(index, task)], n, at)
        if isinstance(self.grader, GroupGrader):  # the judge: the whole group at once
            return await self.finish(await self._gathered(opened, map(self.attempts, opened)))
        return await self._gathered(opened, map(self._graded, opened))

    async def _gathered(
        self, opened: list[Started], aws: Iterable[Coroutine[Any, Any, T]]
    ) -> list[T]:
        """:func:`gather_ended` of the opened rollouts' work. Should it be cancelled before
        some of it began (those rollouts' own handler never ran), they end ``cancelled``
        here; the others already ended and stay as they ended."""
        try:
            return await gather_ended(list(aws))
        except asyncio.CancelledError:
            for s in opened:
                end_quietly(self.gateway, s.rollout, RolloutStatus.CANCELLED, "cancelled")
            raise

    async def _graded(self, started: Started) -> RolloutOutcome:
        assert not isinstance(self.grader, GroupGrader)
        return self._finish(await self.attempts(started), self.grader)

    def group_id(self, at: Place, group: int) -> str:
        """The id of group ``group`` at ``at``: ``{run}-{tag}-g{group}`` (:func:`group_tag`)."""
        return f"{self.run_id}-{group_tag(at.phase, at.step or 0, at.greedy)}-g{group}"

    # -- opening, attempts, finishing -----------------------------------------------

    def open_groups(
        self,
        groups: Sequence[tuple[int, Task]],
        n: int,
        at: Place,
        sampling: dict[str, float] | None = None,
    ) -> list[Started]:
        """``n`` queued rollouts (running once the runner starts their agent) of each
        (group number, task) at ``at``; those opened are cancelled again when one cannot be."""
        opened: list[Started] = []
        try:
            for g, task in groups:
                gid = self.group_id(at, g)
                for i in range(n):
                    o = self.gateway.open_rollout(
                        task.for_agent,
                        rollout_id=f"{gid}-{i}",
                        run_id=self.run_id,
                        group_id=gid,
                        task_id=task.id,
                        sampling=sampling,
                        queued=True,
                        place=dataclasses.replace(at, group=g, index=i),
                    )
                    opened.append(Started(g, task, o))
        except BaseException:
            for s in opened:
                end_quietly(
                    self.gateway, s.rollout, RolloutStatus.CANCELLED,
                    "cancelled: opening the rollouts failed",
                )  # fmt: skip
            raise
        return opened

    async def attempts(self, started: Started, sampling: dict[str, float] | None = None) -> Ended:
        """Run the rollout's attempts until one is final; that attempt and its result.

        Cancelled (the run is stopping): the agent is stopped by the runner, the current
        attempt ends ``cancelled`` in the store, and no further attempt starts. A runner
        that raises ends the attempt ``failed`` and the error goes on.
        """
        o = started.rollout
        while True:
            try:
                result = await self.runner.run(self._launch(o, started.task))
            except asyncio.CancelledError:
                end_quietly(self.gateway, o, RolloutStatus.CANCELLED, "cancelled")
                raise
            except Exception as exc:  # the runner itself broke: the attempt ends failed
                end_quietly(self.gateway, o, RolloutStatus.FAILED, f"the runner raised: {exc!r}")
                raise
            if (
                not result.ok
                and result.infra is None
                and self.gateway.lost_engine(o.rollout_id, o.attempt)
            ):
                result = dataclasses.replace(result, infra="engine_lost")  # another replica
            if not self.retry.retries(result):
                return Ended(started.group, started.task, o, result)
            self._end_retried(o, result)
            o = self.gateway.retry_rollout(o.rollout_id, sampling=sampling, queued=True)

    def _launch(self, o: OpenedRollout, task: Task) -> Launch:
        return Launch(
            rollout_id=o.rollout_id,
            attempt=o.attempt,
            base_url=o.base_url,
            token=o.token,
            task=task.for_agent,  # never the grader-only fields
            reward_url=o.reward_url if self.gateway.config.allow_agent_rewards else None,
            run_id=self.run_id,
        )

    def _end_retried(self, o: OpenedRollout, result: AttemptResult) -> None:
        """End an attempt that another follows (``failed``, or ``timeout``), saying why."""
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
        end = AttemptEnd(
            o.rollout_id,
            o.attempt,
            status,
            error=f"{why}: {result.error}; retried",
            exit_code=result.exit_code,
            output_tail=result.output_tail,
        )
        self.gateway.finish_rollout(end)

    async def finish(self, ended: list[Ended]) -> list[RolloutOutcome]:
        """Grade and end every final attempt (``_finish``), after a group grader judged
        each group (one call per group, the groups at once). Should the judging itself
        raise or be cancelled, every rollout still ends first."""
        grader = self.grader
        if not isinstance(grader, GroupGrader):
            return self._finish_all(ended, [grader] * len(ended))
        try:
            judged = [(e.group, e.task.data, e.rollout, e.result) for e in ended]
            verdicts = await group_verdicts(self.store, judged, grader)
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            status = RolloutStatus.CANCELLED if cancelled else RolloutStatus.FAILED
            why = "cancelled" if cancelled else f"grading failed: {exc}"
            for e in ended:
                end_quietly(self.gateway, e.rollout, status, why)
            raise
        return self._finish_all(ended, verdicts)

    def _finish_all(
        self, ended: list[Ended], graders: Sequence[RolloutGrader]
    ) -> list[RolloutOutcome]:
        """Each attempt finished with its grader; every rollout ends even when grading one
        raises (that one ends ``failed``), then the first error is raised."""
        outcomes: list[RolloutOutcome] = []
        first: Exception | None = None
        for e, grader in zip(ended, graders, strict=True):
            try:
                outcomes.append(self._finish(e, grader))
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
        return outcomes

    def _finish(self, ended: Ended, grader: RolloutGrader) -> RolloutOutcome:
        return finish_outcome(self.gateway, self.store, ended, grader, self.success_threshold)


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
    """Run ``n`` rollouts of every task (one group per task), grade them, return their calls:
    :meth:`Collector.collect` over the gateway's store, for a caller without a run.

    Each rollout is stored with its :class:`~tether.records.Place`: ``phase`` and ``step``
    (a sync update's, or the step an eval runs at), ``greedy`` (an eval's greedy pass), its
    group's number and its own in the group. ``retry`` defaults to :meth:`RetryPolicy.of`
    the runner.
    """
    collector = Collector(
        gw, gw.store, runner, run_id=run_id, grader=grader,
        success_threshold=success_threshold, retry=retry,
    )  # fmt: skip
    at = Place(phase, step, greedy=greedy)
    return await collector.collect(tasks, n, at, sampling=sampling, first_group=first_group)


def group_tag(phase: Phase, step: int, greedy: bool = False) -> str:
    """The middle of the ids a collection mints (``{run}-{tag}-g{k}``, rollouts
    ``{group}-{i}``): ``s{step}`` for an update, ``eval{step}-s`` / ``eval{step}-g`` for an
    eval's sampled / greedy pass, ``a`` for async mode's groups (numbered across the run).
    Names only: what a rollout is for is its stored place, and its name seeds its sampling
    (the gateway's ``derived_seed``), so it never changes."""
    if phase is Phase.EVAL:
        return f"eval{step}-{'g' if greedy else 's'}"
    return "a" if phase is Phase.ASYNC else f"s{step}"


async def gather_ended(aws: list[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather`` of rollouts' attempts, where the first to raise cancels the others
    (their rollouts end ``cancelled``, see :meth:`Collector.attempts`) and is raised once
    they ended; cancelling the gather cancels them all the same way."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
