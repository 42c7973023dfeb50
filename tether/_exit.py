"""Leave the ``tether`` command without the interpreter's teardown.

A command that loaded a model has imported torch and transformers' import
graph (about 3,400 modules and 450,000 objects with tether's extras
installed). Tearing that down at exit took 4–20 s on the project's 2-core
machine (measured after Ctrl-C in a train run: the one-line message at
+0.3 s, the last exit handler at +0.7 s, the process gone at +6 to +21 s,
all of it in ``gc_collect_main`` during finalization), and Ctrl-C must end a
run within seconds.

So :func:`run` registers :func:`_leave` as an exit handler before the
command imports anything heavy, which makes it run after every handler
registered later (they run last-in, first-out): by then Python has joined
the non-daemon threads and run the handlers of everything the command
loaded (the runner's kill of leftover agent groups, tracking clients), and
the command has closed everything it opened. :func:`_leave` then does what
the one earlier handler, logging's, would do (``logging.shutdown``), flushes
stdout and stderr, and ends the process with ``os._exit`` and the status the
command chose; only the freeing of memory the OS takes back anyway is
skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable

__all__ = ["run"]

_status: list[int] = []  # the command's exit status, once known


def run(main: Callable[[], object]) -> None:
    """Run a command's ``main`` (before it imports torch), then leave without the teardown
    with the status the interpreter would have given."""
    atexit.register(_leave)
    try:
        main()
    except BaseException as exc:
        _status[:] = [_status_of(exc)]
        raise
    _status[:] = [0]


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _leave() -> None:
    if not _status:  # main never ended (a fork that exits on its own): a normal exit
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
            stream.flush()
    os._exit(_status[0])
