"""Stop the run when its engine is gone, on one line that says so.

Whether the engine is gone is the engine's decision, made in one place per engine
(``Engine.outage``): every remote server down for its grace period (the servers are
health-checked meanwhile, and calls wait for one to come back), or the embedded
engine's worker thread dead. The run only asks. While it trains or evaluates,
:func:`watched` asks every :data:`POLL_S` seconds; once the engine is lost it cancels
the work the way Ctrl-C does (the rollouts in flight end ``cancelled``, the parts are
torn down in reverse order) and raises :class:`~tether.engine.EngineLost`: what went
away and why, where the run was, what to do::

    the vLLM server at http://h:8000 went away (cannot reach it: connection refused)
    at update 3; restart it

No eval runs after it, and no before → after summary over rollouts that failed for it;
the CLI adds how to resume. When the work fails while the engine is down (a weight push
that found no server, every rollout of the run's first collection failed), the
failure is the engine's: the watcher waits until the engine is lost or back (at most
its grace period) and raises the engine's line rather than the consequence.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tether.engine import Engine, EngineLost, Outage

__all__ = ["POLL_S", "watched"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two questions to the engine.
POLL_S = 1.0


async def watched(engine: Engine, work: Awaitable[T], where: Callable[[], str]) -> T:
    """Await ``work`` in this task; :class:`EngineLost` (``where()`` saying where the run
    was: "at update 3") once ``engine`` is lost, the work cancelled first."""
    main = asyncio.current_task()
    assert main is not None, "watched() runs in a task"
    lost: list[Outage] = []
    watcher = asyncio.create_task(_watch(engine, main, lost), name="tether-engine-watch")
    try:
        return await work
    except asyncio.CancelledError:
        if not lost:  # Ctrl-C, or the caller's cancel
            raise
        if sys.version_info >= (3, 11):
            main.uncancel()  # this cancel was ours: the teardown's awaits run normally
        raise _lost(lost[0], where()) from None
    except Exception as exc:
        outage = await _settled(engine)
        if outage is None:
            raise
        raise _lost(outage, where()) from exc
    finally:
        watcher.cancel()


async def _watch(engine: Engine, main: asyncio.Task[object], lost: list[Outage]) -> None:
    while True:
        await asyncio.sleep(POLL_S)
        outage = await engine.outage()
        if outage is not None and outage.lost:
            log.warning("stopping the run: %s", outage.why)
            lost.append(outage)
            main.cancel()
            return


async def _settled(engine: Engine) -> Outage | None:
    """None when the engine can serve (or came back); its outage once it is lost."""
    while (outage := await engine.outage()) is not None and not outage.lost:
        await asyncio.sleep(POLL_S)
    return outage


def _lost(outage: Outage, where: str) -> EngineLost:
    return EngineLost(f"{outage.why} {where}; {outage.fix}")
