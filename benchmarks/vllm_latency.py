"""The latency tether's gateway adds in front of a REAL vLLM server.

A real vLLM OpenAI server (its CPU build here; ``_vllm_server.py``) serves the starter
model, and ``tether serve --engine vllm --engine-url`` (record mode, its own process)
sits in front of it. One keep-alive ``httpx`` client sends the same non-streamed chat
call (system + user message, ``max_tokens`` 1, temperature 0; the question varies so no
two prompts are equal) by three paths:

- ``direct chat``: vLLM's own ``/v1/chat/completions`` (vLLM renders and tokenizes);
- ``direct ids``: vLLM's ``/v1/completions`` with the body tether sends it for that
  call (token ids in, token ids and logprobs out): the upstream half of a gateway call;
- ``tether``: the gateway's record-mode ``/v1/chat/completions`` (auth, template,
  tokens, the ``direct ids`` call, the SQLite record, the OpenAI answer).

One client, ``--pairs`` rounds, the paths' order rotating every round so that each
sees the same load; p50/p99 per path, and what the gateway adds over ``direct chat``
(the figure a user sees) and over ``direct ids`` (the gateway's own work plus one
loopback hop). Then calls/s at ``--concurrency`` clients, ``direct chat`` and
``tether`` in alternating blocks of ``--block`` calls. Every figure carries the load
average at its end, and each phase the CPU milliseconds per call of the gateway process,
of vLLM's processes (its server, engine core and worker: on the CPU build the engine
polls while idle, so its share grows with the wall time) and of this client.

    .venv/bin/python benchmarks/vllm_latency.py [--pairs 150] [--concurrency 32]
        [--blocks 6] [--block 320] [--vllm-python PY] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _calls import SYSTEM, USER, pct
from _vllm_server import default_python, tether_serve, vllm_server

KEY = "bench-record-key-0123456789"


def messages(n: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(n=n)}]


def chat_body(model: str, n: int) -> bytes:
    return json.dumps({"model": model, "messages": messages(n), "max_tokens": 1,
                       "temperature": 0}).encode()  # fmt: skip


def ids_body(tokenizer: Any, model: str, n: int) -> bytes:
    """The ``/v1/completions`` body tether's engine sends vLLM for :func:`chat_body`'s call."""
    from tether.chat import render_prompt
    from tether.engine import SamplingParams
    from tether.engine._server_api import ServerCall
    from tether.engine._vllm import completion_body

    ids = render_prompt(tokenizer, messages(n), None)
    stops = (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    params = SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=tuple(sorted(set(stops))))
    body = completion_body(ServerCall(ids, params, f"bench-{n}", None), stream=False)
    return json.dumps({**body, "model": model}).encode()


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_seconds() -> tuple[float, float, float]:
    """CPU seconds so far of the gateway process, of vLLM's (its server, engine and
    workers), and of this client."""
    import psutil

    gateway = vllm = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            used = sum(proc.cpu_times()[:2])
            if "tether.cli" in " ".join(proc.cmdline()):
                gateway += used
            else:
                vllm += used
        except psutil.NoSuchProcess:
            continue
    return gateway, vllm, sum(psutil.Process().cpu_times()[:2])


async def one_client(paths: dict[str, tuple[str, Any]], pairs: int, warmup: int) -> dict:
    """``pairs`` rounds of one call per path, the order rotating; seconds per path."""
    out: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(warmup + pairs):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                url, body = paths[name]
                content = body(i)
                t0 = time.perf_counter()
                r = await client.post(url, content=content, headers=headers)
                elapsed = time.perf_counter() - t0
                r.raise_for_status()
                if i >= warmup:
                    out[name].append(elapsed)
    return {name: sorted(xs) for name, xs in out.items()}


async def rate(url: str, body: Any, concurrency: int, calls: int) -> tuple[float, list[float]]:
    """Calls/s of ``calls`` calls from ``concurrency`` concurrent loops (one keep-alive
    connection each), and their latencies."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    left, lat = 2 * concurrency, []  # the warm-up: every connection opened
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def loop() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                content = body(left)
                t0 = time.perf_counter()
                r = await client.post(url, content=content, headers=headers)
                lat.append(time.perf_counter() - t0)
                r.raise_for_status()

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        left = calls
        t0 = time.perf_counter()
        lat.clear()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return calls / (time.perf_counter() - t0), sorted(lat)


async def measure(args: argparse.Namespace, vllm: str, gateway: str, model: Path) -> None:
    from tether.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    served = str(model)
    paths = {
        "direct chat": (f"{vllm}/v1/chat/completions", lambda n: chat_body(served, n)),
        "direct ids": (f"{vllm}/v1/completions", lambda n: ids_body(tokenizer, served, n)),
        "tether": (f"{gateway}/v1/chat/completions", lambda n: chat_body("policy", n)),
    }
    before = cpu_seconds()
    t = await one_client(paths, args.pairs, warmup=10)
    used = [(t1 - t0) / (args.pairs + 10) / 3 for t0, t1 in zip(before, cpu_seconds(), strict=True)]
    print(f"\n1 client, {args.pairs} rounds (order rotating), chat call max_tokens 1; "
          f"load average {load()}")  # fmt: skip
    print(f"{'path':14} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, xs in t.items():
        print(f"{name:14} {pct(xs, 50):8.2f} {pct(xs, 99):8.2f} {1e3 * statistics.fmean(xs):8.2f}")
    for base in ("direct chat", "direct ids"):
        added = pct(t["tether"], 50) - pct(t[base], 50)
        added99 = pct(t["tether"], 99) - pct(t[base], 99)
        print(f"tether adds over {base}: {added:+.2f} ms p50, {added99:+.2f} ms p99")
    print(f"CPU ms per call: gateway {3e3 * used[0]:.2f} (per tether call), vLLM {1e3 * used[1]:.2f}"
          f" and client {1e3 * used[2]:.2f} (mean over the three paths)")  # fmt: skip
    if args.blocks <= 0:
        return
    rows: dict[str, list[tuple[float, float, str]]] = {"direct chat": [], "tether": []}
    cpu = {name: [0.0, 0.0, 0.0] for name in rows}
    for b in range(args.blocks):
        order = ["direct chat", "tether"] if b % 2 == 0 else ["tether", "direct chat"]
        for name in order:
            url, body = paths[name]
            before = cpu_seconds()
            r, lat = await rate(url, body, args.concurrency, args.block)
            for i, (t0, t1) in enumerate(zip(before, cpu_seconds(), strict=True)):
                cpu[name][i] += (t1 - t0) / (args.block + 2 * args.concurrency) / args.blocks
            rows[name].append((r, pct(lat, 50), load()))
    print(f"\n{args.concurrency} concurrent clients, {args.blocks} blocks of {args.block} calls "
          f"per path, alternating")  # fmt: skip
    print(f"{'path':14} {'calls/s (median)':>17} {'p50 ms':>8} {'CPU ms/call gw/vLLM/client':>27}"
          "   per block calls/s [load]")  # fmt: skip
    for name, rs in rows.items():
        per = "  ".join(f"{r:.0f} [{ld.split(',')[0]}]" for r, _, ld in rs)
        med = statistics.median(r for r, _, _ in rs)
        used = "/".join(f"{1e3 * c:.1f}" for c in cpu[name])
        print(f"{name:14} {med:17.0f} {statistics.median(p for _, p, _ in rs):8.2f} {used:>27}"
              f"   {per}")  # fmt: skip
    ratio = statistics.median(t / d for (t, _, _), (d, _, _) in zip(rows["tether"],
                              rows["direct chat"], strict=True))  # fmt: skip
    print(f"tether / direct calls/s (median of paired blocks): {ratio:.2f}; load average {load()}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=150)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--blocks", type=int, default=6, help="blocks per path at --concurrency")
    p.add_argument("--block", type=int, default=320, help="calls per block")
    p.add_argument("--vllm-python", default=default_python())
    p.add_argument("--model", help="model folder (default: the starter)")
    args = p.parse_args()
    from tether.starter import build_starter

    model = Path(args.model or build_starter(warm=False))
    print(f"model {model}; {os.cpu_count()} CPUs; load average {load()}")
    with (
        vllm_server(args.vllm_python, model) as vllm,
        tempfile.TemporaryDirectory(prefix="vllm-latency-") as tmp,
        tether_serve(vllm, model, Path(tmp) / "traces.sqlite", record_key=KEY) as gateway,
    ):
        asyncio.run(measure(args, vllm, gateway, model))


if __name__ == "__main__":
    main()
