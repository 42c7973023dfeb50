"""Load on the running gateway: 10,000 calls over 200 rollouts with 32 in flight (SECURITY.md, case 8).

The gateway runs in its own process as the trainer runs it (``LoopServer``:
real uvicorn on 127.0.0.1) over the starter tokenizer, a NullEngine that
answers a fixed 25-token tool call at once (its call log, kept for tests,
bounded to 100 entries: unbounded it holds ~7 KB a call and grows the RSS by
~70 MiB over 10,000 calls), and a real SQLite store in a temporary folder;
tether's loggers write INFO and above to a file. This
process is the load generator: it creates the rollouts through the admin
API, then ``--concurrency`` workers, each with its own keep-alive
``httpx.AsyncClient`` (as each agent has its own), send chat calls (system prompt, one tool, a different question each
time). A rollout is held by one worker per call, as an agent calls one at a
time; after its ``calls / rollouts`` calls it is finished with a reward
through the admin API, while the other rollouts keep calling. The RSS of
the gateway process is sampled every 50 ms.

Checks: every answer a 200 with the tool call (no 5xx), "database is locked"
in no answer and no log line, each rollout's calls stored with ``seq``
0..k-1 in attempt 1 and the rollout succeeded, and the gateway's RSS growth
(peak minus the RSS before the load) within ``--max-rss-growth-mib``.

Baseline, same run: the same client and load against a bare FastAPI app on
the same uvicorn settings that parses the JSON body and answers a fixed chat
completion (no auth check against a store, no template, no engine, no
store): the difference is what the gateway itself costs.

    .venv/bin/python benchmarks/gateway_load.py [--calls 10000] [--rollouts 200]
        [--concurrency 32] [--max-rss-growth-mib 32]

The machine is shared, so rates and latencies move with its load; the CPU
time per call of each process moves less.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
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
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

EXPECT = b'"finish_reason":"tool_calls"'
LOCKED = "database is locked"


# -- the server processes ----------------------------------------------------------


def echo_app() -> FastAPI:
    """The baseline: parse the body, answer a fixed chat completion with a tool call."""
    app = FastAPI()
    call = {"name": "calculator", "arguments": json.dumps({"expression": "500-17*25"})}
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
    }

    @app.post("/rollouts/{rollout_id}/v1/chat/completions")
    async def chat(rollout_id: str, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        return JSONResponse(
            {
                "id": f"chatcmpl-{secrets.token_hex(8)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 190, "completion_tokens": 25, "total_tokens": 215},
            }
        )

    return app


def serve(kind: str, starter: str, store_path: str) -> None:
    """Run the gateway (or the echo app) until SIGTERM; print ``PORT <n>`` once it listens."""
    from tether.engine.testing import NullEngine
    from tether.gateway import Gateway, GatewayConfig, LoopServer, create_app
    from tether.models import load_tokenizer
    from tether.store import Store

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")

    async def main() -> None:
        store = None
        if kind == "gateway":
            tokenizer = load_tokenizer(starter)
            end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            engine = NullEngine([*tokenizer.encode(ANSWER, add_special_tokens=False), end])
            # The fake's call log (for tests) would be taken for the gateway's memory.
            engine.calls = collections.deque(maxlen=100)  # type: ignore[assignment]
            store = Store(store_path)
            config = GatewayConfig(admin_key=os.environ[KEY_ENV], port=0)
            app = create_app(Gateway(engine, tokenizer, store, config))
        else:
            app = echo_app()
        server = await LoopServer(app, "127.0.0.1", 0).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(f"PORT {server.port}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()
            if store is not None:
                store.close()

    asyncio.run(main())


@contextlib.contextmanager
def server_process(kind: str, starter: Path, tmp: Path, key: str) -> Any:
    """The server as a subprocess: yields (its URL, its psutil.Process); stderr goes to a log file."""
    log = open(tmp / f"{kind}.log", "w")  # noqa: SIM115 - closed below
    args = [sys.executable, __file__, "--serve", kind, str(starter), str(tmp / "traces.sqlite")]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, KEY_ENV: key}
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("PORT "):
            raise SystemExit(f"the {kind} process did not start (said {line!r})")
        yield f"http://127.0.0.1:{line.split()[1]}", psutil.Process(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


# -- the load ------------------------------------------------------------------------


class Load:
    """``calls`` chat calls over the given rollouts, ``concurrency`` at a time, one per rollout."""

    def __init__(self, url: str, rollouts: list[tuple[str, str]], calls: int):
        self.url, self.rollouts = url, rollouts
        share, extra = divmod(calls, len(rollouts))
        self.quota = [share + (i < extra) for i in range(len(rollouts))]
        self.left = list(self.quota)
        self.latencies: list[float] = []
        self.codes: collections.Counter[int] = collections.Counter()
        self.odd = 0  # a 200 without the tool call
        self.locked = 0  # answers that say "database is locked"
        self.sent = 0
        self.on_done: Any = None  # async (rollout index) -> None, after its last call

    async def run(self, concurrency: int) -> float:
        ready = collections.deque(i for i, n in enumerate(self.quota) if n)
        head, tail = (
            json.dumps(
                {
                    "model": "policy",
                    "messages": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": USER.format(n="@N@")},
                    ],
                    "tools": TOOLS,
                    "max_tokens": 64,
                }
            )
            .encode()
            .split(b"@N@")
        )

        async def worker() -> None:
            async with httpx.AsyncClient(base_url=self.url, timeout=120.0) as http:
                await calls(http)

        async def calls(http: httpx.AsyncClient) -> None:
            while ready:
                i = ready.popleft()
                rid, token = self.rollouts[i]
                self.sent += 1
                body = head + str(self.sent).encode() + tail
                headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                t0 = time.perf_counter()
                r = await http.post(
                    f"/rollouts/{rid}/v1/chat/completions", content=body, headers=headers
                )
                self.latencies.append(time.perf_counter() - t0)
                self.codes[r.status_code] += 1
                self.locked += LOCKED.encode() in r.content
                self.odd += r.status_code == 200 and EXPECT not in r.content
                self.left[i] -= 1
                if self.left[i]:
                    ready.append(i)
                elif self.on_done is not None:
                    await self.on_done(i)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        self.latencies.sort()
        return time.perf_counter() - t0


async def sample_rss(
    proc: psutil.Process, load: Load, out: list[tuple[int, int]], stop: asyncio.Event
) -> None:
    """Append (calls sent so far, RSS) every 50 ms until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            out.append((load.sent, proc.memory_info().rss))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def measure(
    kind: str, url: str, server: psutil.Process, key: str, args: argparse.Namespace
) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as http:
        if kind == "gateway":
            rollouts = []
            for i in range(args.rollouts):
                r = await http.post("/admin/rollouts", json={"task": {"i": i}}, headers=admin)
                r.raise_for_status()
                rollouts.append((r.json()["rollout_id"], r.json()["token"]))
        else:
            rollouts = [(f"r-{i}", "t") for i in range(args.rollouts)]
        load = Load(url, rollouts, args.calls)
        finished: collections.Counter[int] = collections.Counter()
        if kind == "gateway":

            async def finish(i: int) -> None:
                r = await http.post(
                    f"/admin/rollouts/{rollouts[i][0]}/finish",
                    json={"status": "succeeded", "reward": 1.0},
                    headers=admin,
                )
                finished[r.status_code] += 1
                load.locked += LOCKED.encode() in r.content

            load.on_done = finish
        rss: list[tuple[int, int]] = []
        stop = asyncio.Event()
        rss_start = server.memory_info().rss
        sampler = asyncio.create_task(sample_rss(server, load, rss, stop))
        me = psutil.Process()
        cpu0, mine0 = sum(server.cpu_times()[:2]), sum(me.cpu_times()[:2])
        wall = await load.run(args.concurrency)
        cpu = sum(server.cpu_times()[:2]) - cpu0
        mine = sum(me.cpu_times()[:2]) - mine0
        stop.set()
        await sampler
    n = len(load.latencies)
    return {
        "kind": kind,
        "load": load,
        "rollouts": rollouts,
        "finished": finished,
        "rate": n / wall,
        "wall": wall,
        "p50": pct(load.latencies, 50),
        "p99": pct(load.latencies, 99),
        "max": 1e3 * load.latencies[-1],
        "cpu": 1e3 * cpu / n,
        "client_cpu": 1e3 * mine / n,
        "rss": (rss_start, max([rss_start, *(m for _, m in rss)]), server.memory_info().rss),
        # the peak RSS within each quarter of the calls
        "quarters": [
            max([0, *(m for k, m in rss if q * n / 4 < k <= (q + 1) * n / 4)]) for q in range(4)
        ],
    }


def check_store(store_path: Path, result: dict[str, Any]) -> list[str]:
    """Each rollout: ``seq`` 0..k-1, all in attempt 1, all ok, and the rollout succeeded."""
    from tether.store import Store

    problems = []
    load: Load = result["load"]
    with contextlib.closing(Store(store_path)) as store:
        for (rid, _), quota in zip(result["rollouts"], load.quota, strict=True):
            calls = store.calls(rid)
            if [c.seq for c in calls] != list(range(quota)):
                problems.append(f"{rid}: seq {[c.seq for c in calls][:8]}... != 0..{quota - 1}")
            if any(c.attempt != 1 or c.status.value != "ok" for c in calls):
                problems.append(f"{rid}: a call not ok or not in attempt 1")
            rollout = store.get_rollout(rid)
            if rollout is None or rollout.status.value != "succeeded":
                problems.append(f"{rid}: rollout {rollout and rollout.status.value}")
    return problems


async def run(args: argparse.Namespace, starter: Path, tmp: Path) -> int:
    key = secrets.token_urlsafe(24)
    results = {}
    for kind in ("gateway", "echo"):
        with server_process(kind, starter, tmp, key) as (url, server):
            results[kind] = await measure(kind, url, server, key, args)
    gw, echo = results["gateway"], results["echo"]
    logs = (tmp / "gateway.log").read_text()
    problems = check_store(tmp / "traces.sqlite", gw)
    load = psutil.getloadavg()
    print(
        f"{args.calls} calls over {args.rollouts} rollouts, {args.concurrency} in flight, "
        f"httpx clients in this process, server in its own; {psutil.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    head = ("calls/s", "p50 ms", "p99 ms", "max ms", "CPU ms/call server", "client")
    print(f"{'':34}" + "".join(f"{h:>10}" for h in head[:4]) + f"{head[4]:>20}{head[5]:>8}")
    names = {
        "gateway": "gateway (NullEngine, SQLite)",
        "echo": "baseline: bare FastAPI echo",
    }
    for r in (gw, echo):
        cells = f"{r['rate']:>10.0f}{r['p50']:>10.2f}{r['p99']:>10.2f}{r['max']:>10.1f}"
        print(f"{names[r['kind']]:34}{cells}{r['cpu']:>20.3f}{r['client_cpu']:>8.3f}")
    print(
        f"{'the gateway adds':34}{'':>10}{gw['p50'] - echo['p50']:>+10.2f}"
        f"{gw['p99'] - echo['p99']:>+10.2f}{'':>10}{gw['cpu'] - echo['cpu']:>+20.3f}"
    )
    mib = [v / 2**20 for v in gw["rss"]]
    growth = mib[1] - mib[0]
    print(
        f"gateway RSS: start {mib[0]:.1f} MiB, peak {mib[1]:.1f} MiB, end {mib[2]:.1f} MiB "
        f"(growth {growth:.1f} MiB, limit {args.max_rss_growth_mib}); peak per quarter of the "
        f"calls: {', '.join(f'{v / 2**20:.1f}' for v in gw['quarters'])} MiB"
    )
    gl: Load = gw["load"]
    bad = {c: n for c, n in gl.codes.items() if c != 200}
    checks = {
        "no 5xx": not any(c >= 500 for c in gl.codes),
        "every answer a 200 with the tool call": not bad and not gl.odd,
        f"no {LOCKED!r} in answers or logs": not gl.locked and LOCKED not in logs,
        "no traceback in the gateway's log": "Traceback" not in logs,
        f"{args.rollouts} rollouts finished (200)": gw["finished"] == {200: args.rollouts},
        "gap-free seq per rollout, all stored, all succeeded": not problems,
        "RSS bounded": growth <= args.max_rss_growth_mib,
        "baseline: every answer a 200": set(echo["load"].codes) == {200},
    }
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for p in problems[:10]:
        print(f"       {p}")
    if bad or gl.odd:
        print(f"       non-200: {bad}, 200 without the tool call: {gl.odd}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight")
    parser.add_argument("--max-rss-growth-mib", type=float, default=32.0)
    args = parser.parse_args()
    if min(args.calls, args.rollouts, args.concurrency) < 1 or args.calls < args.rollouts:
        parser.error("--calls >= --rollouts >= 1 and --concurrency >= 1")
    if args.concurrency > args.rollouts:
        parser.error("--concurrency must be <= --rollouts (one call per rollout at a time)")
    from tether.starter import build_starter

    starter = build_starter()
    with tempfile.TemporaryDirectory(prefix="gateway-load-") as tmp:
        return asyncio.run(run(args, Path(starter), Path(tmp)))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
