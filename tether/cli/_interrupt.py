"""Ctrl-C and SIGTERM for the ``tether`` command: stop at once, cleanly, and say where.

:class:`Interrupts` owns SIGINT and SIGTERM for the whole command (``cli.main``
installs it; nothing else in tether installs signal handlers, and the
training gateway is built so that uvicorn does not either). What a signal
does depends on what is running:

- an asyncio command run by :meth:`Interrupts.run` (train, eval, demo): the
  first signal cancels its main task. Cancellation reaches whatever is
  awaited: a group of rollouts (each rollout's attempt is cancelled, which
  stops its agent; a cancelled attempt is never retried), an eval, the wait
  for a policy update. ``TrainingRun.__aexit__`` then closes the runner
  (killing every agent and pool worker), the gateway and the engine, in that
  order, and :meth:`run` raises :class:`Interrupted`;
- the main task itself running plain code that does not await (loading a
  model at start-up, writing a checkpoint), or anything outside a loop
  (``tether rollouts``, ``tether serve`` once uvicorn hands the signal back):
  :class:`Interrupted` is raised where the main thread is, like
  ``KeyboardInterrupt``; on its way out of the run it closes the same parts.
  A checkpoint is written to a temporary folder and renamed
  (``trainer/checkpoint.py``), so stopping in the middle of one leaves the
  previous checkpoint as the latest.

Either way the command prints one line (:attr:`Interrupts.describe`) and
exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).

The policy update runs on a worker thread (``asyncio.to_thread``), which
cannot be cancelled: the run stops awaiting it at once and asks it to end at
its next micro-batch (``PolicyTrainer.stop``), and the interpreter waits for
that before exiting. Everything that can keep a clean stop from being quick
(a long micro-batch, a model that is still loading in C code, an agent that
ignores SIGTERM for its ``grace_s``) is bounded by ``grace_s`` after the first
signal: then the process kills every agent process group it started, prints
the line and leaves with ``os._exit``. Leaving an update unfinished is safe:
it changes only weights in this process's memory, never a file, and the
interrupted step is redone on ``--resume`` from the last checkpoint.

A second signal while stopping skips the rest of the clean stop the same way
(agent groups killed, the line, ``os._exit``) — "Ctrl-C again to quit now".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

from tether.errors import Interrupted  # defined there so that tether.run can catch it

__all__ = ["SHUTDOWN_GRACE_S", "Interrupted", "Interrupts"]

SHUTDOWN_GRACE_S = 5.0  # longest clean stop after the first signal before a forced exit
SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")


class Interrupts:
    """SIGINT/SIGTERM handling for one command; use as ``with Interrupts() as it: ...``.

    ``describe`` makes the one line printed on an interrupt (the command sets
    it to something that reads its run's state: step, last checkpoint);
    ``on_force_exit`` callables run before a forced exit (killing the agent
    process groups). Both may be called from a signal handler or the timer
    thread, so they must only read state and send signals.
    """

    def __init__(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self.describe: Callable[[], str] = lambda: "interrupted"
        self.on_force_exit: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._previous: dict[int, Any] = {}
        self._reported = threading.Lock()  # the line is printed once, by whoever gets here first

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """``asyncio.run(main)``, where SIGINT/SIGTERM cancel ``main`` and raise :class:`Interrupted`."""

        async def guarded() -> T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                return await main
            finally:
                self._loop = self._task = None

        try:
            return asyncio.run(guarded())
        except asyncio.CancelledError:
            if self.signum is None:
                raise
            raise Interrupted(self.signum) from None

    def report(self) -> None:
        """Print the line on stderr (once, whoever calls first: the CLI or a forced exit)."""
        if not self._reported.acquire(blocking=False):
            return
        try:
            line = self.describe()
        except Exception:  # the run's state may be half built; the line must still come
            line = "interrupted"
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), f"\n{line}\n".encode())

    # -- the handler and the forced exit -------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: stop now
            self._force_exit()
        self.signum = signum
        timer = threading.Timer(self.grace_s, self._force_exit)
        timer.daemon = True
        timer.start()
        loop, task = self._loop, self._task
        if (
            loop is not None
            and task is not None
            and not loop.is_closed()
            and asyncio.current_task(loop) is not task
        ):
            loop.call_soon_threadsafe(task.cancel)
            return
        # Not in the loop, or the main task itself is running plain code (loading a
        # model, writing a checkpoint): stop that code where it is, as KeyboardInterrupt would.
        raise Interrupted(signum)

    def _force_exit(self) -> None:
        for kill in self.on_force_exit:
            with contextlib.suppress(Exception):
                kill()
        self.report()
        os._exit(128 + (self.signum or signal.SIGINT))
