"""What the gateway adds to a model call: HTTP, auth, template, tokens, store, over a null engine.

The gateway runs in its own process, as the trainer runs it (``LoopServer``:
real uvicorn on 127.0.0.1), with the starter tokenizer and chat template, a
NullEngine that answers a fixed 25-token tool call instantly, and a SQLite
store in a temporary folder; so the load generator does not share its GIL.
Each concurrent client has its own rollout (created through the admin API)
and sends realistic chat requests (system prompt, user question, one tool;
~190 prompt tokens; the question differs on every call, so no two prompts
are the same) to ``/rollouts/{id}/v1/chat/completions``. The baseline awaits
the same NullEngine in-process with the same concurrency. At the end every
call must be in the store and every answer a 200 with the parsed tool call.

    .venv/bin/python benchmarks/gateway_overhead.py [--calls 2000] [--warmup 200]
        [--concurrency 1 64] [--quick] [--client raw|httpx] [--loop auto|asyncio|uvloop]
    .venv/bin/python benchmarks/gateway_overhead.py --turns 30 [--rollouts 60]

``--turns N`` measures long conversations instead (``turns.py``): the gateway's
CPU per call at each turn of an agent that calls a tool every turn (the
history grows ~130 tokens a turn, ~4,000 at turn 30), with the render cache
off (the baseline) and on, two gateway processes driven turn by turn in
alternation.

"added" is the gateway's latency minus the baseline's at the same percentile.
The machine is shared, so latencies move with its load; the CPU time per call
of the gateway process (and of this client) moves less. To see where the
gateway's time goes: ``py-spy record --subprocesses -- .venv/bin/python <this>``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _calls import ANSWER, KEY_ENV, SYSTEM, TOOLS, USER, pct

MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(n=25)}]
MAX_TOKENS = 64
LOOP_ENV = "TETHER_BENCH_LOOP"
CACHE_ENV = "TETHER_BENCH_RENDER_CACHE"
LONG_ENV = "TETHER_BENCH_LONG_CONTEXT"


def answer_ids(tokenizer: Any) -> list[int]:
    """The null engine's fixed completion: a tool call, then ``<|im_end|>``."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [*tokenizer.encode(ANSWER, add_special_tokens=False), end]


def null_engine(tokenizer: Any) -> Any:
    from tether.engine.testing import NullEngine

    return NullEngine(answer_ids(tokenizer), logprob=-0.25)


# -- the gateway process -------------------------------------------------------


def serve(starter: str, store_path: str) -> None:
    """Run the gateway until SIGTERM; print ``PORT <n> ...`` once it listens.

    It runs as the trainer runs it: :class:`~tether.gateway.LoopServer` on this
    process's event loop.
    """
    from tether.gateway import Gateway, GatewayConfig, LoopServer, create_app
    from tether.models import load_tokenizer
    from tether.store import Store

    async def main() -> None:
        tokenizer = load_tokenizer(starter)
        if os.environ.get(LONG_ENV) == "1":  # the null engine has no context limit
            tokenizer.model_max_length = 1 << 20
        store = Store(store_path)
        cache = os.environ.get(CACHE_ENV, "1") == "1"
        config = GatewayConfig(admin_key=os.environ[KEY_ENV], port=0, render_cache=cache)
        engine = null_engine(tokenizer)
        if os.environ.get(LONG_ENV) == "1":  # the null engine's record of calls would grow
            engine.calls = collections.deque(maxlen=1)
        gw = Gateway(engine, tokenizer, store, config)
        server = await LoopServer(create_app(gw), "127.0.0.1", 0).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        http = server.server.config.http_protocol_class.__name__
        print(f"PORT {server.port} loop={loop} http={http}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()
            store.close()

    if os.environ.get(LOOP_ENV) == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def start_server(
    starter: Path,
    store_path: Path,
    key: str,
    loop: str,
    *,
    render_cache: bool = True,
    long_context: bool = False,
) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, KEY_ENV: key, LOOP_ENV: loop, CACHE_ENV: "1" if render_cache else "0"}
    env[LONG_ENV] = "1" if long_context else "0"
    args = [sys.executable, __file__, "--serve", str(starter), str(store_path)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        proc.wait()
        raise SystemExit(f"the gateway process did not start (said {line!r})")
    port, info = line.split()[1], " ".join(line.split()[2:])
    return proc, f"http://127.0.0.1:{port}", info


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- measuring -------------------------------------------------------------------


async def drive(call: Any, workers: int, calls: int) -> tuple[list[float], float]:
    """Run ``calls`` calls with ``workers`` concurrent loops; per-call latencies and wall time.

    ``call(worker)`` makes one call and returns nothing; the clock covers only that await.
    """
    left = calls
    lat: list[float] = []

    async def loop(w: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            await call(w)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(workers)))
    return sorted(lat), time.perf_counter() - t0


async def baseline(tokenizer: Any, workers: int, calls: int, warmup: int) -> dict[str, float]:
    """The NullEngine awaited in-process with the gateway's prompt ids and parameters."""
    from tether.chat import render_prompt
    from tether.engine import SamplingParams

    engine = null_engine(tokenizer)
    prompt = render_prompt(tokenizer, MESSAGES, TOOLS)
    stops = tuple(sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}))
    params = SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=stops)

    async def call(_: int) -> None:
        await engine.generate(prompt, params)

    await drive(call, workers, warmup)
    lat, wall = await drive(call, workers, calls)
    return {"rate": calls / wall, "p50": pct(lat, 50), "p99": pct(lat, 99)}


class Client:
    """One rollout per worker; its calls go over a raw keep-alive HTTP/1.1 connection.

    The raw client costs ~0.1 ms of CPU per call, so on two cores the gateway,
    not the load generator, is what is measured. ``kind="httpx"`` sends the same
    calls through one keep-alive ``httpx.AsyncClient`` (what an OpenAI-SDK agent
    uses; ~1.3 ms of client CPU per call, and far more at 64 connections).
    """

    def __init__(self, url: str, key: str, workers: int, kind: str = "raw"):
        self.url, self.key, self.workers, self.kind = url, key, workers, kind
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        self.http = httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0)
        messages = [MESSAGES[0], {"role": "user", "content": USER.format(n="@N@")}]
        request = {
            "model": "policy",
            "messages": messages,
            "tools": TOOLS,
            "max_tokens": MAX_TOKENS,
        }
        self._head, self._tail = json.dumps(request).encode().split(b"@N@")
        self.sent = 0
        self.rollouts: list[tuple[str, dict[str, str]]] = []
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.bad: dict[int, int] = {}

    async def open(self) -> list[str]:
        admin = {"Authorization": f"Bearer {self.key}"}
        for _ in range(self.workers):
            r = await self.http.post("/admin/rollouts", json={"task": {"q": SYSTEM}}, headers=admin)
            r.raise_for_status()
            o = r.json()
            headers = {"Authorization": f"Bearer {o['token']}", "Content-Type": "application/json"}
            self.rollouts.append((f"/rollouts/{o['rollout_id']}/v1/chat/completions", headers))
            if self.kind == "raw":
                host, port = self.url.removeprefix("http://").split(":")
                self.conns.append(await asyncio.open_connection(host, int(port)))
        host = self.url.removeprefix("http://")
        self.raw_chat = [
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            for path, headers in self.rollouts
        ]
        self.raw_health = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        return [path.split("/")[2] for path, _ in self.rollouts]

    async def close(self) -> None:
        for _, writer in self.conns:
            writer.close()
        await self.http.aclose()

    async def _raw(self, worker: int, request: bytes) -> tuple[int, bytes]:
        reader, writer = self.conns[worker]
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        at = head.lower().index(b"content-length:") + 15
        return int(head[9:12]), await reader.readexactly(int(head[at : head.index(b"\r", at)]))

    def _check(self, status: int, body: bytes, expect: bytes) -> None:
        if status != 200 or expect not in body:
            self.bad[status] = self.bad.get(status, 0) + 1

    def body(self) -> bytes:
        """The next request body: the same system prompt and tool, a new user question."""
        self.sent += 1
        return self._head + str(10_000 + self.sent).encode() + self._tail

    async def chat(self, worker: int) -> None:
        body = self.body()
        if self.kind == "raw":
            head = f"{self.raw_chat[worker]}Content-Length: {len(body)}\r\n\r\n"
            status, body = await self._raw(worker, head.encode() + body)
        else:
            path, headers = self.rollouts[worker]
            r = await self.http.post(path, content=body, headers=headers)
            status, body = r.status_code, r.content
        self._check(status, body, b'"finish_reason":"tool_calls"')

    async def health(self, worker: int) -> None:
        if self.kind == "raw":
            status, body = await self._raw(worker, self.raw_health)
        else:
            r = await self.http.get("/healthz")
            status, body = r.status_code, r.content
        self._check(status, body, b'"ok"')


async def gateway_level(
    client: Client, server: psutil.Process, calls: int, warmup: int, *, floor: bool = False
) -> dict[str, float]:
    """Latency and rate of chat calls (or of ``GET /healthz`` with ``floor``) at one level."""
    call = client.health if floor else client.chat
    await drive(call, client.workers, warmup)
    me = psutil.Process()
    cpu0, mine0 = sum(server.cpu_times()[:2]), sum(me.cpu_times()[:2])
    lat, wall = await drive(call, client.workers, calls)
    cpu = (sum(server.cpu_times()[:2]) - cpu0) / calls
    mine = (sum(me.cpu_times()[:2]) - mine0) / calls
    return {
        "rate": calls / wall,
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "cpu": 1e3 * cpu,
        "client_cpu": 1e3 * mine,
    }


def count_stored(store_path: Path, rollouts: list[str]) -> int:
    from tether.store import Store

    with contextlib.closing(Store(store_path)) as store:
        return sum(len(store.calls(rid)) for rid in rollouts)


async def run(args: argparse.Namespace, starter: Path, tmp: Path) -> int:
    from tether.chat import render_prompt
    from tether.models import load_tokenizer

    tokenizer = load_tokenizer(starter)
    key = secrets.token_urlsafe(24)
    store_path = tmp / "traces.sqlite"
    proc, url, info = start_server(starter, store_path, key, args.loop)
    rows, rollouts, bad, sent = [], [], {}, 0
    try:
        server = psutil.Process(proc.pid)
        for c in args.concurrency:
            client = Client(url, key, c, args.client)
            try:
                rollouts += await client.open()
                if c == args.concurrency[0]:
                    floor = await gateway_level(client, server, args.calls, args.warmup, floor=True)
                stats = await gateway_level(client, server, args.calls, args.warmup)
                sent += args.calls + args.warmup
                for status, n in client.bad.items():
                    bad[status] = bad.get(status, 0) + n
            finally:
                await client.close()
            base = await baseline(tokenizer, c, args.calls, args.warmup)
            rows.append((c, stats, base))
    finally:
        stop_server(proc)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{args.calls} calls per level after {args.warmup} warm-up, {args.client} client; "
        f"{len(render_prompt(tokenizer, MESSAGES, TOOLS))} prompt + "
        f"{len(answer_ids(tokenizer))} completion tokens; "
        f"uvicorn {info}; {psutil.cpu_count()} CPUs, load average {load}"
    )
    head = ("clients", "calls/s", "p50 ms", "p99 ms", "base p50", "base p99", "added p50")
    print(" ".join(f"{h:>9}" for h in head), f"{'added p99':>9} {'CPU ms/call gw+client':>21}")
    for c, s, b in rows:
        cells = (s["rate"], s["p50"], s["p99"], b["p50"], b["p99"], s["p50"] - b["p50"])
        print(
            f"{c:>9}",
            " ".join(f"{v:>9.0f}" if i == 0 else f"{v:>9.3f}" for i, v in enumerate(cells)),
            f"{s['p99'] - b['p99']:>9.3f} {s['cpu']:>10.3f} +{s['client_cpu']:>9.3f}",
        )
    print(
        f"HTTP floor (GET /healthz, {args.concurrency[0]} client): {floor['rate']:.0f}/s, "
        f"p50 {floor['p50']:.3f} ms, p99 {floor['p99']:.3f} ms, "
        f"CPU ms/call gw {floor['cpu']:.3f} + client {floor['client_cpu']:.3f}"
    )
    stored = count_stored(store_path, rollouts)
    ok = stored == sent and not bad
    print(
        f"check: {stored} of {sent} chat calls stored, non-200/odd answers: {bad or 'none'}"
        f" -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per level")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls first")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--quick", action="store_true", help="300 calls, 50 warm-up")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw")
    parser.add_argument(
        "--turns", type=int, default=0, help="measure a conversation of this many tool turns"
    )
    parser.add_argument("--rollouts", type=int, default=60, help="conversations (with --turns)")
    parser.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the gateway's event loop; auto: uvloop if installed (as `tether serve`)",
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.warmup = 300, 50
    if args.calls < 1 or args.warmup < 0 or min(args.concurrency) < 1:
        parser.error("--calls and --concurrency must be >= 1, --warmup >= 0")
    if args.loop == "auto":
        args.loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    from tether.starter import build_starter

    starter = build_starter()
    with tempfile.TemporaryDirectory(prefix="gateway-overhead-") as tmp:
        if args.turns:
            from turns import run_turns

            return asyncio.run(run_turns(args, Path(starter), Path(tmp)))
        return asyncio.run(run(args, Path(starter), Path(tmp)))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
