"""The remote engine: vLLM or SGLang servers behind tether's :class:`Engine` contract.

The gateway still owns the chat template and tokenization: :class:`RemoteEngine` sends
token ids to a server and gets token ids and the sampled tokens' logprobs back, through
a :class:`~tether.engine._server_api.ServerAPI` that speaks one server's routes
(``_vllm.py``, ``_sglang.py``). What every server shares lives here:

- **replicas** (``_replicas.py``): a call goes to the replica its rollout hashes to; a
  replica that cannot be reached is left out until a health check finds it up again,
  with the engine's current weights (a replica that missed a push stays out);
- **no replica up** (:meth:`RemoteEngine.outage`): calls and weight pushes wait for the
  health checks (every ``health_interval_s``) to find one back, for a grace period of
  ``lost_after_s`` (default :data:`LOST_AFTER_S`, at least three health checks): a
  server that restarts or a network that blips costs a wait, not failed rollouts. Past
  it the engine is lost: every call fails at once with ``EngineLost`` naming the
  servers and why they went away, and a training run stops (``tether/run/_watch.py``);
- **errors**: a transport fault is ``EngineFailed("cannot reach the vLLM server at
  URL: ...")``, a read past ``timeout_s`` is ``EngineTimeout``, an error answer is
  ``EngineFailed`` with the server's message;
- **a weight push** (:meth:`RemoteEngine.update_weights`): hold new calls, pause every
  reachable replica (``pause_mode``: ``wait`` lets calls in flight finish first), push
  by the ``transport``'s push object (``_remote_push.py``: a safetensors folder, a LoRA
  adapter folder, or a broadcast), check that every replica reports the new version,
  flush the prefix caches, and only then resume them all and admit calls again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tether.engine._protocol import (
    Engine,
    EngineError,
    EngineFailed,
    EngineTimeout,
    EngineUnreachable,
    GenerateResult,
    Outage,
    SamplingParams,
)
from tether.engine._remote_push import Delivery, RemotePush, remote_push
from tether.engine._replicas import Replica, ReplicaSet, cause
from tether.engine._server_api import PauseMode, ServerAPI, Transport
from tether.engine._stream import TokenDelta

__all__ = ["RemoteEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a health check waits for a replica's answer before leaving it as it was.
HEALTH_TIMEOUT_S = 10.0
#: Seconds with no replica up after which the engine is lost (see the module docstring):
#: long enough for a blip, short enough that a run whose only server died stops soon.
LOST_AFTER_S = 30.0


class RemoteEngine(Engine):
    """Serve through inference servers (see the module docstring); build it with
    :meth:`connect`, which checks every replica first.

    ``weights_dir`` is a folder the servers can read (``disk`` and ``lora``);
    ``model_dir`` the model folder whose config files go beside pushed full weights;
    ``lora_config`` the trainer's ``LoraConfig.to_dict()`` (``lora``). With no replica
    up, the engine waits ``lost_after_s`` (at least three ``health_interval_s``) for one
    to come back before it is lost (:meth:`outage`).
    """

    supports_constraints = True

    def __init__(
        self,
        api: ServerAPI,
        urls: list[str],
        *,
        transport: Transport = "disk",
        weights_dir: str | os.PathLike[str] | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        lora_config: Mapping[str, Any] | None = None,
        keep_weights: int = 2,
        nccl: tuple[str, int, str] = ("127.0.0.1", 0, "nccl"),
        api_key: str | None = None,
        timeout_s: float = 600.0,
        health_interval_s: float = 5.0,
        lost_after_s: float = LOST_AFTER_S,
        pause_mode: PauseMode = "wait",
        http_transport: httpx.AsyncBaseTransport | None = None,
    ):
        if transport not in api.transports:
            raise EngineFailed(
                f"the {api.shown} adapter has no {transport!r} transport; "
                f"engine.transport must be one of {', '.join(api.transports)}"
            )
        if transport == "nccl" and nccl[2] not in api.group_backends:
            raise EngineFailed(
                f"engine.transport=nccl with engine.nccl_backend={nccl[2]} is not supported for "
                f"{api.shown}: tether's trainer cannot join its NCCL group "
                "yet; use engine.transport=lora (docs/engines.md)"
            )
        self.api, self.replicas, self.transport = api, ReplicaSet(urls), transport
        self.shown = api.shown
        self._pusher = remote_push(
            self,
            api,
            transport,
            weights_dir=Path(weights_dir) if weights_dir is not None else None,
            model_dir=Path(model_dir) if model_dir is not None else None,
            lora_config=lora_config,
            keep=keep_weights,
            nccl=nccl,
        )
        self.pause_mode: PauseMode = pause_mode
        self.timeout_s, self.health_interval_s = timeout_s, health_interval_s
        self.grace_s = max(lost_after_s, 3 * health_interval_s)
        key = api_key or os.environ.get("TETHER_ENGINE_API_KEY")
        self._client_args: dict[str, Any] = {
            "timeout": httpx.Timeout(timeout_s, connect=10.0),
            "headers": {"Authorization": f"Bearer {key}"} if key else None,
            "transport": http_transport,
        }
        self._client = httpx.AsyncClient(**self._client_args)
        self._push_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._started = False
        self._version = 0
        self._health: asyncio.Task[None] | None = None
        self.model: str | None = None
        self.max_positions = None

    @classmethod
    async def connect(cls, api: ServerAPI, urls: list[str], **kwargs: Any) -> RemoteEngine:
        """Build the engine and check every replica (EngineFailed naming the one that fails)."""
        engine = cls(api, urls, **kwargs)
        try:
            await engine.start()
        except BaseException:
            await engine.close()
            raise
        return engine

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter calls name (``lora`` transport, once one is pushed), else None."""
        return self._pusher.adapter

    @property
    def policy_version(self) -> int:
        return self._version

    # -- start-up and health ----------------------------------------------------------

    async def start(self) -> None:
        """Check every replica (model, version, context length) and start the health
        checks; the first call does it when :meth:`connect` did not."""
        if self._started:  # every call comes here: no lock once started
            return
        async with self._start_lock:
            if not self._started:
                await self._start()
                self._started = True

    async def _start(self) -> None:
        infos = await asyncio.gather(
            *(self._on(r, self.api.info(self._client, r.url)) for r in self.replicas)
        )
        models = {i.model for i in infos}
        if len(models) > 1:
            raise EngineFailed(
                f"the {self.shown} servers serve different models ({', '.join(sorted(models))}): "
                "start every replica with the same model"
            )
        versions = {r.url: i.weight_version for r, i in zip(self.replicas, infos, strict=True)}
        if len(set(versions.values())) > 1:
            raise EngineFailed(
                f"the {self.shown} servers report different weight versions {versions}: "
                "restart them from the same weights"
            )
        self.model = models.pop()
        self._version = infos[0].weight_version
        for r, i in zip(self.replicas, infos, strict=True):
            r.ranks = i.ranks
        lengths = [i.max_positions for i in infos if i.max_positions]
        self.max_positions = min(lengths) if lengths else None
        self._health = asyncio.create_task(self._health_loop())

    async def handover(self) -> None:
        """Let the engine be used from another event loop (``tether serve`` checks the
        servers on its loading thread): the HTTP client and the health checks start
        again on the loop of the next call, which checks the servers once more."""
        if self._health is not None:
            self._health.cancel()
            self._health = None
        await self._client.aclose()
        self._client = httpx.AsyncClient(**self._client_args)
        self._start_lock, self._push_lock = asyncio.Lock(), asyncio.Lock()
        self._started = False

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()

    async def _versions(self, timeout_s: float) -> dict[str, int | BaseException]:
        """Every replica's weight version now, or what asking it raised, asked at once."""
        got = await asyncio.gather(
            *(asyncio.wait_for(self.api.weight_version(self._client, r.url), timeout_s)
              for r in self.replicas),
            return_exceptions=True,
        )  # fmt: skip
        return {r.url: v for r, v in zip(self.replicas, got, strict=True)}

    async def check_health(self) -> None:
        """Ask every replica its weight version: one that answers with the engine's
        version is up; one that cannot be reached, or serves other weights (it missed a
        push), is left out. A slow answer (past :data:`HEALTH_TIMEOUT_S`, a busy server)
        changes nothing."""
        if self._push_lock.locked():
            return  # versions move during a push
        versions = await self._versions(HEALTH_TIMEOUT_S)
        for r in self.replicas:
            version = versions[r.url]
            if isinstance(version, asyncio.TimeoutError | httpx.TimeoutException):
                log.debug("health check of %s timed out; left as it was", r.url)
            elif isinstance(version, BaseException):  # refused, reset, an error answer
                self.replicas.mark_down(r, cause(version))
            elif version == self._version:
                self.replicas.mark_up(r)
            else:
                self.replicas.mark_down(r, f"serves weights v{version}, not v{self._version}")

    async def outage(self) -> Outage | None:
        """None while a replica is up; else which servers went away and why, lost once
        none has come back for the grace period (see the module docstring). An engine
        not started on this event loop (``tether serve`` after :meth:`handover`) checks
        its servers first (for at most :data:`HEALTH_TIMEOUT_S`)."""
        if not self._started and not self.gate.closed:
            # one that cannot be reached is marked down; a hung one leaves it as it was
            with contextlib.suppress(EngineError, asyncio.TimeoutError):
                await asyncio.wait_for(self.start(), HEALTH_TIMEOUT_S)
        return self.replicas.outage(self.shown, self.grace_s)

    async def _until_live(self) -> None:
        """Return once a replica is up: while none is, wait for the health checks to find
        one back, up to the grace period; then :class:`EngineLost`."""
        while not self.replicas.live():
            self._raise_if_lost()
            await asyncio.sleep(min(self.health_interval_s, 1.0))

    def _raise_if_lost(self) -> None:
        """:class:`EngineLost` once no replica has come back for the grace period."""
        outage = self.replicas.outage(self.shown, self.grace_s)
        if outage is not None and outage.lost:
            raise outage.error()

    # -- generation --------------------------------------------------------------------

    async def _on(self, replica: Replica, call: Awaitable[T]) -> T:
        """Await ``call`` to ``replica``, mapping transport faults (see the module docstring)."""
        try:
            return await call
        except httpx.TimeoutException as exc:
            raise EngineTimeout(
                f"the {self.shown} server at {replica.url} did not answer within {self.timeout_s:g} s"
            ) from exc
        except httpx.TransportError as exc:
            self.replicas.mark_down(replica, cause(exc))
            raise EngineUnreachable(
                f"cannot reach the {self.shown} server at {replica.url}: {exc or type(exc).__name__}"
            ) from exc

    def check_params(self, params: SamplingParams) -> None:
        """UnsupportedParams for what the servers cannot serve exactly (the gateway asks
        before the call is admitted, and answers 400)."""
        self.api.check_params(params)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        await self.start()
        await self._until_live()
        async with self.gate.admit():
            replica = self.replicas.pick(params.affinity)
            request_id = f"tether-{uuid.uuid4().hex}"
            replica.in_flight += 1
            try:
                call = self.api.generate(
                    self._client, replica.url, prompt_ids, params,
                    request_id=request_id, adapter=self._pusher.adapter,
                )  # fmt: skip
                result = await self._on(replica, call)
            except asyncio.CancelledError:
                self._abort_later(replica, request_id)
                raise
            finally:
                replica.in_flight -= 1
        return self._versioned(result)

    async def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        await self.start()
        await self._until_live()
        async with self.gate.admit():
            replica = self.replicas.pick(params.affinity)
            request_id = f"tether-{uuid.uuid4().hex}"
            stream = self.api.stream(
                self._client, replica.url, prompt_ids, params,
                request_id=request_id, adapter=self._pusher.adapter,
            )  # fmt: skip
            replica.in_flight += 1
            done = False
            try:
                while True:
                    try:
                        item = await self._on(replica, anext(stream))
                    except StopAsyncIteration:
                        break
                    if isinstance(item, GenerateResult):
                        done = True
                        item = self._versioned(item)
                    yield item
            finally:
                replica.in_flight -= 1
                await stream.aclose()
                if not done:  # closed early: the server must stop generating it
                    self._abort_later(replica, request_id)

    def _versioned(self, result: GenerateResult) -> GenerateResult:
        if result.policy_version < 0:  # the server does not say: the version it serves
            result.policy_version = self._version
        return result

    def _abort_later(self, replica: Replica, request_id: str) -> None:
        async def abort() -> None:
            try:
                await self.api.abort(self._client, replica.url, request_id)
            except Exception as exc:  # best effort: the server also aborts on disconnect
                log.debug("abort of %s on %s failed: %r", request_id, replica.url, exc)

        asyncio.get_running_loop().create_task(abort())

    # -- pause and weights -------------------------------------------------------------

    async def _each(self, replicas: list[Replica], make: Any) -> list[Any]:
        """``make(replica)`` for every replica at once, transport faults mapped."""
        return await asyncio.gather(*(self._on(r, make(r)) for r in replicas))

    async def _each_alive(self, targets: list[Replica], make: Any) -> list[Any]:
        """:meth:`_each` over a push's ``targets``, where a replica that cannot be reached
        is dropped from ``targets`` (in place; it is marked down and catches up at a later
        push) rather than failing the push; EngineUnreachable when none is left."""
        done = await asyncio.gather(
            *(self._on(r, make(r)) for r in targets), return_exceptions=True
        )
        for r, d in zip(list(targets), done, strict=True):
            if isinstance(d, EngineUnreachable):
                log.warning("%s left out of the weight push: %s", r.url, d)
                targets.remove(r)
            elif isinstance(d, BaseException):
                raise d
        if not targets:
            raise EngineUnreachable(f"no {self.shown} server was left for the weight push")
        return [d for d in done if not isinstance(d, BaseException)]

    async def pause(self) -> None:
        await self.start()
        await self.gate.pause()
        await self._each(
            self.replicas.live(), lambda r: self.api.pause(self._client, r.url, "wait")
        )

    async def resume(self) -> None:
        await self._each(self.replicas.live(), lambda r: self.api.resume(self._client, r.url))
        self.gate.resume()

    @property
    def weight_push(self) -> RemotePush:
        """The push of the engine's transport (``_remote_push.py``, built once): the LoRA
        adapter's weights on ``lora``, else the full merged ones."""
        return self._pusher

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        """Push ``state_dict`` (full weights, or the adapter's on ``lora``) to
        every reachable replica; returns the new version, which each replica reports."""
        await self.start()
        new = self._version + 1 if version is None else int(version)
        drain = self.pause_mode == "wait"
        async with self._push_lock, self.gate.paused_for_update(drain=drain):
            targets = await self._reachable()
            try:
                await self._each_alive(
                    targets, lambda r: self.api.pause(self._client, r.url, self.pause_mode)
                )
                await self._pusher.send(
                    Delivery(self._client, self._each_alive, targets, new), state_dict
                )
                await self._check_versions(targets, new)
                await self._each_alive(targets, lambda r: self.api.flush_cache(self._client, r.url))
                self._version = new
                for r in targets:
                    self.replicas.mark_up(r)
            finally:  # every replica has the weights (or the push failed) before any resumes
                await asyncio.gather(
                    *(self.api.resume(self._client, r.url) for r in targets), return_exceptions=True
                )
        log.info(
            "pushed weights v%d to %d %s server(s) by %s",
            new,
            len(targets),
            self.shown,
            self.transport,
        )
        return new

    async def _reachable(self) -> list[Replica]:
        """The replicas that answer now (down ones are asked again: they may be back).
        While none does, asked again every health interval, up to the grace period; then
        :class:`EngineLost`."""
        while True:
            versions = await self._versions(HEALTH_TIMEOUT_S)
            out = []
            for r in self.replicas:
                version = versions[r.url]
                if isinstance(version, BaseException):
                    self.replicas.mark_down(r, cause(version))
                else:
                    out.append(r)
            if out:
                return out
            self._raise_if_lost()
            await asyncio.sleep(self.health_interval_s)

    async def _check_versions(self, targets: list[Replica], new: int) -> None:
        got = await self._each_alive(
            targets, lambda r: self.api.weight_version(self._client, r.url)
        )
        wrong = {r.url: v for r, v in zip(targets, got, strict=True) if v != new}
        if wrong:
            raise EngineFailed(
                f"after pushing weights v{new} the {self.shown} server(s) report {wrong}: "
                "the push did not take; see the servers' logs"
            )

    async def close(self) -> None:
        self.gate.close()
        if self._health is not None:
            self._health.cancel()
            self._health = None
        self._pusher.close()
        await self._client.aclose()
