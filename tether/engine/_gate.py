"""The admission gate: pause, drain and resume generations.

Each engine has one (``Engine.gate``), and it is the only gate a model call
passes: the engine admits its callers through it, so an update never meets a
half-admitted request, and the gateway admits the agents' calls through the
same gate (with its admission timeout), pausing it while the trainer updates::

    gate = AdmissionGate()
    async with gate.admit(timeout_s=30):   # waits while paused; counts the body in flight
        ...
    async with gate.paused_for_update():   # pause + drain, resume after (unless paused before)
        ...

While paused, new calls are *held* (they wait, up to ``timeout_s`` when given,
then :class:`AdmissionTimeout`), not refused; :meth:`AdmissionGate.pause`
returns once every call already admitted has finished. :meth:`close` refuses
new calls for good (:class:`EngineFailed`). The gate rebinds its events to
whichever event loop is running, so one engine can be used from successive
loops (e.g. one per test).

A call is admitted once: inside ``admit()`` (the gateway's, around the engine
call) the engine's own ``admit()`` of the same gate passes straight through,
neither counted nor held (a context variable marks the gates the running call
holds; tasks started inside inherit it). Else a pause landing between the two
would hold the inner one forever while the drain waits for the outer one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from tether.engine._protocol import EngineError, EngineFailed

__all__ = ["AdmissionGate", "AdmissionTimeout"]


class AdmissionTimeout(EngineError):
    """A call was held while paused for longer than its admission timeout."""


#: The gates the running call was admitted through (see the module docstring).
_HELD: ContextVar[frozenset[AdmissionGate]] = ContextVar("tether_admitted", default=frozenset())


class AdmissionGate:
    """Counts calls in flight, holds new ones while paused, and counts the holds.

    ``held`` is the number of calls held now; ``held_total`` and
    ``held_seconds`` add up every hold since the gate was made.
    """

    def __init__(self) -> None:
        self.paused = False
        self.closed = False
        self.in_flight = 0
        self.held = 0
        self.held_total = 0
        self.held_seconds = 0.0
        # Start times of calls held now; resume() settles their hold time at once,
        # so held_seconds is exact the moment admission reopens.
        self._holding: dict[object, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        self._bind()

    def _bind(self) -> None:
        """Make the events belong to the running loop, keeping the gate's state."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is self._loop and loop is not None:
            return
        self._loop = loop
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        if not self.paused or self.closed:
            self._open.set()
        if self.in_flight == 0:
            self._idle.set()

    @asynccontextmanager
    async def admit(self, timeout_s: float | None = None) -> AsyncIterator[None]:
        """Wait while paused (up to ``timeout_s``), then count the body as one call in flight;
        within a call already admitted here, go straight on (see the module docstring)."""
        held = _HELD.get()
        if self in held:
            yield
            return
        self._bind()
        if self.paused and not self.closed:
            await self._hold(timeout_s)
        if self.closed:
            raise EngineFailed("engine is closed")
        self.in_flight += 1
        self._idle.clear()
        _HELD.set(held | {self})
        try:
            yield
        finally:
            # set, not reset: an async generator may be closed in another context
            _HELD.set(held)
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _hold(self, timeout_s: float | None) -> None:
        self.held += 1
        self.held_total += 1
        me = object()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            # A call woken by resume() that finds admission closed again (a new
            # pause came first) waits again: nothing runs while paused.
            while self.paused and not self.closed:
                self._holding.setdefault(me, time.monotonic())
                if deadline is None:
                    await self._open.wait()
                else:
                    await asyncio.wait_for(self._open.wait(), max(deadline - time.monotonic(), 0))
        # asyncio.TimeoutError: on Python 3.10 it is not the builtin TimeoutError.
        except asyncio.TimeoutError:
            raise AdmissionTimeout(
                "gateway paused for a model update longer than the admission timeout; retry"
            ) from None
        finally:
            self.held -= 1
            t0 = self._holding.pop(me, None)
            if t0 is not None:  # not settled by resume(): timed out or cancelled
                self.held_seconds += time.monotonic() - t0

    def hold_new(self) -> None:
        """Stop admitting, leaving the calls in flight running (see :meth:`pause`)."""
        self._bind()
        self.paused = True
        self._open.clear()

    async def pause(self) -> None:
        """Stop admitting; return when nothing is in flight."""
        self.hold_new()
        await self._idle.wait()

    def resume(self) -> None:
        """Admit again; calls held now go ahead."""
        self._bind()
        now = time.monotonic()
        self.held_seconds += sum(now - t0 for t0 in self._holding.values())
        self._holding.clear()
        self.paused = False
        self._open.set()

    @asynccontextmanager
    async def paused_for_update(self, *, drain: bool = True) -> AsyncIterator[None]:
        """Pause and drain for the body; resume after it unless the gate was paused before
        (the gateway paused it for the update: the gateway resumes it). ``drain=False``
        holds new calls without waiting for those in flight (:meth:`hold_new`)."""
        was_paused = self.paused
        if drain:
            await self.pause()
        else:
            self.hold_new()
        try:
            yield
        finally:
            if not was_paused:
                self.resume()

    def close(self) -> None:
        """Refuse new calls for good; held ones wake up and fail with EngineFailed."""
        self._bind()
        self.closed = True
        self._open.set()

    def state(self) -> dict[str, Any]:
        """The counters, for the admin state route and the async trainer's metrics."""
        return {
            "paused": self.paused,
            "in_flight": self.in_flight,
            "held": self.held,
            "held_total": self.held_total,
            "held_seconds": round(self.held_seconds, 6),
        }
