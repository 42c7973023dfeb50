"""The agent side of pool mode, plus the helpers the parent shares with it.

This module imports only the standard library, so that a pool worker can run
it as a script (``python -u .../_pool_worker.py SPEC``) whether or not tether is
importable from the agent's working directory.

Worker protocol, one JSON object per line:

- worker → parent, once: ``{"ready": true, "pid": N}`` after importing the agent,
  or ``{"ready": false, "error": "..."}`` (then it exits);
- parent → worker: ``{"env": {...}, "max_output_bytes": N}``, one per rollout;
- worker → parent: ``{"exit_code", "final_answer", "output_tail", "error",
  "duration_s"}`` per rollout; on SIGTERM mid-rollout, the same with
  ``"killed": true`` before exiting.

The protocol uses private duplicates of the worker's stdin and stdout; the
agent's fds 0, 1 and 2 point at /dev/null, except during a rollout, when 1 and 2
go to a pipe whose tail is kept (bounded) and whose last line is the answer.
Processes a rollout leaves running are killed when it ends (those the agent
started at import time are left alone). On Linux the worker is a child
subreaper, so a process of the rollout that called ``setsid()`` and lost its
parent is re-parented to the worker: every leftover is a member of the
worker's group or one of its descendants, and the worker reaps what it kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "descendants",
    "exit_code_of",
    "group_members",
    "load_callable",
    "parse_agent_spec",
    "process_table",
]

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_WAIT_S = 1.0  # how long a worker waits for the processes it killed to be reaped

if __package__:  # imported as part of tether
    from ._tail import Tail
else:  # run as a script, where tether may not be importable: the sibling file by path
    Tail = runpy.run_path(str(Path(__file__).with_name("_tail.py")))["Tail"]


def parse_agent_spec(spec: str) -> tuple[str, str]:
    """Split ``"module:function"`` or ``"path/to/file.py:function"`` into its two parts."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise ValueError(
            f"agent ({spec!r}) must be 'module:function' or 'path/to/file.py:function', "
            "e.g. 'examples.calc.agent:main'"
        )
    return target, attr


def load_callable(spec: str, cwd: str | None = None) -> Any:
    """Import the object named by ``spec``, like ``python -m`` or ``python file.py`` would.

    A module is looked up with ``cwd`` (default: the current directory) first on
    ``sys.path``; a file is loaded under a private module name, with its folder
    put first on ``sys.path`` so its own sibling imports work.
    """
    target, attr = parse_agent_spec(spec)
    base = Path(cwd or os.getcwd()).resolve()
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target) if Path(target).is_absolute() else base / target
        if not path.is_file():
            raise FileNotFoundError(f"agent file {str(path)!r} does not exist")
        folder = str(path.parent.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"_tether_agent_{path.stem}_{zlib.crc32(str(path.resolve()).encode()):08x}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {str(path)!r} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        if str(base) not in sys.path:
            sys.path.insert(0, str(base))
        module = importlib.import_module(target)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec!r} names a {type(obj).__name__}, not a function")
    return obj


def exit_code_of(value: object) -> int:
    """The exit code ``sys.exit(value)`` gives: None → 0, an int → itself, else print → 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return int(value)
    print(value, file=sys.stderr)
    return 1


class _Capture:
    """Points fds 1 and 2 at a pipe for one rollout; a thread keeps the pipe's tail."""

    def __init__(self, cap: int, devnull: int) -> None:
        self.tail = Tail(cap)
        self._devnull = devnull
        read_fd, write_fd = os.pipe()
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), daemon=True)
        self._reader.start()
        self._flush()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)

    def _pump(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                self.tail.add(chunk)

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()

    def stop(self) -> None:
        """Back to /dev/null; wait briefly for the reader (a leftover child may hold the pipe)."""
        self._flush()
        os.dup2(self._devnull, 1)
        os.dup2(self._devnull, 2)
        self._reader.join(timeout=1.0)


def process_table() -> dict[int, tuple[bytes, int, int]]:
    """``pid -> (state, ppid, pgrp)`` of every process, from /proc (Linux); empty elsewhere."""
    table: dict[int, tuple[bytes, int, int]] = {}
    if not os.path.isdir("/proc"):
        return table
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as f:
                fields = f.read().rpartition(b")")[2].split()  # state ppid pgrp ...
        except OSError:
            continue
        if len(fields) > 2:
            table[int(entry.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def group_members(pgid: int | None = None) -> set[int]:
    """Live (non-zombie) processes of group ``pgid`` (default: ours) but this one; Linux only."""
    pgid = os.getpgrp() if pgid is None else pgid
    me = os.getpid()
    return {
        pid
        for pid, (state, _ppid, pgrp) in process_table().items()
        if pgrp == pgid and state != b"Z" and pid != me
    }


def descendants(root: int, table: dict[int, tuple[bytes, int, int]]) -> set[int]:
    """Every process below ``root`` in ``table`` (zombies included)."""
    children: dict[int, list[int]] = {}
    for pid, (_state, ppid, _pgrp) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _become_subreaper() -> None:
    """Adopt this process's orphaned descendants (Linux), so a rollout's processes stay findable."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class _AgentHost:
    """Runs the agent's ``main`` once per request, in this process."""

    def __init__(self, commands: BinaryIO, replies: BinaryIO, devnull: int) -> None:
        self.commands, self.replies, self.devnull = commands, replies, devnull
        self.base_env = dict(os.environ)
        self.capture: _Capture | None = None
        self.stdio = (sys.stdout, sys.stderr)
        self.resident: set[int] = set()  # processes the agent started at import: they stay

    def kill_leftovers(self) -> None:
        """SIGKILL processes a rollout started and left running, in the group or not; reap them."""
        me, group, table = os.getpid(), os.getpgrp(), process_table()
        in_group = {pid for pid, (_state, _ppid, pgrp) in table.items() if pgrp == group}
        leftovers = {
            pid
            for pid in in_group | descendants(me, table)
            if table[pid][0] != b"Z" and pid != me and pid not in self.resident
        }
        for pid in leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while leftovers and time.monotonic() < deadline:
            table = process_table()
            for pid, (state, ppid, _pgrp) in table.items():
                if ppid == me and state == b"Z" and pid not in self.resident:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)  # ours now (we are a subreaper): reap it
            leftovers = {p for p in leftovers if p in table and table[p][1] in (me, *leftovers)}
            time.sleep(0.005)

    def send(self, message: dict[str, Any]) -> None:
        self.replies.write(json.dumps(message).encode() + b"\n")
        self.replies.flush()

    def on_sigterm(self, signum: int, frame: object) -> None:
        """Killed mid-rollout: hand back what was captured, then exit at once."""
        if self.capture is not None:
            self.capture.stop()
            tail = self.capture.tail
            self.send(
                {"killed": True, "output_tail": tail.text(), "final_answer": tail.last_line()}
            )
        os._exit(128 + signum)

    def serve(self, main: Any) -> None:
        for line in self.commands:
            request = json.loads(line)
            self.send(self.run_one(main, request))

    def run_one(self, main: Any, request: dict[str, Any]) -> dict[str, Any]:
        os.environ.clear()
        os.environ.update(request["env"])
        self.capture = capture = _Capture(int(request["max_output_bytes"]), self.devnull)
        started = time.monotonic()
        error = None
        try:
            value = main()
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            # ``return 3`` from main() reads as an exit code (``sys.exit(main())``);
            # any other return value is ignored, as ``main()`` in ``__main__`` would.
            code = value if isinstance(value, int) and not isinstance(value, bool) else 0
        except SystemExit as exc:
            code = exit_code_of(exc.code)
        except BaseException as exc:
            traceback.print_exc()
            code, error = 1, f"{type(exc).__name__}: {exc}"
        finally:
            sys.stdout, sys.stderr = self.stdio
            self.kill_leftovers()
            capture.stop()
            self.capture = None
            os.environ.clear()
            os.environ.update(self.base_env)
        return {
            "exit_code": code,
            "final_answer": capture.tail.last_line(),
            "output_tail": capture.tail.text(),
            "error": error,
            "duration_s": time.monotonic() - started,
        }


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _serve(spec: str) -> int:
    """Worker entry point: take the protocol fds, import the agent, serve requests."""
    commands = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    worker = _AgentHost(commands, replies, devnull)
    _become_subreaper()
    sys.argv = [parse_agent_spec(spec)[0]]  # as if started as that file/module, no arguments
    try:
        main = load_callable(spec)
    except BaseException as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        worker.send({"ready": False, "error": f"cannot import agent {spec!r}: {detail}"})
        return 1
    signal.signal(signal.SIGTERM, worker.on_sigterm)
    worker.resident = group_members() | descendants(os.getpid(), process_table())
    worker.send({"ready": True, "pid": os.getpid()})
    worker.serve(main)
    return 0


if __name__ == "__main__":
    # Run as a script, sys.path[0] is this package's folder; make it the working
    # directory instead, as ``python -m`` does, so the agent's imports resolve there.
    sys.path[0] = os.getcwd()
    sys.exit(_serve(sys.argv[1]))
