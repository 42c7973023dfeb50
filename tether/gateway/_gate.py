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

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @asynccontextmanager
    async def admit(self, timeout_s: float) -> AsyncIterator[None]:
        """Wait while paused (up to ``timeout_s``), then count the call in flight."""
        if not self._open.is_set():
            self.held += 1
            self.held_total += 1
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(self._open.wait(), timeout_s)
            except TimeoutError:
                raise ApiError(
                    503,
                    "gateway paused for a model update longer than the admission timeout; retry",
                ) from None
            finally:
                self.held -= 1
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
        self._open.set()

    def state(self) -> dict:
        return {
            "paused": self.paused,
            "in_flight": self.in_flight,
            "held": self.held,
            "held_total": self.held_total,
            "held_seconds": round(self.held_seconds, 6),
        }
