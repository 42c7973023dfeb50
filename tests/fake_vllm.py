"""A FAKE vLLM server for tests: ``python -m tests.fake_vllm --model DIR --port 0``.

Not vLLM: it serves tether's embedded engine (:mod:`tests.fake_backend`) behind the
routes and JSON shapes of vLLM's OpenAI server as of vLLM 0.32 (checked against the real
CPU build by ``make test-vllm``: where the two disagreed, the fake was fixed), read from
vllm-project/vllm: ``vllm/entrypoints/openai/completion/protocol.py`` (CompletionRequest,
CompletionResponse, CompletionStreamResponse, CompletionLogProbs),
``vllm/entrypoints/serve/dev/rlhf/api_router.py`` (``/pause``, ``/resume``,
``/is_paused``, ``/abort_requests``, ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``,
``/update_weight_version``, ``/weight_info``, ``/get_world_size``),
``vllm/distributed/weight_transfer/nccl_engine.py`` (init and update infos; released vLLM
has no disk backend), ``/collective_rpc`` with ``reload_weights(weights_path=...)`` (the
in-place reload from a folder), ``vllm/frontend/entrypoints/serve/dev/cache/api_router.py``
(``/reset_prefix_cache``), ``.../serve/lora/api_router.py`` (``/v1/load_lora_adapter``),
``.../instrumentator/server_info.py`` (``/server_info``), ``.../instrumentator/basic.py``
(``/load``).

Faithful to: the request fields vLLM's CompletionRequest defines (any other field is a
400 here, where vLLM would only log it: so a misspelt field fails a test); the response
fields; ``{"error": {...}}`` errors; dev-mode routes only with ``VLLM_SERVER_DEV_MODE=1``
and LoRA loading only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` and ``--enable-lora``;
``--logprobs-mode`` (default ``raw_logprobs``, as vLLM) shown in ``/server_info``; the
weight version, a string label starting at ``"default"``; one weight-transfer backend per
server (``--weight-transfer-config '{"backend": "nccl"}'``); ``/server_info``'s device
(``cpu``) and ``--[no-]enable-chunked-prefill`` (on by default, as vLLM); a reload whose
folder lacks ``lm_head.weight`` of a tied model is an error here (vLLM's CPU build keeps
the old head without a word).

Not done: text prompts, beam search, top-k/min-p/penalties other than neutral (400,
"not implemented by the fake"), a sampling field left out (400 here: vLLM would take it
from the model's generation_config), top_p < 1 under processed logprobs and temperatures
other than 0 and 1 under raw logprobs (the fake cannot compute those values: 400); the
NCCL group is gloo on a ``TCPStore`` (vLLM builds a ``StatelessProcessGroup`` with
PyNccl); one LoRA adapter is served at a time, merged into the weights; a constrained
token's logprob is the unconstrained one (vLLM masks the logits first, so its value is
renormalised over the allowed tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.fake_backend import FakeBackend, FakeError, serve_app
from tether.engine import Constraint, SamplingParams
from tether.engine._protocol import GenerateResult
from tether.engine._stream import TokenDelta

VERSION = "0.32.0"

#: The fields of vLLM's CompletionRequest (0.28-0.29).
# fmt: off
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
    "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
    "temperature", "top_p", "user", "use_beam_search", "top_k", "min_p",
    "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "truncation_side", "allowed_token_ids", "prompt_logprobs",
    "logprob_token_ids", "bad_words", "prompt_embeds", "add_special_tokens",
    "response_format", "structured_outputs", "priority", "request_id", "session_id",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs",
})
#: Those the fake honours; the others are refused as not implemented.
HONOURED = frozenset({
    "model", "prompt", "logprobs", "max_tokens", "n", "presence_penalty",
    "frequency_penalty", "seed", "stop", "stream", "stream_options", "temperature", "top_p",
    "user", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "structured_outputs", "request_id",
    "return_tokens_as_token_ids", "return_token_ids",
})
# fmt: on
#: Sampling fields vLLM fills from generation_config when absent, and their neutral values.
NEUTRAL = {"top_k": (0, -1), "min_p": (0.0,), "repetition_penalty": (1.0,)}
NEUTRAL |= {"presence_penalty": (0.0,), "frequency_penalty": (0.0,)}
# fmt: off
STRUCTURED_FIELDS = frozenset({
    "json", "regex", "choice", "grammar", "json_object", "disable_fallback",
    "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
    "structural_tag",
})
# fmt: on
_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error(message: str, status: int = 400) -> JSONResponse:
    body = {"message": message, "type": _TYPES.get(status, "Error"), "param": None}
    return JSONResponse({"error": {**body, "code": status}}, status_code=status)


class FakeVLLM:
    """The server's state: the backend, its names, its flags."""

    def __init__(self, args: argparse.Namespace):
        self.backend = FakeBackend(args.model, seed=args.seed)
        self.model_path = args.model
        self.name = args.served_model_name or args.model
        self.logprobs_mode = args.logprobs_mode
        self.max_logprobs = args.max_logprobs
        self.enable_lora = args.enable_lora
        self.transfer = json.loads(args.weight_transfer_config or "null")
        self.chunked_prefill = args.enable_chunked_prefill
        self.load_tracking = args.enable_server_load_tracking
        self.max_len = self.backend.max_positions or 2048
        self.version = "default"
        self.session = False  # between start_weight_update and finish_weight_update
        self.received = False

    # -- requests ----------------------------------------------------------------------

    def params(self, body: dict[str, Any]) -> SamplingParams:
        """The sampling params of a CompletionRequest body; FakeError for what vLLM (or
        the fake) refuses."""
        unknown = sorted(set(body) - COMPLETION_FIELDS)
        if unknown:
            raise FakeError(f"fake_vllm: {unknown} are not fields of vLLM's CompletionRequest")
        todo = sorted(set(body) - HONOURED)
        if todo:
            raise FakeError(f"fake_vllm: {todo} are not implemented by the fake")
        for name in ("temperature", "top_p", *NEUTRAL):
            if body.get(name) is None:
                raise FakeError(
                    f"fake_vllm: `{name}` missing: vLLM would take it from generation_config"
                )
        for name, ok in NEUTRAL.items():
            if body[name] not in ok:
                raise FakeError(f"fake_vllm: {name}={body[name]} is not implemented")
        if body.get("min_tokens", 0):
            raise FakeError("fake_vllm: min_tokens is not implemented")
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise FakeError("fake_vllm: only a token-id prompt (a list of ints) is implemented")
        return self._sampling(body, prompt)

    def _sampling(self, body: dict[str, Any], prompt: list[int]) -> SamplingParams:
        t, top_p = float(body["temperature"]), float(body["top_p"])
        if self.logprobs_mode == "processed_logprobs" and top_p < 1:
            raise FakeError("fake_vllm: top_p < 1 under processed_logprobs is not implemented")
        if self.logprobs_mode == "raw_logprobs" and t not in (0.0, 1.0):
            raise FakeError("fake_vllm: temperature not 0 or 1 under raw_logprobs")
        k = body.get("logprobs")
        if k is not None and k > self.max_logprobs:
            raise FakeError(
                f"Requested sample logprobs of {k}, which is greater than max allowed: "
                f"{self.max_logprobs}"
            )
        max_tokens = body.get("max_tokens") or 16
        if len(prompt) + max_tokens > self.max_len:
            raise FakeError(
                f"This model's maximum context length is {self.max_len} tokens. However, you "
                f"requested {max_tokens} output tokens and your prompt contains {len(prompt)} "
                f"input tokens, for a total of {len(prompt) + max_tokens} tokens."
            )
        stop = body.get("stop") or []
        constraint = None
        so = body.get("structured_outputs")
        if so is not None:
            bad = sorted(set(so) - STRUCTURED_FIELDS)
            if bad:
                raise FakeError(f"fake_vllm: {bad} are not fields of StructuredOutputsParams")
            if set(so) != {"structural_tag"}:
                raise FakeError("fake_vllm: only structured_outputs.structural_tag is implemented")
            constraint = Constraint(str(so["structural_tag"]))
        try:
            return SamplingParams(
                temperature=t,
                top_p=top_p,
                max_tokens=max_tokens,
                n=int(body.get("n", 1)),
                stop=(stop,) if isinstance(stop, str) else tuple(stop),
                stop_token_ids=tuple(body.get("stop_token_ids") or ()),
                seed=body.get("seed"),
                top_logprobs=int(k or 0),
                ignore_eos=bool(body.get("ignore_eos", False)),
                constraint=constraint,
            )
        except ValueError as exc:
            raise FakeError(str(exc)) from exc

    def check_model(self, model: str | None) -> None:
        b = self.backend
        if model is None or model == self.name:
            if b.active_adapter is not None:
                raise FakeError(f"fake_vllm: serves adapter {b.active_adapter!r} now, not the base")
            return
        if model not in b.adapters:
            raise FakeError(f"The model `{model}` does not exist.", 404)
        if model != b.active_adapter:
            raise FakeError(f"fake_vllm: one adapter at a time ({b.active_adapter!r} is active)")

    def set_version(self, label: str) -> None:
        self.version = str(label)
        if self.version.isdigit():
            self.backend.version = int(self.version)

    # -- responses ---------------------------------------------------------------------

    def token(self, tok: int, as_ids: bool) -> str:
        return f"token_id:{tok}" if as_ids else self.backend.tokenizer.decode([tok])

    def logprobs(self, body: dict[str, Any], deltas: list[TokenDelta]) -> dict[str, Any] | None:
        if body.get("logprobs") is None:
            return None
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tops = []
        for d in deltas:
            top = {self.token(t, as_ids): lp for t, lp in (d.top_logprobs or {}).items()}
            top[self.token(d.token_id, as_ids)] = d.logprob  # vLLM adds the sampled token
            tops.append(top)
        return {
            "text_offset": [0] * len(deltas),
            "token_logprobs": [d.logprob for d in deltas],
            "tokens": [self.token(d.token_id, as_ids) for d in deltas],
            "top_logprobs": tops,
        }

    def choice(
        self, body: dict[str, Any], index: int, deltas: list[TokenDelta], finish: str | None
    ) -> dict[str, Any]:
        ids = [d.token_id for d in deltas]
        skip = bool(body.get("skip_special_tokens", True))
        stop_ids = body.get("stop_token_ids") or []
        return {
            "index": index,
            "text": self.backend.tokenizer.decode(ids, skip_special_tokens=skip),
            "logprobs": self.logprobs(body, deltas),
            "finish_reason": finish,
            "stop_reason": ids[-1] if finish == "stop" and ids and ids[-1] in stop_ids else None,
            "token_ids": ids if body.get("return_token_ids") else None,
        }

    def completion(self, body: dict[str, Any], rid: str, result: GenerateResult) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(result.completions):
            tops = c.top_logprobs or [None] * len(c.token_ids)
            deltas = [
                TokenDelta(i, t, lp, top)
                for t, lp, top in zip(c.token_ids, c.logprobs, tops, strict=True)
            ]
            ch = self.choice(body, i, deltas, c.finish_reason)
            ch |= {"prompt_logprobs": None, "prompt_token_ids": None}
            if body.get("return_token_ids"):
                ch["prompt_token_ids"] = body["prompt"]
            choices.append(ch)
        out_tokens = sum(len(c.token_ids) for c in result.completions)
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self.usage(body, out_tokens),
            "kv_transfer_params": None,
        }

    def usage(self, body: dict[str, Any], out_tokens: int) -> dict[str, Any]:
        n_in = len(body["prompt"])
        return {"prompt_tokens": n_in, "completion_tokens": out_tokens,
                "total_tokens": n_in + out_tokens, "prompt_tokens_details": None}  # fmt: skip


def build_app(state: FakeVLLM) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(FakeError)
    async def _fake_error(_: Request, exc: FakeError) -> JSONResponse:
        return error(str(exc), exc.status)

    openai_routes(app, state)
    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
        dev_routes(app, state)
        transfer_routes(app, state)
        rpc_routes(app, state)
    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"):
        lora_routes(app, state)
    return app


def openai_routes(app: FastAPI, state: FakeVLLM) -> None:
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/load")
    async def load() -> dict[str, int]:
        """Requests in flight, held ones too (0 without --enable-server-load-tracking)."""
        return {"server_load": len(state.backend.jobs) if state.load_tracking else 0}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        card = {"object": "model", "created": now, "owned_by": "vllm", "permission": []}
        data = [card | {"id": state.name, "root": state.model_path, "parent": None,
                        "max_model_len": state.max_len}]  # fmt: skip
        for name, path in state.backend.adapters.items():
            data.append(card | {"id": name, "root": path, "parent": state.name})
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            raise FakeError("Invalid JSON") from None
        if not isinstance(body, dict):
            raise FakeError("the request body must be a JSON object")
        params = state.params(body)
        state.check_model(body.get("model"))
        rid = str(body.get("request_id") or f"fake-{time.monotonic_ns()}")
        job = state.backend.start(rid, body["prompt"], params)
        if body.get("stream"):
            return stream_chunks(state, body, rid, job)
        result = None
        async for item in state.backend.events(job):
            result = item
        assert isinstance(result, GenerateResult)
        return state.completion(body, rid, result)


def dev_routes(app: FastAPI, state: FakeVLLM) -> None:
    b = state.backend

    @app.post("/pause")
    async def pause(mode: str = "abort", clear_cache: bool = True) -> JSONResponse:
        if mode not in ("abort", "wait", "keep"):
            return JSONResponse({"error": f"invalid pause mode {mode!r}"}, status_code=400)
        await b.pause(mode)
        if clear_cache and mode != "keep":
            await b.flush_cache()
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume() -> JSONResponse:
        await b.resume()
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": b.paused}

    @app.post("/abort_requests")
    async def abort_requests(request: Request) -> dict[str, Any]:
        ids = (await request.json()).get("request_ids") or list(b.jobs)
        for rid in ids:
            b.abort(rid)
        return {"status": "aborted", "aborted": len(ids)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(
        reset_running_requests: bool = False, reset_external: bool = False
    ) -> dict[str, bool]:
        await b.flush_cache()
        return {"success": True}

    @app.get("/server_info")
    async def server_info(config_format: str = "text") -> dict[str, Any]:
        config = {"model_config": {"model": state.model_path, "max_model_len": state.max_len,
                                   "logprobs_mode": state.logprobs_mode},
                  "scheduler_config": {"enable_chunked_prefill": state.chunked_prefill},
                  "device_config": {"device": "cpu"},
                  "weight_transfer_config": state.transfer}  # fmt: skip
        text = config if config_format == "json" else json.dumps(config)
        return {"vllm_config": text, "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"}, "system_env": {}}

    @app.get("/get_world_size")
    async def get_world_size(include_dp: bool = True) -> dict[str, int]:
        return {"world_size": 1}

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": state.version}

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> dict[str, Any]:
        state.set_version((await request.json())["new_version"])
        return {"success": True, "new_version": state.version}


def transfer_routes(app: FastAPI, state: FakeVLLM) -> None:
    """The weight-transfer lifecycle: init once, then start, update, finish per push."""
    b = state.backend

    def backend_name() -> str:
        if not state.transfer:
            raise FakeError("weight transfer is not configured: --weight-transfer-config", 500)
        return str(state.transfer.get("backend"))

    @app.post("/init_weight_transfer_engine")
    async def init(request: Request) -> dict[str, str]:
        info = (await request.json()).get("init_info")
        if info is None:
            raise FakeError("Missing 'init_info' in request body")
        if backend_name() == "nccl":
            fields = {"master_address", "master_port", "rank_offset", "world_size"}
            if set(info) != fields:
                raise FakeError(f"NCCL init_info takes exactly {sorted(fields)}", 500)
            await b.join_group(info["master_address"], int(info["master_port"]),
                               int(info["rank_offset"]), int(info["world_size"]))  # fmt: skip
        else:
            raise FakeError(f"unknown weight transfer backend {backend_name()!r}", 500)
        return {"message": "Weight transfer initialized"}

    @app.post("/start_weight_update")
    async def start() -> dict[str, str]:
        backend_name()
        if state.session:
            raise FakeError("a weight update is already active", 500)
        state.session, state.received = True, False
        return {"message": "Weight update started"}

    @app.post("/update_weights")
    async def update(request: Request) -> dict[str, str]:
        info = (await request.json()).get("update_info")
        if info is None:
            raise FakeError("Missing 'update_info' in request body")
        if not state.session:
            raise FakeError("start_weight_update must be called before update_weights", 500)
        if backend_name() != "nccl":
            raise FakeError(f"unknown weight transfer backend {backend_name()!r}", 500)
        if not set(info) <= {"names", "dtype_names", "shapes", "packed"} or info.get("packed"):
            raise FakeError(f"fake_vllm: NCCL update_info {sorted(info)} not implemented")
        metas = list(zip(info["names"], info["dtype_names"], info["shapes"], strict=True))
        await b.receive(metas, b.version)
        state.received = True
        return {"message": "Weights updated"}

    @app.post("/finish_weight_update")
    async def finish(request: Request) -> dict[str, str]:
        body = await request.json() if await request.body() else {}
        if not state.session:
            raise FakeError("No weight update is active", 500)
        state.session = False
        if body.get("weight_version") is not None:
            state.set_version(body["weight_version"])
        return {"message": "Weight update finished"}


def rpc_routes(app: FastAPI, state: FakeVLLM) -> None:
    """``/collective_rpc``: the one worker method tether calls, ``reload_weights``."""
    b = state.backend

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> dict[str, Any]:
        body = await request.json()
        method, kwargs = body.get("method"), body.get("kwargs") or {}
        if method != "reload_weights" or set(kwargs) != {"weights_path"}:
            raise FakeError(f"fake_vllm: collective_rpc {method}({sorted(kwargs)}) not implemented")
        path = str(kwargs["weights_path"])
        if not os.path.isdir(path):
            raise FakeError(f"weights_path {path} is not a local directory", 500)
        if b.ties_embeddings and not b.has_head(path):
            raise FakeError("fake_vllm: no lm_head.weight in the folder: vLLM's CPU build would "
                            "keep the old head of this tied model", 500)  # fmt: skip
        await b.load_from_disk(path, b.version)
        return {"results": [None]}


def lora_routes(app: FastAPI, state: FakeVLLM) -> None:
    b = state.backend

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await request.json()
        extra = sorted(set(body) - {"lora_name", "lora_path", "load_inplace", "is_3d_lora_weight"})
        if extra or not body.get("lora_name") or not body.get("lora_path"):
            raise FakeError(f"fake_vllm: LoadLoRAAdapterRequest takes lora_name, lora_path, "
                            f"load_inplace; got {sorted(body)}")  # fmt: skip
        if not state.enable_lora:
            raise FakeError("LoRA is not enabled: start the server with --enable-lora")
        name = body["lora_name"]
        if name in b.adapters and not body.get("load_inplace"):
            raise FakeError(f"The lora adapter '{name}' has already been loaded. If you want "
                            "to load the adapter in place, set 'load_inplace' to True.")  # fmt: skip
        await b.load_adapter(name, body["lora_path"], None)
        return Response(f"Success: LoRA adapter '{name}' added successfully.")


def stream_chunks(state: FakeVLLM, body: dict[str, Any], rid: str, job: Any) -> StreamingResponse:
    """SSE chunks as vLLM sends them: one per token, the prompt ids on each choice's first."""
    created, model = int(time.time()), body.get("model") or state.name
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(choices: list[dict[str, Any]], usage: Any = None) -> str:
        data = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created,
                "model": model, "choices": choices, "usage": usage}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n"

    async def events():
        started: set[int] = set()
        sent = 0
        async for item in state.backend.events(job):
            if isinstance(item, TokenDelta):
                ch = state.choice(body, item.index, [item], item.finish_reason)
                if body.get("return_token_ids") and item.index not in started:
                    ch["prompt_token_ids"] = body["prompt"]
                started.add(item.index)
                sent += 1
                yield chunk([ch])
                continue
            for i, c in enumerate(item.completions):  # rows ended without a last token
                if c.finish_reason == "abort":
                    yield chunk([state.choice(body, i, [], "abort")])
            if include_usage:
                yield chunk([], state.usage(body, sent))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.fake_vllm", description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file")
    p.add_argument("--served-model-name")
    p.add_argument("--logprobs-mode", default="raw_logprobs",
                   choices=["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"])  # fmt: skip
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--weight-transfer-config")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--generation-config", default="auto")
    p.add_argument("--enable-server-load-tracking", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    serve_app(build_app(FakeVLLM(args)), args.port, args.port_file)


if __name__ == "__main__":
    main()
