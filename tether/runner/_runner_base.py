"""The part every runner shares: ``run()`` = closed check, concurrency limit, start hook, ``_run``.

A runner subclasses :class:`RunnerBase` and implements only its own part::

    class MyRunner(RunnerBase):
        async def _run(self, launch: Launch) -> AttemptResult:
            ...  # start the agent, wait for its end, return a status

        async def close(self) -> None:
            self._closed = True
            ...  # stop what is running; those attempts return CANCELLED

:meth:`RunnerBase.run` returns CANCELLED without starting anything once the
runner is closed (also for attempts that were waiting for a slot), holds one
of ``limit`` slots (default ``config.concurrency``) while ``_run`` runs, and
calls ``on_start(launch)`` when the owner set one (the trainer uses it to move
a rollout from ``queued`` to ``running``) just before ``_run``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.records import RolloutStatus

from ._base import AttemptResult, Launch, result_for

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["RunnerBase"]

log = logging.getLogger(__name__)


class RunnerBase:
    """A :class:`~tether.runner.Runner` with the shared ``run()``; subclasses implement ``_run``."""

    #: Called with each launch when its agent is about to start (past the concurrency limit).
    on_start: Callable[[Launch], None] | None = None

    def __init__(self, config: RunnerConfig, *, limit: int | None = None) -> None:
        self.config = config
        self._sem = asyncio.Semaphore(config.concurrency if limit is None else limit)
        self._closed = False

    async def run(self, launch: Launch) -> AttemptResult:
        """Run one attempt; see :class:`tether.runner.Runner`."""
        if self._closed:
            return result_for(launch, RolloutStatus.CANCELLED, error="runner is closed")
        async with self._sem:
            if self._closed:
                return result_for(launch, RolloutStatus.CANCELLED, error="runner is closed")
            self._notify_started(launch)
            return await self._run(launch)

    async def _run(self, launch: Launch) -> AttemptResult:
        """This runner's own part: start the agent for ``launch`` and report its end."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop everything this runner started; attempts still running return CANCELLED."""
        self._closed = True

    def _notify_started(self, launch: Launch) -> None:
        if self.on_start is None:
            return
        try:
            self.on_start(launch)
        except Exception:  # a status display must not stop the agent (its first call also counts)
            log.warning("on_start failed for rollout %s", launch.rollout_id, exc_info=True)
