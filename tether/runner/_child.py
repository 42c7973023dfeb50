"""A child process that leads its own process group, and how to stop all of it.

Agents (process mode) and pool workers are started with
``start_new_session=True``: each leads a new process group (and session), and
everything it spawns stays in that group unless it calls ``setsid`` itself.
Stopping one means: SIGTERM to the whole group, up to ``grace_s`` for the
leader to exit, SIGKILL to the group, wait until no member runs. The group is
also SIGKILLed after a normal exit, so a forgotten child (a tool server, a
shell) does not outlive its rollout.

:class:`Child` uses asyncio's protocol API rather than
``asyncio.create_subprocess_exec``: output goes to callbacks as it arrives
(the caller keeps a bounded tail, nothing is buffered here), and the exit is
known as soon as the process is reaped — ``Process.wait()`` can also wait for
the pipes to close, which a leftover grandchild may hold open indefinitely.

A process that leaves the group (``setsid``) is followed by :mod:`._reap`:
tether becomes a child subreaper with its first group, and :meth:`Child.stop`
also signals, kills and reaps the attempt's processes outside the group.

Every group started here is remembered until it is stopped and killed at
interpreter exit (``atexit``, registered with the first group, not on
import), so a crash or Ctrl-C that skips a runner's ``close()`` does not leave
agents behind. SIGTERM and SIGHUP, which skip ``atexit``, get a handler
(installed with the first group, only where the signal still has its default
action) that kills the groups and then dies of the same signal. That registry
(with the count of starts in flight, and :mod:`._reap`'s subreaper flag) is
the one piece of module state in the runner: it describes this OS process,
whichever runner objects exist.

Limits (:class:`Limits`) are set in the child between fork and exec:
``RLIMIT_AS`` (address space, so an agent that allocates without bound gets a
``MemoryError`` / ``ENOMEM`` instead of the host's OOM killer), ``RLIMIT_NOFILE``
and, on Linux, a parent-death signal so the agent dies with the process that
started it (used by Ray workers, which can be killed without notice).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._pool_worker import group_members
from ._reap import (
    attempt_processes,
    become_subreaper,
    kill_tree,
    reap_some,
    signal_all,
    sweep_zombies,
)

__all__ = ["Child", "Limits", "kill_live_groups", "signal_group"]

_LIVE_GROUPS: dict[int, Child] = {}  # groups started here and not yet stopped, by leader pid
_starting = 0  # Child.start calls in flight: a new leader may not be in _LIVE_GROUPS yet
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_handlers_installed = False
_atexit_registered = False
GROUP_EXIT_WAIT_S = 1.0  # how long stop() waits for SIGKILLed members to disappear
PIPE_DRAIN_WAIT_S = 1.0  # how long stop() waits for output still in the pipes

OnData = Callable[[bytes], None]  # called with each chunk, and with b"" at end of stream


def kill_live_groups() -> None:
    """SIGKILL every group started here and not yet stopped (at exit, or on a fatal signal)."""
    live = dict(_LIVE_GROUPS)
    for pgid, child in live.items():
        leader = pgid if child.returncode is None else None  # a reaped leader's pid is reusable
        kill_tree(leader, child.rollout_id, exclude=live)  # first: the tree is intact
        signal_group(pgid, signal.SIGKILL)


def _die_of(signum: int, frame: object) -> None:
    kill_live_groups()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_exit_handlers() -> None:
    """Kill live groups on SIGTERM/SIGHUP too, where nobody else handles those signals."""
    global _handlers_installed, _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(kill_live_groups)
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    for sig in _EXIT_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _die_of)


@dataclass(frozen=True)
class Limits:
    """Per-process limits set in the child before it runs the agent; None: inherit."""

    max_memory_mb: int | None = None
    max_open_files: int | None = None
    die_with_parent: bool = False

    def preexec(self) -> Callable[[], None] | None:
        """The function run in the child between fork and exec, or None if nothing to set."""
        if self.max_memory_mb is None and self.max_open_files is None and not self.die_with_parent:
            return None
        memory = None if self.max_memory_mb is None else self.max_memory_mb * 1024 * 1024
        files, pdeath = self.max_open_files, self.die_with_parent and _prctl()
        setrlimit = resource.setrlimit

        def apply() -> None:  # after fork: only plain calls, no locks, no imports
            if memory is not None:
                setrlimit(resource.RLIMIT_AS, (memory, memory))
            if files is not None:
                setrlimit(resource.RLIMIT_NOFILE, (files, files))
            if pdeath:
                pdeath(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        return apply


def _prctl() -> Any:
    """libc's ``prctl`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_running(pgid: int) -> bool:
    """Whether group ``pgid`` has a member that is not a zombie.

    Orphaned zombies stay members until someone reaps them, which never happens
    in a container whose PID 1 does not; on Linux /proc tells them apart,
    elsewhere any member counts.
    """
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return bool(group_members(pgid)) if os.path.isdir("/proc") else True


class Child(asyncio.SubprocessProtocol):
    """One child process leading its own process group. Build it with :meth:`start`."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_stdout: OnData, on_stderr: OnData | None
    ):
        self._on: dict[int, OnData] = {1: on_stdout}
        if on_stderr is not None:
            self._on[2] = on_stderr
        self._open = set(self._on)
        self.exited = loop.create_future()
        self.drained = loop.create_future()  # every output pipe reached end of stream
        self.transport: Any = None  # asyncio.SubprocessTransport
        self._stopped = False
        self.signalled = False  # whether stop() sent a signal (an end caused by tether)
        self.rollout_id: str | None = None  # the attempt running in it; see _reap

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        on_stdout: OnData,
        on_stderr: OnData | None = None,
        stdin_pipe: bool = False,
        limits: Limits | None = None,
        rollout_id: str | None = None,
    ) -> Child:
        """Start ``argv`` in a new session; stderr goes to ``on_stderr`` or /dev/null.

        ``rollout_id`` names the attempt's rollout, so that :meth:`stop` finds its
        processes that left the group and lost their parent (see :mod:`._reap`).
        """
        global _starting
        loop = asyncio.get_running_loop()
        _install_exit_handlers()
        become_subreaper()
        preexec = (limits or Limits()).preexec()
        extra: dict[str, Any] = {"preexec_fn": preexec} if preexec else {}
        _starting += 1
        try:
            _transport, child = await loop.subprocess_exec(
                lambda: cls(loop, on_stdout, on_stderr),
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin_pipe else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE if on_stderr else asyncio.subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                **extra,
            )
        finally:
            _starting -= 1
        child.rollout_id = rollout_id
        _LIVE_GROUPS[child.pid] = child
        return child

    # asyncio.SubprocessProtocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd in self._on and data:
            self._on[fd](data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in self._open:
            self._open.discard(fd)
            self._on[fd](b"")
            if not self._open and not self.drained.done():
                self.drained.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    @property
    def pid(self) -> int:
        return int(self.transport.get_pid())

    @property
    def returncode(self) -> int | None:
        """The exit code; negative: killed by that signal; None while running."""
        return self.transport.get_returncode()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the process has exited; False if ``timeout`` passed first."""
        done, _ = await asyncio.wait({self.exited}, timeout=timeout)
        return bool(done)

    def _others(self) -> dict[int, Any]:
        """The attempt's processes but the leader (psutil), in and out of the group."""
        # Once reaped (returncode set), the leader's pid may be reused: no tree below it then.
        leader = self.pid if self.returncode is None else None
        return attempt_processes(leader, self.rollout_id, exclude=_LIVE_GROUPS)

    def write(self, data: bytes) -> None:
        """Write to the child's stdin (started with ``stdin_pipe=True``)."""
        pipe = self.transport.get_pipe_transport(0)
        if pipe is None or pipe.is_closing():
            raise BrokenPipeError(f"stdin of pid {self.pid} is closed")
        pipe.write(data)

    async def stop(self, grace_s: float) -> None:
        """Stop the whole group: SIGTERM, ``grace_s``, SIGKILL; then collect what is left.

        If the leader has already exited, only the SIGKILL to the rest of the
        group is sent. The attempt's processes outside the group (:mod:`._reap`)
        get the same signals and are reaped. Safe to call twice, and
        concurrently: once a group is stopped it is never signalled again (its
        id could be reused).
        """
        pgid = self.pid
        others = {} if self._stopped else self._others()  # before any signal: the tree is whole
        if not self._stopped and self.returncode is None:
            self.signalled = True
            signal_group(pgid, signal.SIGTERM)
            signal_all(others.values(), signal.SIGTERM)
            await self.wait(grace_s)
        if not self._stopped:
            others.update(self._others())  # and what was started meanwhile
            signal_group(pgid, signal.SIGKILL)
            signal_all(others.values(), signal.SIGKILL)
        await self.wait()
        deadline = time.monotonic() + GROUP_EXIT_WAIT_S  # SIGKILL is not instantaneous
        while not self._stopped and time.monotonic() < deadline:
            reap_some(others)
            if not others and not _group_running(pgid):
                break
            await asyncio.sleep(0.01)
        if not self._stopped and not _starting:
            sweep_zombies(exclude=_LIVE_GROUPS)
        self._stopped = True
        _LIVE_GROUPS.pop(pgid, None)
        # A process that left the group (setsid) may still hold the pipes open.
        await asyncio.wait({self.drained}, timeout=max(grace_s, PIPE_DRAIN_WAIT_S))
        self.transport.close()
