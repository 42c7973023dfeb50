"""Several servers behind one remote engine: which replica serves a call, and which are up.

A rollout sticks to one replica: :meth:`ReplicaSet.pick` hashes the call's
``SamplingParams.affinity`` (the gateway sets it to the rollout id) over the replicas
that are up, so every turn of a conversation lands where its prefix is cached. A call
without affinity goes to the replica with the fewest calls in flight.

A replica is *down* from the moment a call to it fails to connect (or a health check
fails) until a health check succeeds again; :class:`ReplicaSet` never picks a down
replica while one is up, so the retried attempt of a rollout whose replica died runs on
another. Hashing over the live replicas (rendezvous hashing) moves only the rollouts of
the replica that went down.

Each replica keeps why it went down (:func:`cause`: ``cannot reach it: connection
refused``); :meth:`ReplicaSet.outage` says, from the moment the last live replica went
down, that none is up and why, and that the engine is lost once none has come back for
the grace period.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tether.engine._protocol import EngineUnreachable, Outage

__all__ = ["Replica", "ReplicaSet", "cause"]

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One server: its base URL (no trailing slash), whether it is up, calls in flight."""

    url: str
    up: bool = True
    in_flight: int = 0
    ranks: int = 1  # its processes in a weight-broadcast group (ServerInfo.ranks)
    failures: int = 0  # calls that could not reach it, over the engine's life
    why: str = ""  # why it went down, the last time (see cause())

    def score(self, key: str) -> int:
        """The replica's rendezvous-hash score for ``key`` (highest wins)."""
        digest = hashlib.blake2b(f"{key}\0{self.url}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")


class ReplicaSet:
    """The replicas of one remote engine (see the module docstring)."""

    def __init__(self, urls: Sequence[str]):
        if not urls:
            raise ValueError("a remote engine needs at least one server URL")
        seen: set[str] = set()
        self.replicas: list[Replica] = []
        for url in urls:
            url = url.rstrip("/")
            if url in seen:
                raise ValueError(f"server URL {url} is given twice")
            seen.add(url)
            self.replicas.append(Replica(url))
        #: monotonic time since which no replica has been up (None: one is up)
        self.down_since: float | None = None

    def __iter__(self):
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def pick(self, affinity: str | None) -> Replica:
        """The replica for a call with this affinity; EngineUnreachable when none is up."""
        live = self.live()
        if not live:
            raise EngineUnreachable(
                "no inference server is up (" + ", ".join(self.urls) + "): start them, "
                "or check engine.urls"
            )
        if affinity is None:
            return min(live, key=lambda r: r.in_flight)
        return max(live, key=lambda r: r.score(affinity))

    def mark_down(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        replica.why = why
        if replica.up:
            log.warning("inference server %s is down: %s", replica.url, why)
        replica.up = False
        if self.down_since is None and not self.live():
            self.down_since = time.monotonic()

    def mark_up(self, replica: Replica) -> None:
        if not replica.up:
            log.warning("inference server %s is up again", replica.url)
        replica.up = True
        self.down_since = None

    def outage(self, shown: str, grace_s: float) -> Outage | None:
        """None while a replica is up; else which went away and why, lost once none has
        been up for ``grace_s`` seconds (``shown``: the server's name, "vLLM")."""
        if self.down_since is None:
            return None
        lost = time.monotonic() - self.down_since >= grace_s
        if len(self.replicas) == 1:
            r = self.replicas[0]
            return Outage(f"the {shown} server at {r.url} went away ({r.why})", lost, "restart it")
        each = "; ".join(f"{r.url}: {r.why}" for r in self.replicas)
        return Outage(f"every {shown} server went away ({each})", lost, "restart them")


def cause(exc: BaseException) -> str:
    """Why a call to a server failed, in a few words: ``cannot reach it: connection
    refused``, ``the connection broke: server disconnected ...``, or the error's message."""
    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, httpx.TransportError):
        return text
    errno = _errno(exc)
    if errno is not None:  # "All connection attempts failed": the OS's reason under it
        text = os.strerror(errno)
    text = re.sub(r"^\[Errno -?\d+\] ", "", text)  # "[Errno 111] Connection refused"
    text = text[:1].lower() + text[1:]
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot reach it: {text}"
    return f"the connection broke: {text}"


def _errno(exc: BaseException) -> int | None:
    """The errno of the innermost ``OSError`` that caused ``exc`` (refused, reset), if any."""
    found, seen = None, 0
    at: BaseException | None = exc
    while at is not None and seen < 10:
        if isinstance(at, OSError) and at.errno:
            found = at.errno
        at, seen = at.__cause__ or at.__context__, seen + 1
    return found
