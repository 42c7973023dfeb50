"""A FAKE SGLang server for tests: SGLang's native HTTP routes over tether's own engine.

``python -m tests.fake_sglang --model DIR --port 0 --port-file F`` serves the routes and
JSON shapes of SGLang 0.5.6+ as read in sgl-project/sglang
(``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``,
``managers/tokenizer_manager.py``, ``sampling/sampling_params.py``) on top of
:class:`tests.fake_backend.FakeBackend` (the embedded TransformersEngine, fp32, CPU).

Faithful to: ``/generate`` (``input_ids``, ``sampling_params``, ``rid``,
``return_logprob``, ``top_logprobs_num``, ``lora_path``, ``stream`` with cumulative
``data:`` events and ``[DONE]``; ``n > 1`` as a list of answers with fresh random rids);
the answer's ``output_ids`` (through the stop token), ``meta_info`` (``id``,
``finish_reason`` dicts with ``matched`` / ``length`` / ``message``, ``weight_version``,
``prompt_tokens``, ``completion_tokens``, ``output_token_logprobs`` triples,
``output_top_logprobs``); unknown top-level fields ignored, unknown sampling keys a 500
(SGLang's ``SamplingParams(**d)`` raises TypeError, which no handler catches), bad values
a 400 ``{"error": {"message"}}``, bad control bodies a 400 ``ErrorResponse``;
``sampling_seed`` honoured only with ``--enable-deterministic-inference`` (then 42 when
unset); with ``ignore_eos`` no stop id ends a row; ``/abort_request`` (exact rid known,
then every rid it prefixes, as the scheduler matches); ``/pause_generation`` modes
``abort``, ``retract``, ``in_place`` (new requests held until ``/continue_generation``);
``/flush_cache`` (400 while requests run, unless retracted); weight versions as string
labels (``--weight-version``, ``"default"``); ``/update_weights_from_disk``,
``/init_weights_update_group`` + ``/update_weights_from_distributed`` (gloo on a
``PrefixStore`` of the group name, as torch's ``_new_process_group_helper`` makes),
``/load_lora_adapter`` / ``/unload_lora_adapter`` (``--enable-lora``; a name loads once),
``/get_weight_version``, ``/update_weight_version``, ``/get_model_info``,
``/get_server_info``, ``/v1/models``, ``/health``, ``/health_generate``.

What it does not do: text prompts, streaming with ``n > 1``, penalties, ``min_p``,
``top_k`` other than all or greedy, regex / EBNF / JSON-schema constraints (structural
tags only), several adapters at once (the one loaded last is merged into the base and a
new request naming another, or none, is refused; a call running on an older adapter goes
on with the newest), waiting for an adapter's calls before unloading it, the grammar-masked
logprobs a real server reports under a constraint (these are the unconstrained ones),
NCCL, tensor parallelism.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from tests.fake_backend import FakeBackend, FakeError, serve_app
from tether.engine import Constraint, SamplingParams
from tether.engine._protocol import Completion, GenerateResult

#: SGLang's SamplingParams fields (sampling/sampling_params.py): any other key is a TypeError.
KNOWN = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "custom_params",
    "stream_interval", "logit_bias", "sampling_seed",
}  # fmt: skip
#: Keys the fake accepts only at their defaults (it cannot honour other values).
DEFAULTS = {
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_new_tokens": 0, "json_schema": None, "regex": None, "ebnf": None, "stop_regex": None,
    "custom_params": None, "logit_bias": None,
}  # fmt: skip
TOP_K_ALL = 1 << 30


class GenerateReq(BaseModel):  # GenerateReqInput: a dataclass, so unknown keys are ignored
    model_config = ConfigDict(extra="ignore")
    rid: str | list[str] | None = None
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    stream: bool = False
    lora_path: str | None = None


class PauseReq(BaseModel):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortReq(BaseModel):
    rid: str = ""
    abort_all: bool = False


class DiskReq(BaseModel):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class GroupReq(BaseModel):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DistReq(BaseModel):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class LoraReq(BaseModel):
    lora_name: str
    lora_path: str
    pinned: bool = False


class UnloadReq(BaseModel):
    lora_name: str


class VersionReq(BaseModel):
    new_version: str
    abort_all_requests: bool = True


class FakeSGLang:
    """The fake server's state: the backend, the version label, SGLang's flags."""

    def __init__(self, backend: FakeBackend, args: argparse.Namespace):
        self.backend = backend
        self.args = args
        self.label: str = args.weight_version
        self.served = args.served_model_name or args.model
        self.sglang_pause: str | None = None

    # -- /generate ----------------------------------------------------------------------

    def params(self, sp: dict[str, Any], n: int, top_logprobs: int) -> SamplingParams:
        """tether's SamplingParams of SGLang's dict (TypeError for an unknown key, as
        SGLang; ValueError for a bad value; FakeError for what the fake cannot do)."""
        unknown = sorted(set(sp) - KNOWN)
        if unknown:
            raise TypeError(
                f"SamplingParams.__init__() got an unexpected keyword argument {unknown[0]!r}"
            )
        for key, default in DEFAULTS.items():
            if sp.get(key, default) != default:
                raise FakeError(f"fake_sglang does not fake {key}={sp[key]!r}")
        temperature = float(
            sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0
        )
        top_k = sp.get("top_k", -1)
        top_k = TOP_K_ALL if top_k in (-1, None) else int(top_k)
        if not (temperature >= 0):
            raise ValueError(
                f"temperature must be a non-negative finite number, got {temperature}."
            )
        if temperature < 1e-6 or top_k == 1:
            temperature = 0.0
        elif top_k != TOP_K_ALL:
            raise FakeError(f"fake_sglang does not fake top_k={top_k}")
        top_p = float(sp.get("top_p", 1.0))
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        stop = sp.get("stop") or ()
        ignore_eos = bool(sp.get("ignore_eos", False))
        seed = sp.get("sampling_seed", 42) if self.args.enable_deterministic_inference else None
        tag = sp.get("structural_tag")
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=int(sp.get("max_new_tokens", 128)),
            n=n,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=() if ignore_eos else tuple(sp.get("stop_token_ids") or ()),
            seed=None if seed is None else int(seed),
            ignore_eos=ignore_eos,
            top_logprobs=top_logprobs,
            constraint=Constraint(tag) if tag else None,
        )

    def answer(
        self, rid: str, req: GenerateReq, prompt: list[int], c: Completion, version: str
    ) -> dict[str, Any]:
        """SGLang's answer dict for one completion (so far, when not finished)."""
        tok = self.backend.tokenizer
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": self.finish(req, c),
            "prompt_tokens": len(prompt),
            "weight_version": version,
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(c.token_ids),
            "cached_tokens": 0,
        }
        if req.return_logprob:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [
                [lp, t, None] for t, lp in zip(c.token_ids, c.logprobs, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(c.token_ids)
            if req.top_logprobs_num:
                meta["input_top_logprobs"] = []
                rows = c.top_logprobs or []
                meta["output_top_logprobs"] = [
                    [[lp, t, None] for t, lp in row.items()] for row in rows
                ]
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        return {"text": text, "output_ids": list(c.token_ids), "meta_info": meta}

    def finish(self, req: GenerateReq, c: Completion) -> dict[str, Any] | None:
        if c.finish_reason is None:
            return None
        sp = req.sampling_params if isinstance(req.sampling_params, dict) else {}
        if c.finish_reason == "length" or len(c.token_ids) >= sp.get("max_new_tokens", 128):
            return {"type": "length", "length": len(c.token_ids)}  # checked first, as SGLang
        if c.finish_reason == "abort":
            return {"type": "abort", "message": "Abort request."}
        stops = sp.get("stop") or []
        text = self.backend.tokenizer.decode(c.token_ids)
        for s in [stops] if isinstance(stops, str) else stops:
            if s in text:
                return {"type": "stop", "matched": s}
        return {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}

    def check_adapter(self, name: str | None) -> None:
        active = self.backend.active_adapter
        if name is not None and name not in self.backend.adapters:
            raise ValueError(f"The following requested LoRA adapters are not loaded: {name}")
        if name != active and active is not None:
            raise FakeError(f"fake_sglang serves only the adapter loaded last, {active!r}")

    async def run_one(self, rid: str, prompt: list[int], params: SamplingParams) -> GenerateResult:
        job = self.backend.start(rid, prompt, params)
        result: GenerateResult | None = None
        async for item in self.backend.events(job):
            if isinstance(item, GenerateResult):
                result = item
        assert result is not None
        return result

    async def generate(self, req: GenerateReq) -> Any:
        prompt, sp, rids = self.validate(req)
        params = self.params(sp, 1, (req.top_logprobs_num or 0) if req.return_logprob else 0)
        n = int(sp.get("n", 1))
        if req.stream:
            if n > 1:
                raise FakeError("fake_sglang does not stream n > 1")
            return StreamingResponse(
                self.stream(req, rids[0], prompt, params), media_type="text/event-stream"
            )
        results = await asyncio.gather(*(self.run_one(r, prompt, params) for r in rids))
        outs = [
            self.answer(r, req, prompt, res.completions[0], self.label)
            for r, res in zip(rids, results, strict=True)
        ]
        return outs if n > 1 else outs[0]

    def validate(self, req: GenerateReq) -> tuple[list[int], dict[str, Any], list[str]]:
        if req.input_ids is None or req.text is not None:
            raise FakeError("fake_sglang takes input_ids only")
        if not req.input_ids:
            raise ValueError("input_ids cannot be empty.")
        if isinstance(req.input_ids[0], list) or not isinstance(req.sampling_params or {}, dict):
            raise FakeError("fake_sglang does not fake batches of prompts")
        prompt = [int(t) for t in req.input_ids]  # type: ignore[arg-type]
        sp = dict(req.sampling_params or {})
        self.check_adapter(req.lora_path)
        limit = self.backend.max_positions
        want = len(prompt) + int(sp.get("max_new_tokens") or 0)
        if limit is not None and want > limit:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {limit} tokens."
            )
        n = int(sp.get("n", 1))
        rid = req.rid if isinstance(req.rid, str) else None
        rids = [rid or uuid.uuid4().hex] if n == 1 else [uuid.uuid4().hex for _ in range(n)]
        for r in rids:
            if r in self.backend.jobs:
                raise ValueError(f"Duplicate request ID {r}")
        return prompt, sp, rids

    async def stream(
        self, req: GenerateReq, rid: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[bytes]:
        job = self.backend.start(rid, prompt, params)
        ids: list[int] = []
        lps: list[float] = []
        tops: list[dict[int, float]] = []
        sent = 0  # tokens sent (--incremental-streaming-output sends only the new ones)
        try:
            async for item in self.backend.events(job):
                if isinstance(item, GenerateResult):
                    out = self.answer(rid, req, prompt, item.completions[0], self.label)
                else:
                    ids.append(item.token_id)
                    lps.append(item.logprob)
                    tops.append(item.top_logprobs or {})
                    if item.finish_reason is not None:
                        continue  # the last token comes with the finish reason
                    c = Completion(ids, lps, None, tops)  # type: ignore[arg-type]
                    out = self.answer(rid, req, prompt, c, self.label)
                if self.args.incremental_streaming_output:
                    out, sent = _since(out, sent), len(out["output_ids"])
                yield b"data: " + json.dumps(out).encode() + b"\n\n"
        except Exception as exc:
            yield b"data: " + json.dumps({"error": {"message": str(exc)}}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- weights ------------------------------------------------------------------------

    def version_of(self, label: str | None) -> int:
        if label is not None and label.isdigit():
            return int(label)
        return self.backend.version

    async def exclusive(self, work: Any) -> None:
        """Run ``work`` as SGLang's model-update writer lock does: after the requests in
        flight (new ones held), or at once when generation is paused."""
        if self.backend.paused:
            await work
            return
        await self.backend.pause("wait")
        try:
            await work
        finally:
            await self.backend.resume()


def _since(out: dict[str, Any], sent: int) -> dict[str, Any]:
    """An incremental stream event: the output past the first ``sent`` tokens."""
    meta = dict(out["meta_info"])
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = meta[key][sent:]
    return {**out, "output_ids": out["output_ids"][sent:], "meta_info": meta}


def _fail(exc: BaseException) -> JSONResponse:
    status = exc.status if isinstance(exc, FakeError) else 400
    return JSONResponse({"error": {"message": str(exc)}}, status_code=status)


def make_app(fake: FakeSGLang) -> FastAPI:
    app = FastAPI()
    b = fake.backend

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        body = {
            "object": "error",
            "message": str(exc),
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
        return JSONResponse(body, status_code=400)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("", status_code=200)

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": fake.served, "tokenizer_path": fake.args.model, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": fake.label}  # fmt: skip

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {"model_path": fake.served, "served_model_name": fake.served, "context_length": b.max_positions,
                "enable_lora": fake.args.enable_lora, "incremental_streaming_output": fake.args.incremental_streaming_output,
                "skip_tokenizer_init": False, "enable_deterministic_inference": fake.args.enable_deterministic_inference,
                "weight_version": fake.label, "tp_size": 1, "internal_states": [{}], "version": "0.5.6-fake"}  # fmt: skip

    @app.get("/get_weight_version")
    async def weight_version() -> dict[str, Any]:
        return {"weight_version": fake.label}

    @app.post("/update_weight_version")
    async def update_weight_version(obj: VersionReq) -> dict[str, Any]:
        if obj.abort_all_requests:
            for rid in list(b.jobs):
                b.abort(rid)
        fake.label = obj.new_version
        b.version = fake.version_of(obj.new_version)
        return {
            "success": True,
            "message": f"Weight version updated to {obj.new_version}",
            "new_version": obj.new_version,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": fake.served, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": fake.served, "max_model_len": b.max_positions}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(obj: GenerateReq) -> Any:
        try:
            return await fake.generate(obj)
        except (ValueError, FakeError) as exc:
            return _fail(exc)

    @app.post("/abort_request")
    async def abort(obj: AbortReq) -> PlainTextResponse:
        if obj.abort_all or (obj.rid and obj.rid in b.jobs):
            for rid in list(b.jobs):
                if obj.abort_all or rid.startswith(obj.rid):
                    b.abort(rid)
        return PlainTextResponse("", status_code=200)

    @app.post("/pause_generation")
    async def pause(obj: PauseReq) -> dict[str, Any]:
        fake.sglang_pause = obj.mode
        await b.pause("abort" if obj.mode == "abort" else "keep")
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def resume() -> dict[str, Any]:
        fake.sglang_pause = None
        await b.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush() -> PlainTextResponse:
        text = ("Cache flushed.\nPlease check backend logs for more details. (When there are running "
                "or waiting requests, the operation will not be performed.)\n")  # fmt: skip
        if b.jobs and fake.sglang_pause != "retract":
            return PlainTextResponse(text, status_code=400)
        await b.flush_cache()
        return PlainTextResponse(text, status_code=200)

    @app.post("/update_weights_from_disk")
    async def from_disk(obj: DiskReq) -> JSONResponse:
        try:
            await fake.exclusive(
                b.load_from_disk(obj.model_path, fake.version_of(obj.weight_version))
            )
        except (FakeError, OSError) as exc:
            body = {
                "success": False,
                "message": f"Failed to update weights: {exc}",
                "num_paused_requests": 0,
            }
            return JSONResponse(body, status_code=400)
        message = "Succeeded to update model weights."
        if obj.weight_version is not None:
            fake.label = obj.weight_version
            message += f" Weight version updated to {obj.weight_version}."
        fake.served = obj.model_path  # SGLang serves the new path's name afterwards
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/init_weights_update_group")
    async def init_group(obj: GroupReq) -> JSONResponse:
        if obj.backend != "gloo":
            body = {"success": False, "message": "fake_sglang joins gloo groups only"}
            return JSONResponse(body, status_code=400)
        await b.join_group(
            obj.master_address,
            obj.master_port,
            obj.rank_offset,
            obj.world_size,
            prefix=f"{obj.group_name}/",
        )
        return JSONResponse(
            {"success": True, "message": "Succeeded to initialize custom process group."}
        )

    @app.post("/update_weights_from_distributed")
    async def from_dist(obj: DistReq) -> JSONResponse:
        metas = list(zip(obj.names, obj.dtypes, obj.shapes, strict=True))
        try:
            await fake.exclusive(b.receive(metas, fake.version_of(obj.weight_version)))
        except FakeError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=400)
        message = "Succeeded to update parameter online."
        if obj.weight_version is not None:
            fake.label = obj.weight_version
            message += f" Weight version updated to {obj.weight_version}."
        return JSONResponse({"success": True, "message": message})

    @app.post("/load_lora_adapter")
    async def load_lora(obj: LoraReq) -> JSONResponse:
        error = None
        if not fake.args.enable_lora:
            error = "LoRA is not enabled. Please set `--enable-lora` to True."
        elif obj.lora_name in b.adapters:
            error = f"Failed to load LoRA adapter {obj.lora_name} because it is already loaded"
        if error is None:
            try:
                await fake.exclusive(b.load_adapter(obj.lora_name, obj.lora_path, None))
            except (FakeError, OSError, ValueError) as exc:
                error = f"Failed to load LoRA adapter {obj.lora_name}: {exc}"
        if error is not None:
            return JSONResponse(
                {"success": False, "error_message": error, "loaded_adapters": None}, status_code=400
            )
        return JSONResponse(
            {"success": True, "error_message": None, "loaded_adapters": dict(b.adapters)}
        )

    @app.post("/unload_lora_adapter")
    async def unload_lora(obj: UnloadReq) -> JSONResponse:
        if obj.lora_name not in b.adapters:
            body = {
                "success": False,
                "error_message": f"LoRA adapter {obj.lora_name} is not loaded.",
                "loaded_adapters": None,
            }
            return JSONResponse(body, status_code=400)
        del b.adapters[obj.lora_name]
        if b.active_adapter == obj.lora_name:  # the base weights again
            await fake.exclusive(b.load_weights(dict(b._base), b.version))
        return JSONResponse(
            {"success": True, "error_message": None, "loaded_adapters": dict(b.adapters)}
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--served-model-name")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--incremental-streaming-output", action="store_true")
    parser.add_argument("--enable-deterministic-inference", action="store_true")
    args = parser.parse_args()
    # the backend's asyncio objects bind to the loop on first use: the server's loop
    fake = FakeSGLang(FakeBackend(Path(args.model)), args)
    serve_app(make_app(fake), args.port, args.port_file)


if __name__ == "__main__":
    main()
