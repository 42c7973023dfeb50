"""The admission gate every engine shares: pause, resume, in-flight counting.

``pause()`` stops admitting new generations and returns when none is in
flight; ``generate`` calls that arrive while paused wait until ``resume()``.
The gate lives on the asyncio side, so the engines' worker threads never see
a half-admitted request. It rebinds its events to whichever event loop is
running, so one engine can be used from successive loops (e.g. one per test).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tether.engine._protocol import EngineFailed

__all__ = ["Gate"]


class Gate:
    """Counts generations in flight and holds new ones while paused."""

    def __init__(self) -> None:
        self.paused = False
        self.closed = False
        self.in_flight = 0
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
    async def admit(self) -> AsyncIterator[None]:
        """Wait while paused, then count the body as one generation in flight."""
        self._bind()
        while True:
            if self.closed:
                raise EngineFailed("engine is closed")
            if not self.paused:
                break
            await self._open.wait()
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def pause(self) -> None:
        """Stop admitting; return when nothing is in flight."""
        self._bind()
        self.paused = True
        self._open.clear()
        await self._idle.wait()

    def resume(self) -> None:
        self._bind()
        self.paused = False
        self._open.set()

    def close(self) -> None:
        """Refuse new generations; waiters wake up and fail with EngineFailed."""
        self._bind()
        self.closed = True
        self._open.set()
