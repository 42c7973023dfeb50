"""How a remote engine's new weights reach its servers: :class:`WeightPusher`.

One push by ``transport`` to the replicas given (``RemoteEngine.update_weights`` pauses
them first, checks their versions and resumes them after):

- ``disk``: the full weights as a model folder ``weights_dir/v{N}`` (``_push.save_full``),
  then each server's update-from-disk route;
- ``lora``: the adapter folder ``weights_dir/lora-v{N}`` (``_push.save_adapter``), then
  each server loads it under one name (:data:`ADAPTER`), in place; calls name it;
- ``nccl``: a broadcast from the trainer (rank 0) over a group the servers join once
  (made anew when the set of replicas changes), tensor by tensor, while each server is
  told what to receive.

The trainer's join of the group runs on a daemon thread: if a server never joins, the
push fails with the server's error and the thread gives up at its timeout without
holding the process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tether.engine._protocol import EngineFailed
from tether.engine._replicas import Replica
from tether.engine._server_api import GroupJoin, ServerAPI, Transport
from tether.engine._weight_transports import (
    BroadcastGroup,
    prune,
    save_adapter,
    save_full,
    tensor_metas,
)

__all__ = ["ADAPTER", "WeightPusher"]

#: The LoRA adapter name the servers load each pushed adapter under (in place).
ADAPTER = "tether-policy"

#: Run ``make(replica)`` for every replica at once (transport faults mapped by the engine;
#: a replica that cannot be reached is dropped from the list, the push goes on without it).
Each = Callable[[list[Replica], Callable[[Replica], Awaitable[Any]]], Awaitable[list[Any]]]


class WeightPusher:
    """The trainer's side of every push of one remote engine (see the module docstring)."""

    def __init__(
        self,
        api: ServerAPI,
        transport: Transport,
        *,
        weights_dir: Path | None,
        model_dir: Path | None,
        lora_config: Mapping[str, Any] | None,
        keep: int,
        nccl: tuple[str, int, str],
    ):
        self.api, self.transport = api, transport
        self.weights_dir, self.model_dir = weights_dir, model_dir
        self.lora_config = dict(lora_config) if lora_config is not None else None
        self.keep, self.nccl = keep, nccl
        self.adapter: str | None = None  # the adapter calls name, once one is pushed
        self.ranks: dict[str, int] = {}  # each replica's ranks in a broadcast group
        self._group: BroadcastGroup | None = None
        self._members: tuple[str, ...] = ()

    def check(self) -> None:
        if self.transport in ("disk", "lora") and self.weights_dir is None:
            raise EngineFailed(f"the {self.transport} transport needs engine.weights_dir")
        if self.transport == "lora" and self.lora_config is None:
            raise EngineFailed("engine.transport=lora needs a LoRA trainer: set trainer.lora")

    async def push(
        self,
        client: httpx.AsyncClient,
        each: Each,
        targets: list[Replica],
        state_dict: dict[str, Any],
        new: int,
    ) -> None:
        """Send ``state_dict`` as version ``new`` to ``targets``."""
        self.check()
        api = self.api
        if self.transport == "disk":
            assert self.weights_dir is not None
            folder = self.weights_dir / f"v{new}"
            await asyncio.to_thread(save_full, state_dict, folder, self.model_dir)
            await each(targets, lambda r: api.update_from_disk(client, r.url, str(folder), new))
            prune(self.weights_dir, "v", self.keep)
        elif self.transport == "lora":
            assert self.weights_dir is not None and self.lora_config is not None
            folder = self.weights_dir / f"lora-v{new}"
            await asyncio.to_thread(save_adapter, state_dict, self.lora_config, folder)
            await each(targets, lambda r: api.load_lora(client, r.url, ADAPTER, str(folder), new))
            self.adapter = ADAPTER
            prune(self.weights_dir, "lora-v", self.keep)
        else:
            group = await self._group_of(client, each, targets)
            metas, name = tensor_metas(state_dict), group.group_name
            await asyncio.gather(
                asyncio.to_thread(group.broadcast, state_dict),
                each(targets, lambda r: api.update_from_nccl(
                    client, r.url, metas, group_name=name, version=new
                )),
            )  # fmt: skip

    async def _group_of(
        self, client: httpx.AsyncClient, each: Each, targets: list[Replica]
    ) -> BroadcastGroup:
        """The broadcast group of ``targets`` (made anew when the replicas changed)."""
        members = tuple(r.url for r in targets)
        if self._group is not None and members == self._members:
            return self._group
        self.close()
        address, port, backend = self.nccl
        port = port or _free_port(address)
        world = 1 + sum(self.ranks.get(u, 1) for u in members)
        name = f"tether-weights-{uuid.uuid4().hex[:8]}"
        group = BroadcastGroup(
            address, port, world, backend=backend, group_name=name,
            prefix=self.api.group_prefix(name),
        )  # fmt: skip
        offsets, rank = {}, 1
        for u in members:
            offsets[u], rank = rank, rank + self.ranks.get(u, 1)
        joins = each(targets, lambda r: self.api.init_nccl(
            client, r.url, GroupJoin(address, port, offsets[r.url], world, backend, name)
        ))  # fmt: skip
        await asyncio.gather(_on_daemon_thread(group.join), joins)
        self._group, self._members = group, members
        return group

    def close(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group, self._members = None, ()


def _on_daemon_thread(fn: Callable[[], None]) -> asyncio.Future[None]:
    """``fn()`` on a daemon thread (not the loop's executor, which closing waits for)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc is not None else done.set_result(None)

    def run() -> None:
        error: BaseException | None = None
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="tether-weights-join", daemon=True).start()
    return done


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
