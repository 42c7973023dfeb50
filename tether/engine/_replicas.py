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
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tether.engine._protocol import EngineUnreachable

__all__ = ["Replica", "ReplicaSet"]

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One server: its base URL (no trailing slash), whether it is up, calls in flight."""

    url: str
    up: bool = True
    in_flight: int = 0
    failures: int = 0  # calls that could not reach it, over the engine's life

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
        if replica.up:
            log.warning("inference server %s is down: %s", replica.url, why)
        replica.up = False

    def mark_up(self, replica: Replica) -> None:
        if not replica.up:
            log.warning("inference server %s is up again", replica.url)
        replica.up = True
