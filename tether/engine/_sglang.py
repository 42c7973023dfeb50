"""SGLang's native HTTP server as a tether engine: :class:`SGLangServer` (a ServerAPI).

Built against SGLang 0.5.6 and later (read at sgl-project/sglang main, mid-2026:
``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``,
``managers/tokenizer_manager.py``, ``sampling/sampling_params.py``,
``layers/sampler.py``). 0.5.6 is the floor: ``/pause_generation`` takes a ``mode``
from then on (earlier releases take no body) and ``sampling_seed`` exists. Verified
only against ``tests/fake_sglang.py``, not against a live server.

What the sources say and how this adapter uses it:

- ``POST /generate`` with ``input_ids``, ``sampling_params`` (a dict SGLang turns into
  its ``SamplingParams``: an unknown key fails the request), ``rid``,
  ``return_logprob``, ``top_logprobs_num``, ``lora_path`` (an adapter's name) and
  ``stream``. The answer has ``output_ids`` (through the stop token) and ``meta_info``:
  ``output_token_logprobs`` as ``[logprob, token_id, text]`` triples,
  ``output_top_logprobs``, ``finish_reason`` (``{"type": "stop", "matched": id or
  str}``, ``{"type": "length", ...}``, ``{"type": "abort", "message": ...}``, or null
  while running) and ``weight_version`` (a string label).
- Logprobs are ``log_softmax(logits / T)`` before top-k/top-p (T = 1 when greedy), what
  tether records, unless the server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``
  (then T = 1 always): do not set it. SGLang applies a grammar's token mask before its
  log-softmax, so with a constraint its logprobs are the masked distribution's.
- With ``ignore_eos`` SGLang ignores ``stop_token_ids`` too (tether: only they stop);
  a row that reaches ``max_new_tokens`` on a stop token ends ``"length"``.
- ``n > 1`` goes out as n requests (rids ``{request_id}#{i}``, seeds ``seed + i``):
  SGLang gives the copies of one parallel-sampling request fresh random rids (no abort
  by id) and one ``sampling_seed``. The seed only acts on a server started with
  ``--enable-deterministic-inference``, which seeds unseeded requests with 42, so an
  unseeded call gets a random seed per completion here.
- Streams must be cumulative (a server without ``--incremental-streaming-output``):
  each ``data:`` event holds all ids and logprobs so far; :meth:`SGLangServer.info`
  checks the flag. ``/abort_request`` ``{"rid"}`` ends a request with its partial tokens.
- Pause modes: tether's ``keep`` is SGLang's ``retract`` (running requests go back to
  the queue and are recomputed on the new weights), ``abort`` is ``abort``; ``wait``
  waits for this adapter's requests to the replica to finish, then pauses. Weight
  versions are strings; tether sends integers and reads ``"default"`` as 0.
- LoRA pushes load ``{name}-v{version}`` (``/load_lora_adapter``; a name loads once) and
  unload older ones when no call uses them (an unload waits for its calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import httpx

from tether.engine._protocol import (
    EngineFailed,
    GenerateResult,
    SamplingParams,
    UnsupportedParams,
)
from tether.engine._remote_http import check, sse_events
from tether.engine._server_api import (
    GroupJoin,
    PauseMode,
    ServerAPI,
    ServerCall,
    ServerInfo,
    TensorMeta,
    refuse_role_adapter,
)
from tether.engine._sglang_wire import NAME, Answer, request_bodies, rids_of, weight_version_of
from tether.engine._stream import TokenDelta

__all__ = ["SGLangServer"]

_PAUSE_MODES = {"keep": "retract", "abort": "abort", "wait": "retract"}


class SGLangServer(ServerAPI):
    """SGLang's native routes for one replica per call (see the module docstring)."""

    name = "sglang"
    shown = NAME
    transports = ("lora", "disk", "nccl")
    group_backends = ("nccl", "gloo")  # torch groups on both sides

    def __init__(self) -> None:
        self._live: dict[str, list[str]] = {}  # tether request id -> its SGLang rids
        self._busy: dict[str, int] = {}  # url -> requests in flight through this adapter
        self._idle: dict[str, asyncio.Event] = {}
        self._lora: dict[tuple[str, str], tuple[str, int]] = {}  # (url, name) -> loaded as, v
        self._lora_use: dict[tuple[str, str], int] = {}  # (url, loaded as) -> calls using it
        self._stale: dict[str, set[str]] = {}  # url -> adapters to unload once unused
        self._rng = random.Random()  # the seeds of unseeded calls

    # -- start-up and state ---------------------------------------------------------------

    async def info(self, client: httpx.AsyncClient, url: str) -> ServerInfo:
        models = check(await client.get(f"{url}/v1/models"), NAME)
        card = models["data"][0]
        server = check(await client.get(f"{url}/get_server_info"), NAME) or {}
        if server.get("incremental_streaming_output"):
            raise EngineFailed(
                f"{NAME} server at {url} streams incrementally; tether reads cumulative "
                "streams: start it without --incremental-streaming-output"
            )
        version = await self.weight_version(client, url)
        ranks = int(server.get("tp_size") or 1) * int(server.get("pp_size") or 1)
        return ServerInfo(str(card["id"]), card.get("max_model_len"), version, ranks)

    async def weight_version(self, client: httpx.AsyncClient, url: str) -> int:
        body = check(await client.get(f"{url}/get_weight_version"), NAME) or {}
        return weight_version_of(body.get("weight_version", "default"), url) or 0

    # -- generation ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _request(
        self, url: str, call: ServerCall
    ) -> AsyncIterator[tuple[list[str], str | None, int | None]]:
        """One tether request: its rids (known to :meth:`abort`, counted as busy), the
        adapter's loaded name and version (None: the base weights, or not loaded here)."""
        request_id, adapter = call.request_id, call.adapter
        rids = rids_of(request_id, call.params.n)
        loaded, version = self._lora.get((url, adapter or ""), (adapter, None))
        use = (url, loaded or "")
        self._live[request_id] = rids
        self._busy[url] = self._busy.get(url, 0) + 1
        self._lora_use[use] = self._lora_use.get(use, 0) + 1
        self._idle.setdefault(url, asyncio.Event()).clear()
        try:
            yield rids, loaded, version
        finally:
            self._live.pop(request_id, None)
            self._lora_use[use] -= 1
            self._busy[url] -= 1
            if not self._busy[url]:
                self._idle[url].set()

    async def _generate(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> GenerateResult:
        async with self._request(url, call) as (rids, lora, v):
            bodies = request_bodies(call.prompt_ids, call.params, rids, lora, self._rng)
            tasks = [asyncio.ensure_future(self._post(client, url, b)) for b in bodies]
            try:
                answers = await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._abort_rids(client, url, rids)
                raise
        return self._result(list(answers), call.params, v)

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Answer:
        out = check(await client.post(f"{url}/generate", json=body), NAME)
        answer = Answer()
        answer.update(out, url)
        return answer

    def _result(
        self, answers: list[Answer], params: SamplingParams, lora_version: int | None
    ) -> GenerateResult:
        """The answers as one result. A call on an adapter ran on it to the end (a call
        SGLang retracts keeps its adapter): the adapter's version is the policy's."""
        versions = [a.version for a in answers if a.version is not None]
        # an abort before prefill reports no version: -1, the engine records its own
        version = max(versions) if versions else -1
        version = version if lora_version is None else lora_version
        comps = [a.completion(params.top_logprobs) for a in answers]
        return GenerateResult(comps, version, {"engine": "sglang"})

    async def _stream(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        async with self._request(url, call) as (rids, lora, v):
            queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
            answers = [Answer() for _ in rids]
            bodies = request_bodies(call.prompt_ids, call.params, rids, lora, self._rng)
            tasks = [
                asyncio.ensure_future(self._pump(client, url, {**b, "stream": True}, i, queue))
                for i, b in enumerate(bodies)
            ]
            try:
                running = len(tasks)
                while running:
                    i, item = await queue.get()
                    if isinstance(item, BaseException):
                        raise item
                    if item is None:  # that request's stream ended
                        running -= 1
                        continue
                    new = answers[i].update(item, url)
                    for delta in answers[i].deltas(i, new):
                        yield delta
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if any(a.finish is None for a in answers):
                    await self._abort_rids(client, url, rids)
        yield self._result(answers, call.params, v)

    async def _pump(
        self,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        index: int,
        queue: asyncio.Queue[tuple[int, Any]],
    ) -> None:
        """Put each ``data:`` event of one streamed request on ``queue``, then None."""
        try:
            async with client.stream("POST", f"{url}/generate", json=body) as resp:
                async for event in sse_events(resp, NAME):
                    if "error" in event:
                        message = (event["error"] or {}).get("message", event["error"])
                        raise EngineFailed(f"{NAME} server at {url} failed the request: {message}")
                    queue.put_nowait((index, event))
        except Exception as exc:
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    async def abort(self, client: httpx.AsyncClient, url: str, request_id: str) -> None:
        await self._abort_rids(client, url, self._live.get(request_id, []))

    async def _abort_rids(self, client: httpx.AsyncClient, url: str, rids: list[str]) -> None:
        with contextlib.suppress(httpx.HTTPError):
            for rid in rids:
                await client.post(f"{url}/abort_request", json={"rid": rid})

    # -- pause, resume, cache -----------------------------------------------------------

    async def pause(self, client: httpx.AsyncClient, url: str, mode: PauseMode) -> None:
        if mode == "wait" and self._busy.get(url):
            await self._idle[url].wait()
        await self._update(client, url, "pause_generation", {"mode": _PAUSE_MODES[mode]})

    async def resume(self, client: httpx.AsyncClient, url: str) -> None:
        await self._update(client, url, "continue_generation", {})

    async def flush_cache(self, client: httpx.AsyncClient, url: str) -> None:
        resp = await client.post(f"{url}/flush_cache")
        if not resp.is_success:  # a 200 answer is plain text, not JSON
            check(resp, NAME)

    # -- weights ------------------------------------------------------------------------

    async def _update(
        self, client: httpx.AsyncClient, url: str, route: str, body: dict[str, Any]
    ) -> None:
        resp = await client.post(f"{url}/{route}", json=body)
        with contextlib.suppress(ValueError):
            out = resp.json()
            if isinstance(out, dict) and out.get("success") is False:
                message = out.get("error_message") or out.get("message") or "failed"
                raise EngineFailed(f"{NAME} server at {url} failed /{route}: {message}")
        check(resp, NAME)

    async def load_lora(
        self, client: httpx.AsyncClient, url: str, name: str, path: str, version: int
    ) -> None:
        """Load ``path`` as ``{name}-v{version}``; calls naming ``name`` use the newest.
        Older ones are unloaded once no call uses them: SGLang's unload waits for the
        calls on an adapter (and blocks every LoRA load meanwhile), and calls kept over a
        push by ``keep`` finish on the adapter they began with."""
        stale = self._stale.setdefault(url, set())
        for old in [o for o in stale if not self._lora_use.get((url, o))]:
            with contextlib.suppress(EngineFailed):
                await self._update(client, url, "unload_lora_adapter", {"lora_name": old})
            stale.discard(old)
        loaded = f"{name}-v{version}"
        body = {"lora_name": loaded, "lora_path": path}
        await self._update(client, url, "load_lora_adapter", body)
        body = {"new_version": str(version), "abort_all_requests": False}
        await self._update(client, url, "update_weight_version", body)
        previous = self._lora.get((url, name))
        self._lora[(url, name)] = (loaded, version)
        if previous is not None and previous[0] != loaded:
            stale.add(previous[0])

    async def update_from_disk(
        self, client: httpx.AsyncClient, url: str, path: str, version: int
    ) -> None:
        body = {"model_path": path, "weight_version": str(version)}
        await self._update(client, url, "update_weights_from_disk", body)

    async def init_nccl(self, client: httpx.AsyncClient, url: str, join: GroupJoin) -> None:
        body = dataclasses.asdict(join)  # SGLang's field names are GroupJoin's
        await self._update(client, url, "init_weights_update_group", body)

    def check_params(self, params: SamplingParams) -> None:
        """SGLang's logprobs are tether's (before top-k/top-p); what it cannot do is stop
        on ``stop_token_ids`` under ``ignore_eos`` (it ignores both)."""
        refuse_role_adapter(params)
        if params.ignore_eos and params.stop_token_ids:
            raise UnsupportedParams(
                "ignore_eos with stop_token_ids cannot be served by SGLang: with ignore_eos "
                "it ignores stop_token_ids too; drop one of them",
                param="ignore_eos",
            )

    def group_prefix(self, group_name: str) -> str | None:
        """SGLang builds its side of the group on a store prefixed by the group name
        (``init_custom_process_group`` → torch's ``_new_process_group_helper``)."""
        return f"{group_name}/"

    async def update_from_nccl(
        self,
        client: httpx.AsyncClient,
        url: str,
        tensors: Sequence[TensorMeta],
        *,
        group_name: str,
        version: int,
    ) -> None:
        body: dict[str, Any] = {"group_name": group_name, "weight_version": str(version)}
        body.update(names=[t.name for t in tensors], dtypes=[t.dtype for t in tensors])
        body["shapes"] = [list(t.shape) for t in tensors]
        await self._update(client, url, "update_weights_from_distributed", body)
