"""Finding and reaping what an attempt left behind, also processes that left its group.

The process-group kill of :mod:`._child` misses a process that called
``setsid()`` (or ``setpgid``): a daemonizing tool, a shell's ``setsid cmd &``.
On Linux three things bring those back under control:

1. **tether is a child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``, set with
   the first group it starts, not on import). A process whose parent dies is
   re-parented to tether instead of init, so it stays findable.
2. **What belongs to an attempt** is, at its end: every descendant of the
   agent's first process (psutil's tree, taken before the group is signalled and
   again before SIGKILL; a process that called ``setsid()`` is still a
   descendant while its parent lives), plus each child tether adopted whose
   environment says ``TETHER_ROLLOUT_ID=<this rollout>`` (a double-forked
   daemon whose parent already exited), with its descendants. They get the
   group's SIGTERM and SIGKILL. Other attempts' processes are never matched:
   they are not in this tree and carry another rollout id. Pool workers are
   subreapers themselves (:mod:`._pool_worker`), so a rollout's escapees stay their
   descendants and are killed by the worker when the rollout ends.
3. **tether waits for what it adopted.** Killed processes that are its children
   now are waited for (``waitpid`` on their pid, never ``-1``, so the exit
   statuses of tether's own subprocesses are not stolen), and so are adopted
   zombies: children of tether in another session (an agent's session or one it
   made) that are not a live agent leader, swept at the end of each attempt
   while no group is being started.

Limits: a process that leaves the group, loses its parent and clears its
environment (``env -i``) before the attempt ends cannot be attributed and
outlives the attempt (it is killed with tether if it is a descendant of a live
group then; a cgroup per attempt would close this gap). On macOS and other
systems without subreapers, only the tree of processes whose parent still
lives is found; an orphan re-parented to init is out of reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Collection, Iterable

import psutil

__all__ = [
    "attempt_processes",
    "become_subreaper",
    "kill_tree",
    "reap_some",
    "signal_all",
    "sweep_zombies",
]

PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None  # None: not tried yet


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux); whether it is one. Tried once."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return bool(_subreaper)


def _rollout_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get("TETHER_ROLLOUT_ID")
    except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
        return None


def attempt_processes(
    leader: int | None, rollout_id: str | None, exclude: Collection[int] = ()
) -> dict[int, psutil.Process]:
    """The processes of one attempt but its leader: see the module docstring (2.).

    ``leader`` is the pid of the agent's first process while it is not reaped
    (None after: its pid may be reused); ``exclude`` are pids never to return
    (the live agent leaders, which tether's event loop waits for).
    """
    found: dict[int, psutil.Process] = {}
    roots: list[psutil.Process] = []
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            roots.append(psutil.Process(leader))
    if rollout_id is not None and _subreaper:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                mine = child.pid != leader and child.pid not in exclude
                if mine and _rollout_of(child) == rollout_id:
                    found[child.pid] = child
                    roots.append(child)
    for root in roots:
        with contextlib.suppress(psutil.Error):
            for proc in root.children(recursive=True):
                found.setdefault(proc.pid, proc)
    if leader is not None:
        found.pop(leader, None)
    for pid in exclude:
        found.pop(pid, None)
    return found


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process still running (psutil checks the pid was not reused)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _wait_child(pid: int) -> bool:
    """Reap ``pid`` if it is an ended child of ours; whether it is gone for good."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not (or no longer) our child
        return not psutil.pid_exists(pid)
    return done != 0


def reap_some(pending: dict[int, psutil.Process]) -> None:
    """One pass: drop from ``pending`` each process that has ended (and, if ours, been reaped).

    A killed process whose parent is still pending becomes tether's (a
    subreaper's) zombie once that parent is gone; it is waited for then.
    """
    me = os.getpid()
    for pid, proc in list(pending.items()):
        try:
            parent = proc.ppid()
            if parent == me:
                gone = _wait_child(pid)
            else:  # someone else's zombie, unless its parent is about to hand it to us
                gone = parent not in pending and proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone:
            del pending[pid]


def sweep_zombies(exclude: Collection[int]) -> int:
    """Reap adopted zombies: children of tether in another session, not in ``exclude``."""
    if not _subreaper:
        return 0
    my_sid, reaped = os.getsid(0), 0
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, OSError):
                if child.pid in exclude or child.status() != psutil.STATUS_ZOMBIE:
                    continue
                if os.getsid(child.pid) != my_sid and os.waitpid(child.pid, os.WNOHANG)[0]:
                    reaped += 1
    return reaped


def kill_tree(leader: int | None, rollout_id: str | None, exclude: Collection[int] = ()) -> None:
    """SIGKILL an attempt's processes at once, not waiting (interpreter exit, a fatal signal)."""
    signal_all(attempt_processes(leader, rollout_id, exclude).values(), signal.SIGKILL)
