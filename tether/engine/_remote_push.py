"""How a remote engine's new weights reach its servers: one push object per transport,
built once from the engine's config (:func:`remote_push`) and provided as its
``weight_push``. Each takes the trainer's weights in the form its servers load
(:mod:`tether.engine._weight_push`) and :meth:`RemotePush.send` carries them to the
replicas given (``RemoteEngine.update_weights`` pauses them first, checks their versions
and resumes them after):

- :class:`DiskPush` (``disk``): the full weights as a model folder ``weights_dir/v{N}``
  (``_weight_transports.save_full``), then each server's update-from-disk route;
- :class:`AdapterLoadPush` (``lora``): the adapter folder ``weights_dir/lora-v{N}``
  (``_weight_transports.save_adapter``), then each server loads it under one name
  (:data:`ADAPTER`), in place; calls name it;
- :class:`BroadcastPush` (``nccl``): a broadcast from the trainer (rank 0) over a group
  the servers join once (made anew when the set of replicas changes), tensor by tensor,
  while each server is told what to receive.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tether.engine._protocol import Engine, EngineFailed
from tether.engine._replicas import Replica
from tether.engine._server_api import GroupJoin, ServerAPI, Transport
from tether.engine._weight_push import AdapterPush, WeightPush
from tether.engine._weight_transports import (
    BroadcastGroup,
    prune,
    save_adapter,
    save_full,
    tensor_metas,
)

__all__ = ["ADAPTER", "AdapterLoadPush", "BroadcastPush", "DiskPush", "RemotePush", "remote_push"]

#: The LoRA adapter name the servers load each pushed adapter under (in place).
ADAPTER = "tether-policy"

#: Run ``make(replica)`` for every replica at once (transport faults mapped by the engine;
#: a replica that cannot be reached is dropped from the list, the push goes on without it).
Each = Callable[[list[Replica], Callable[[Replica], Awaitable[Any]]], Awaitable[list[Any]]]


def remote_push(
    engine: Engine,
    api: ServerAPI,
    transport: Transport,
    *,
    weights_dir: Path | None,
    model_dir: Path | None,
    lora_config: Mapping[str, Any] | None,
    keep: int,
    nccl: tuple[str, int, str],
) -> RemotePush:
    """The push of ``engine``'s ``transport`` (see the module docstring)."""
    if transport == "disk":
        return DiskPush(engine, api, weights_dir=weights_dir, keep=keep, model_dir=model_dir)
    if transport == "lora":
        config = dict(lora_config) if lora_config is not None else None
        return AdapterLoadPush(engine, api, weights_dir=weights_dir, keep=keep, lora_config=config)
    return BroadcastPush(engine, api, nccl=nccl)


@dataclass(frozen=True)
class Delivery:
    """Where one push goes and as what: ``targets`` (the replicas up now) through
    ``client``, each reached by ``each_alive`` (a replica lost on the way is handled as the
    engine handles it), as policy version ``new``."""

    client: httpx.AsyncClient
    each_alive: Each
    targets: list[Replica]
    new: int

    def each(self, call: Callable[[Replica], Awaitable[Any]]) -> Awaitable[list[Any]]:
        """``call`` on every target."""
        return self.each_alive(self.targets, call)


@dataclass(eq=False)
class RemotePush(WeightPush):
    """A push to remote servers by one transport (see the module docstring)."""

    api: ServerAPI
    #: The LoRA adapter calls name (:class:`AdapterLoadPush`, once one is pushed), else None.
    adapter: str | None = field(default=None, init=False)

    async def send(self, to: Delivery, state_dict: dict[str, Any]) -> None:
        """Send ``state_dict`` as version ``to.new`` to ``to.targets``."""
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the pushes hold (nothing but a broadcast group)."""


def _weights_dir(weights_dir: Path | None, transport: str) -> Path:
    """The folder a ``disk`` or ``lora`` push writes to; EngineFailed when none is set."""
    if weights_dir is None:
        raise EngineFailed(f"the {transport} transport needs engine.weights_dir")
    return weights_dir


@dataclass(eq=False)
class DiskPush(RemotePush):
    """The full weights as a model folder in ``weights_dir`` (the config files from
    ``model_dir``; the newest ``keep`` folders are kept)."""

    weights_dir: Path | None
    keep: int
    model_dir: Path | None

    async def send(self, to: Delivery, state_dict: dict[str, Any]) -> None:
        client, new = to.client, to.new
        root = _weights_dir(self.weights_dir, "disk")
        folder = root / f"v{new}"
        await asyncio.to_thread(save_full, state_dict, folder, self.model_dir)
        await to.each(lambda r: self.api.update_from_disk(client, r.url, str(folder), new))
        prune(root, "v", self.keep)


@dataclass(eq=False)
class AdapterLoadPush(RemotePush, AdapterPush):
    """The LoRA adapter as a peft folder in ``weights_dir`` (``lora_config``: the
    trainer's ``LoraConfig.to_dict()``), loaded in place under :data:`ADAPTER`."""

    weights_dir: Path | None
    keep: int
    lora_config: dict[str, Any] | None

    async def send(self, to: Delivery, state_dict: dict[str, Any]) -> None:
        client, new = to.client, to.new
        root = _weights_dir(self.weights_dir, "lora")
        if self.lora_config is None:
            raise EngineFailed("engine.transport=lora needs a LoRA trainer: set trainer.lora")
        folder = root / f"lora-v{new}"
        await asyncio.to_thread(save_adapter, state_dict, self.lora_config, folder)
        await to.each(lambda r: self.api.load_lora(client, r.url, ADAPTER, str(folder), new))
        self.adapter = ADAPTER
        prune(root, "lora-v", self.keep)


@dataclass(eq=False)
class BroadcastPush(RemotePush):
    """The full weights broadcast over a group the servers join (``nccl``: its address,
    port, 0 for a free one, and backend)."""

    nccl: tuple[str, int, str]
    _group: BroadcastGroup | None = field(default=None, init=False)
    _members: tuple[str, ...] = field(default=(), init=False)

    async def send(self, to: Delivery, state_dict: dict[str, Any]) -> None:
        client, new = to.client, to.new
        group = await self._group_of(to)
        metas, name = tensor_metas(state_dict), group.group_name
        await asyncio.gather(
            asyncio.to_thread(group.broadcast, state_dict),
            to.each(lambda r: self.api.update_from_nccl(
                client, r.url, metas, group_name=name, version=new
            )),
        )  # fmt: skip

    async def _group_of(self, to: Delivery) -> BroadcastGroup:
        """The broadcast group of ``to.targets`` (made anew when the replicas changed)."""
        client, targets = to.client, to.targets
        members = tuple(r.url for r in targets)
        if self._group is not None and members == self._members:
            return self._group
        self.close()
        address, port, backend = self.nccl
        port = port or _free_port(address)
        world = 1 + sum(r.ranks for r in targets)
        name = f"tether-weights-{uuid.uuid4().hex[:8]}"
        group = BroadcastGroup(
            address, port, world, backend=backend, group_name=name,
            prefix=self.api.group_prefix(name),
        )  # fmt: skip
        offsets, rank = {}, 1
        for r in targets:
            offsets[r.url], rank = rank, rank + r.ranks
        joins = to.each(lambda r: self.api.init_nccl(
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
