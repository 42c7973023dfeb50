"""Running the app: in the foreground (``tether serve``), on a background thread, or as a
task on the caller's event loop.

Signals: only the foreground server (``tether serve``) handles SIGINT/SIGTERM,
by uvicorn's own means. uvicorn's ``Server.serve()`` installs handlers with
``signal.signal`` for as long as it runs, whatever ``install_signal_handlers``
says; a server that shares the loop of a training run must not, or Ctrl-C
stops the gateway instead of the run (every rollout then fails as
unreachable). :class:`LoopServer` therefore serves with :class:`_QuietServer`,
which leaves signals to the program (``tether/cli/_interrupt.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from tether.errors import UserError

from .loading import LoadingApp

__all__ = ["BackgroundServer", "LoopServer", "bind_socket", "make_server"]


class _QuietServer(uvicorn.Server):
    """A uvicorn server that never touches signal handlers; stop it with ``should_exit``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def make_server(
    app: FastAPI | LoadingApp,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    handle_signals: bool = True,
) -> uvicorn.Server:
    """A uvicorn server; ``handle_signals=False``: one that leaves SIGINT/SIGTERM alone."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    return (uvicorn.Server if handle_signals else _QuietServer)(config)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) for uvicorn's ``sockets=``.

    Bound before a model loads, so a port in use is one line at once, and the
    real port of ``port=0`` is known for the URLs printed and handed to agents.
    It is created with ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` only on
    connections whose socket says ``proto == IPPROTO_TCP``, and an accepted
    connection inherits the listening socket's ``proto``. A plain
    ``socket.socket()`` (proto 0) therefore leaves Nagle's algorithm on, and every
    response written in two parts (headers, then body) waits ~40 ms for the
    client's delayed ACK.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is in use (another tether serve or run?): "
                "pass another port (e.g. --port 8001, or gateway.port=0 for a free one)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


@dataclass
class BackgroundServer:
    """A uvicorn server on its own thread and event loop, for tests and tools.

    ``port=0`` picks a free port; :attr:`url` is known once :meth:`start` returns.
    """

    app: FastAPI
    host: str = "127.0.0.1"
    port: int = 0

    def start(self, timeout: float = 20.0) -> BackgroundServer:
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._sock = sock
        self.server = make_server(self.app, self.host, self.port, handle_signals=False)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[sock])),
            name="tether-gateway",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopServer:
    """A uvicorn server as a task on the *current* event loop.

    The trainer uses this so that the gateway, the in-process agents and the
    engine's callers share one loop (the engine computes on its own thread).
    It leaves SIGINT/SIGTERM to the program: Ctrl-C stops the run, which then
    stops this server after its agents (:meth:`stop`).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.app, self.host, self.port = app, host, port

    async def start(self, timeout: float = 20.0) -> LoopServer:
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._sock = sock
        self.server = make_server(self.app, self.host, self.port, handle_signals=False)
        self._task = asyncio.create_task(self.server.serve(sockets=[sock]))
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._task.done() or time.monotonic() > deadline:
                raise RuntimeError("gateway server did not start")
            await asyncio.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(self._task, 10)
        finally:
            self._sock.close()
