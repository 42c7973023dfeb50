"""Seconds per weight push to a server, per transport, against the embedded engine's swap;
and the gateway's added latency in front of a server, against calling it directly.

Pushes: a randomly initialised model of ``--shape`` (default Qwen2.5-0.5B's: hidden 896,
24 layers, 151,936 tokens) is served by the FAKE vLLM server (tests/fake_vllm.py: tether's
embedded engine behind vLLM's routes, a real process); ``RemoteEngine.update_weights``
pushes full weights by ``disk`` and by broadcast (gloo, standing in for NCCL), and a LoRA
r=16 adapter by ``lora``. Each row is the median of ``--pushes`` pushes, split into what
the trainer's side takes (writing the folder; the broadcast) and the whole push (pause,
push, version check, cache flush, resume). The baseline, in the same run, is the embedded
engine's own ``update_weights`` of the same state dict in this process. The server's side
is the fake's (it loads safetensors into a transformers model, and merges a LoRA adapter
into the base): a real vLLM loads an adapter without merging, so the ``lora`` row's
server share is an upper bound.

``--real PYTHON`` pushes to a REAL vLLM server instead (``_vllm_server.py``, run by that
Python, fp32 on the CPU build): ``disk`` (the folder, then ``/collective_rpc``
``reload_weights`` and ``/update_weight_version``) and ``lora`` (``/v1/load_lora_adapter``
with ``load_inplace``, then ``/update_weight_version``), each through
``RemoteEngine.update_weights`` as a training run pushes; the ``server load s`` column is
the time of those two calls alone (the written folder loaded, the version set). No
latency half (``vllm_latency.py`` measures the gateway in front of a real server).

Latency: ``--calls`` one-token completions of the same 30-token prompt, as raw HTTP
posts from one ``httpx`` client, the order alternating (A B B A ...): direct to a NULL
vLLM server (this file's ``null_vllm_app``: vLLM's start-up routes and a completion
answered at once, no model, in its own process), and to a rollout of ``tether serve
--engine vllm --engine-url`` (its own process) in front of the same server. Prints p50/p99
of each and the difference (the gateway's work: auth, recording to SQLite, the engine
call's re-encoding).

    .venv/bin/python benchmarks/weight_sync.py [--shape qwen2.5-0.5b|tiny] [--pushes 3]
        [--calls 200] [--skip-pushes] [--skip-latency] [--real .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fake servers live in tests/

from _shapes import quiet_torchao, random_model  # noqa: E402  (the script's folder)
from _vllm_server import free_port, tether_serve, vllm_server  # noqa: E402

from tests.remote_servers import fake_server  # noqa: E402
from tether.engine import RemoteEngine, SamplingParams, TransformersEngine, server_api  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def model_folder(shape: str, root: Path) -> tuple[Path, Any]:
    """A random model of ``shape`` with the starter's tokenizer (a server needs one), its
    weights written by the trainer's own ``save_full`` (a tied model's ``lm_head.weight``
    in the file, as every disk push writes it)."""
    from tether.engine._weight_transports import save_full
    from tether.starter import build_starter

    model = random_model(shape, "cpu")
    files = root / f"files-{shape}"
    model.config.save_pretrained(files)
    starter = Path(build_starter(warm=False))
    for name in TOKENIZER_FILES:
        if (starter / name).is_file():
            shutil.copy2(starter / name, files / name)
    return save_full(model.state_dict(), root / f"random-{shape}", files), model


def lora_state(model: Any, r: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from peft import LoraConfig, get_peft_model

    from tether._hf import adapter_config, adapter_weights

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))
    state, config = adapter_weights(peft_model), adapter_config(peft_model)
    peft_model.unload()  # the base model back, untouched
    return state, config


async def time_pushes(engine: RemoteEngine, state: dict[str, Any], pushes: int) -> list[float]:
    out = []
    for _ in range(pushes):
        t0 = time.perf_counter()
        await engine.update_weights(state)
        out.append(time.perf_counter() - t0)
    return out


async def push_rows(
    folder: Path, model: Any, pushes: int, tmp: Path, real: str | None = None
) -> list[tuple[str, float, float, float]]:
    """The embedded engine's swap, then each transport's push to the fake vLLM server, or
    with ``real`` (a Python with vLLM) to a REAL vLLM server: ``disk`` (reload in place,
    ``/collective_rpc reload_weights``) and ``lora`` (``/v1/load_lora_adapter``)."""
    nan = float("nan")
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    adapter, config = lora_state(model, 16)
    rows = []
    embedded = TransformersEngine(model)
    t = []
    for _ in range(pushes):
        t0 = time.perf_counter()
        await embedded.update_weights(full)
        t.append(time.perf_counter() - t0)
    await embedded.close()
    rows.append(("embedded update_weights (baseline)", statistics.median(t), nan, nan))
    transports = (("disk", full), ("lora", adapter))
    if real is None:
        transports = (("disk", full), ("nccl", full), ("lora", adapter))
    for transport, state in transports:
        server = vllm_server(real, folder) if real else fake_server("vllm", folder, transport)
        loads: list[float] = []
        with server as url:
            engine = await RemoteEngine.connect(
                timed_api(loads), [url], transport=transport, weights_dir=tmp / transport,
                model_dir=folder, lora_config=config, nccl=("127.0.0.1", 0, "gloo"),
                timeout_s=1800,
            )  # fmt: skip
            try:
                total = statistics.median(await time_pushes(engine, state, pushes))
            finally:
                await engine.close()
        name = f"vLLM {'real' if real else 'fake'}, {transport}"
        rows.append((name + (" (LoRA r=16)" if transport == "lora" else ""), total,
                     trainer_side(transport, state, config, folder, tmp),
                     statistics.median(loads) if loads else nan))  # fmt: skip
    return rows


def timed_api(seconds: list[float]) -> Any:
    """vLLM's adapter, its two load calls timed into ``seconds``: what the server takes
    to load a written folder and set the version (``update_from_disk``, ``load_lora``)."""
    api = server_api("vllm")
    for name in ("update_from_disk", "load_lora"):
        method = getattr(api, name)

        async def timed(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await _method(*args, **kwargs)
            finally:
                seconds.append(time.perf_counter() - t0)

        setattr(api, name, timed)
    return api


def trainer_side(transport: str, state: dict, config: dict, folder: Path, tmp: Path) -> float:
    """Seconds of the trainer's own part: writing the folder (disk, lora)."""
    from tether.engine._weight_transports import save_adapter, save_full

    t0 = time.perf_counter()
    if transport == "disk":
        save_full(state, tmp / "trainer-side", folder)
    elif transport == "lora":
        save_adapter(state, config, tmp / "trainer-side-lora")
    else:
        return float("nan")  # the broadcast is the push itself
    return time.perf_counter() - t0


@contextlib.contextmanager
def serve_gateway(engine_url: str, model: Path, tmp: Path) -> Iterator[str]:
    """``tether serve --engine vllm --engine-url URL`` in its own process, and a rollout on
    it: ``"BASE_URL|TOKEN"``."""
    import secrets

    import httpx

    key = secrets.token_hex(16)
    with tether_serve(engine_url, model, tmp / "traces.sqlite", admin_key=key) as url:
        created = httpx.post(f"{url}/admin/rollouts", json={"task": {}},
                             headers={"Authorization": f"Bearer {key}"}).json()  # fmt: skip
        yield f"{created['base_url']}|{created['token']}"


def null_vllm_app() -> Any:
    """A NULL vLLM server for the latency half: the routes ``VLLMServer`` reads at start-up
    and ``/v1/completions`` answering one fixed token at once (no model), so the time of
    a call is the HTTP round trip and what sits in front of it."""
    from fastapi import FastAPI

    app = FastAPI()
    model = {"id": "null", "object": "model", "max_model_len": 2048, "parent": None}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model]}

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}

    @app.get("/get_world_size")
    async def world() -> dict[str, int]:
        return {"world_size": 1}

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": "default"}

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": 0, "text": "x", "token_ids": [7], "finish_reason": "length",
                  "logprobs": {"token_logprobs": [-0.5], "top_logprobs": None, "tokens": ["x"],
                               "text_offset": [0]}}  # fmt: skip
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}
        return {"id": "cmpl-null", "object": "text_completion", "model": "null",
                "choices": [choice], "usage": usage}  # fmt: skip

    return app


@contextlib.contextmanager
def null_server() -> Iterator[str]:
    """:func:`null_vllm_app` in its own process (uvicorn), on a free loopback port."""
    import multiprocessing

    import httpx
    import uvicorn

    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(
        target=uvicorn.run, args=("weight_sync:null_vllm_app",),
        kwargs={"factory": True, "port": port, "log_level": "warning", "app_dir": str(ROOT / "benchmarks")},
        daemon=True,
    )  # fmt: skip
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.join(10)


async def latency(calls: int) -> tuple[list[float], list[float]]:
    """The same one-token completion, direct to a NULL vLLM server (:func:`null_vllm_app`)
    and through ``tether serve`` in front of it, both as raw HTTP posts from one ``httpx``
    client (no SDK on either side), interleaved."""
    import httpx

    from tether.engine._server_api import ServerCall
    from tether.engine._vllm import completion_body
    from tether.starter import build_starter

    starter = Path(build_starter(warm=False))  # the gateway's tokenizer
    prompt = list(range(10, 40))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    direct, gated = [], []
    with (
        null_server() as url,
        tempfile.TemporaryDirectory() as tmp,
        serve_gateway(url, starter, Path(tmp)) as rollout,
    ):
        base, token = rollout.split("|")
        auth = {"Authorization": f"Bearer {token}"}
        gated_body = {"model": "policy", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(calls + 5):  # the first 5 of each warm up, not counted
                body = completion_body(ServerCall(prompt, params, f"d{i}", None), stream=False)
                pair = [("direct", f"{url}/v1/completions", body, None),
                        ("gated", f"{base}/completions", gated_body, auth)]  # fmt: skip
                for name, target, payload, headers in pair if i % 2 else pair[::-1]:  # A B B A
                    t0 = time.perf_counter()
                    r = await client.post(target, json=payload, headers=headers)
                    elapsed = time.perf_counter() - t0
                    r.raise_for_status()
                    if i >= 5:
                        (direct if name == "direct" else gated).append(elapsed)
    return direct, gated


def load() -> str:
    import os

    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--pushes", type=int, default=3)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--skip-pushes", action="store_true")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--real", metavar="PYTHON", help="push to a REAL vLLM server run by PYTHON "
                   "(e.g. .venv-vllm/bin/python): disk and lora; no latency half")  # fmt: skip
    args = p.parse_args()
    quiet_torchao()
    torch.manual_seed(0)
    if not args.skip_pushes:
        with tempfile.TemporaryDirectory(prefix="weight-sync-") as tmp:
            folder, model = model_folder(args.shape, Path(tmp))
            n = sum(t.numel() for t in model.state_dict().values())
            print(f"weight push, {args.shape}-shaped random model ({n / 1e6:.0f}M parameters, fp32), "
                  f"median of {args.pushes}; load average {load()}")  # fmt: skip
            rows = asyncio.run(push_rows(folder, model, args.pushes, Path(tmp), args.real))
        print(f"{'path':42} {'push s':>8} {'trainer side s':>15} {'server load s':>14}")
        for name, total, side, load_s in rows:
            print(f"{name:42} {total:8.2f} {side:15.2f} {load_s:14.2f}")
        print(f"load average at the end {load()}; anchor: verl, Qwen3-0.6B, intra-node NCCL "
              "push on A100s, 0.61 s")  # fmt: skip
    if not args.skip_latency and not args.real:
        direct, gated = asyncio.run(latency(args.calls))
        print(
            f"\none-token completion, {args.calls} calls each, order alternating (null vLLM server)"
        )
        print(f"{'':24} {'p50 ms':>8} {'p99 ms':>8}")
        print(f"{'direct to the server':24} {pct(direct, 0.5):8.2f} {pct(direct, 0.99):8.2f}")
        print(f"{'through the gateway':24} {pct(gated, 0.5):8.2f} {pct(gated, 0.99):8.2f}")
        print(f"{'added by the gateway':24} {pct(gated, 0.5) - pct(direct, 0.5):8.2f}")


if __name__ == "__main__":
    main()
