"""The admission gate: pause, drain and resume model calls.

While the gate is closed new calls are *held* (they wait, up to a timeout),
not refused; :meth:`AdmissionGate.pause` returns once every call already
admitted has finished, so nothing is answered by half-updated weights.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ._errors import ApiError

__all__ = ["AdmissionGate"]


class AdmissionGate:
    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0
        self.held = 0
        self.held_total = 0
        self.held_seconds = 0.0
        # Start times of calls held now; resume() settles their hold time at once,
        # so held_seconds is exact the moment admission reopens.
        self._holding: dict[object, float] = {}

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @asynccontextmanager
    async def admit(self, timeout_s: float) -> AsyncIterator[None]:
        """Wait while paused (up to ``timeout_s``), then count the call in flight."""
        if not self._open.is_set():
            self.held += 1
            self.held_total += 1
            me = object()
            deadline = time.monotonic() + timeout_s
            try:
                # A call woken by resume() that finds admission closed again (a new
                # pause came first) waits again: nothing runs while paused.
                while not self._open.is_set():
                    self._holding.setdefault(me, time.monotonic())
                    await asyncio.wait_for(self._open.wait(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                raise ApiError(
                    503,
                    "gateway paused for a model update longer than the admission timeout; retry",
                ) from None
            finally:
                self.held -= 1
                t0 = self._holding.pop(me, None)
                if t0 is not None:  # not settled by resume(): timed out or cancelled
                    self.held_seconds += time.monotonic() - t0
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def pause(self) -> None:
        """Close admission and wait until no call is in flight."""
        self._open.clear()
        await self._idle.wait()

    def resume(self) -> None:
        now = time.monotonic()
        self.held_seconds += sum(now - t0 for t0 in self._holding.values())
        self._holding.clear()
        self._open.set()

    def state(self) -> dict:
        return {
            "paused": self.paused,
            "in_flight": self.in_flight,
            "held": self.held,
            "held_total": self.held_total,
            "held_seconds": round(self.held_seconds, 6),
        }
