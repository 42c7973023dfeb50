"""tether's gateway against a LiteLLM proxy: added latency and calls/s over a model that costs nothing.

Three servers on 127.0.0.1, each its own process:

- a null upstream: a minimal OpenAI-compatible HTTP/1.1 server (raw asyncio)
  that answers every ``POST .../chat/completions`` at once with a fixed
  assistant tool call; the baseline is a client talking to it directly;
- LiteLLM's proxy (``litellm --config``, one worker, no database, no
  callbacks) in front of that upstream;
- tether's gateway as the trainer runs it (``benchmarks/gateway_overhead.py``'s
  server: LoopServer, starter tokenizer and chat template, SQLite store)
  over a NullEngine that returns the same tool call as token ids.

The same client (raw keep-alive HTTP/1.1, ~0.1 ms of CPU per call) sends the
same chat request (system prompt, a new user question each call, one tool)
at each concurrency to each server. "added" = the server's latency minus the
direct upstream's at the same percentile: what putting the gateway in front
of a model server costs a caller. tether's gateway does more per call than
the proxy (template, tokenization, tool-call parsing, a SQLite write); the
target is ≤ 1/5 of LiteLLM's added latency.

LiteLLM runs from its own virtual environment (its pins clash with
tether's)::

    python3.11 -m venv .bench-venv
    .bench-venv/bin/pip install 'litellm[proxy]==1.106.12'
    .venv/bin/python benchmarks/gateway_vs_litellm.py [--calls 1000] [--warmup 100]
        [--concurrency 1 64] [--litellm .bench-venv/bin/litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import gateway_overhead as go  # noqa: E402  (the tether server, messages, percentiles)

MASTER_KEY = "sk-bench-" + secrets.token_hex(8)
TOOL_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "calculator", "arguments": json.dumps({"expression": "500-17*25"})},
}


# -- the null upstream ---------------------------------------------------------------


def null_body() -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-null",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 194, "completion_tokens": 25, "total_tokens": 219},
        }
    ).encode()


def serve_null() -> None:
    """Answer every request with the fixed completion (``GET`` too: some clients probe)."""
    body = null_body()
    reply = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                low = head.lower()
                at = low.find(b"content-length:")
                if at >= 0:
                    n = int(low[at + 15 : low.index(b"\r", at)])
                    await reader.readexactly(n)
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()

    asyncio.run(main())


def start_null() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-null"], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the null upstream did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


# -- LiteLLM -------------------------------------------------------------------------


def start_litellm(binary: str, upstream: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    config = tmp / "litellm.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "model_list": [
                    {
                        "model_name": "policy",
                        "litellm_params": {
                            "model": "openai/policy",
                            "api_base": f"{upstream}/v1",
                            "api_key": "none",
                        },
                    }
                ],
                "general_settings": {"master_key": MASTER_KEY},
                "litellm_settings": {"telemetry": False, "drop_params": True},
            }
        )
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network on start
        "LITELLM_LOG": "ERROR",
        "LITELLM_MODE": "PRODUCTION",
        "DISABLE_SCHEMA_UPDATE": "True",
    }
    env.pop("DATABASE_URL", None)
    args = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    log = open(tmp / "litellm.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    import httpx

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"LiteLLM exited at start; see its log:\n{(tmp / 'litellm.log').read_text()[-2000:]}"
            )
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    go.stop_server(proc)
    raise SystemExit("LiteLLM did not answer /health/liveliness within 180 s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the client ------------------------------------------------------------------------


class RawClient:
    """One keep-alive HTTP/1.1 connection per worker; ``paths[w]`` and ``auth[w]`` per worker."""

    def __init__(self, url: str, paths: list[str], auth: list[str]):
        self.url, self.paths, self.auth = url, paths, auth
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        request = {
            "model": "policy",
            "messages": [go.MESSAGES[0], {"role": "user", "content": go.USER.format(n="@N@")}],
            "tools": go.TOOLS,
            "max_tokens": go.MAX_TOKENS,
        }
        self._head, self._tail = json.dumps(request).encode().split(b"@N@")
        self.sent = 0
        self.bad: dict[int, int] = {}

    async def open(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        for _ in self.paths:
            self.conns.append(await asyncio.open_connection(host, int(port)))

    def close(self) -> None:
        for _, writer in self.conns:
            writer.close()

    async def chat(self, w: int) -> None:
        self.sent += 1
        body = self._head + str(10_000 + self.sent).encode() + self._tail
        head = (
            f"POST {self.paths[w]} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.auth[w]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        reader, writer = self.conns[w]
        writer.write(head.encode() + body)
        resp = await reader.readuntil(b"\r\n\r\n")
        low = resp.lower()
        if b"transfer-encoding: chunked" in low:
            data = await read_chunked(reader)
        else:
            at = low.index(b"content-length:") + 15
            data = await reader.readexactly(int(low[at : low.index(b"\r", at)]))
        status = int(resp[9:12])
        if status != 200 or b'"calculator"' not in data:
            self.bad[status] = self.bad.get(status, 0) + 1


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return out
        out += chunk[:-2]


async def level(client: RawClient, pid: int | None, calls: int, warmup: int) -> dict[str, float]:
    await client.open()
    try:
        await go.drive(client.chat, len(client.paths), warmup)
        proc = psutil.Process(pid) if pid else None
        cpu0 = sum(proc.cpu_times()[:2]) if proc else 0.0
        lat, wall = await go.drive(client.chat, len(client.paths), calls)
        cpu = (sum(proc.cpu_times()[:2]) - cpu0) / calls if proc else 0.0
    finally:
        client.close()
    return {
        "rate": calls / wall,
        "p50": go.pct(lat, 50),
        "p99": go.pct(lat, 99),
        "cpu": 1e3 * cpu,
    }


async def tether_paths(url: str, key: str, workers: int) -> tuple[list[str], list[str], list[str]]:
    import httpx

    paths, tokens, ids = [], [], []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(workers):
            r = await http.post(
                "/admin/rollouts",
                json={"task": {"q": "bench"}},
                headers={"Authorization": f"Bearer {key}"},
            )
            r.raise_for_status()
            o = r.json()
            paths.append(f"/rollouts/{o['rollout_id']}/v1/chat/completions")
            tokens.append(o["token"])
            ids.append(o["rollout_id"])
    return paths, tokens, ids


async def run(args: argparse.Namespace, tmp: Path) -> int:
    from tether.starter import build_starter

    starter = Path(build_starter())
    null, null_url = start_null()
    key = secrets.token_urlsafe(24)
    store_path = tmp / "traces.sqlite"
    procs = [null]
    results: dict[str, dict[int, dict[str, float]]] = {"direct": {}, "litellm": {}, "tether": {}}
    sent, rollouts, bad = 0, [], {}
    try:
        lite, lite_url = start_litellm(args.litellm, null_url, tmp)
        procs.append(lite)
        gw, gw_url, _ = go.start_server(starter, store_path, key, "asyncio")
        procs.append(gw)
        for c in args.concurrency:
            direct = RawClient(null_url, ["/v1/chat/completions"] * c, ["none"] * c)
            results["direct"][c] = await level(direct, null.pid, args.calls, args.warmup)
            lclient = RawClient(lite_url, ["/v1/chat/completions"] * c, [MASTER_KEY] * c)
            results["litellm"][c] = await level(lclient, lite.pid, args.calls, args.warmup)
            paths, tokens, ids = await tether_paths(gw_url, key, c)
            rollouts += ids
            tclient = RawClient(gw_url, paths, tokens)
            results["tether"][c] = await level(tclient, gw.pid, args.calls, args.warmup)
            sent += args.calls + args.warmup
            for client in (direct, lclient, tclient):
                for s, n in client.bad.items():
                    bad[s] = bad.get(s, 0) + n
    finally:
        for p in reversed(procs):
            go.stop_server(p)
    stored = go.count_stored(store_path, rollouts)
    import importlib.metadata as md

    version = subprocess.run(
        [
            str(Path(args.litellm).parent / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{args.calls} calls per level after {args.warmup} warm-up; LiteLLM {version}, "
        f"tether {md.version('tether') if _installed('tether') else '(source)'}; "
        f"{psutil.cpu_count()} CPUs, load average {load}"
    )
    head = ("clients", "server", "calls/s", "p50 ms", "p99 ms", "added p50", "added p99")
    print(" ".join(f"{h:>9}" for h in head), f"{'CPU ms/call':>11}")
    for c in args.concurrency:
        base = results["direct"][c]
        for name in ("direct", "litellm", "tether"):
            s = results[name][c]
            print(
                f"{c:>9} {name:>9} {s['rate']:>9.0f} {s['p50']:>9.2f} {s['p99']:>9.2f} "
                f"{s['p50'] - base['p50']:>9.2f} {s['p99'] - base['p99']:>9.2f} {s['cpu']:>11.2f}"
            )
        lite, teth = results["litellm"][c], results["tether"][c]
        ratio = (teth["p50"] - base["p50"]) / max(lite["p50"] - base["p50"], 1e-9)
        print(
            f"{'':>9} tether/LiteLLM added p50: {ratio:.2f} (target <= 0.20); "
            f"calls/s {teth['rate'] / lite['rate']:.1f}×"
        )
    ok = stored == sent and not bad
    print(
        f"check: {stored} of {sent} tether calls stored, non-200/odd answers: {bad or 'none'}"
        f" -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000, help="measured calls per level and server")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--litellm", default=str(HERE.parent / ".bench-venv/bin/litellm"))
    args = p.parse_args()
    if args.calls < 1 or args.warmup < 0 or min(args.concurrency) < 1:
        p.error("--calls and --concurrency must be >= 1, --warmup >= 0")
    if not Path(args.litellm).exists():
        p.error(
            f"no LiteLLM at {args.litellm}; install it: python3.11 -m venv .bench-venv && "
            ".bench-venv/bin/pip install 'litellm[proxy]==1.106.12'"
        )
    with tempfile.TemporaryDirectory(prefix="gateway-vs-litellm-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-null"]:
        serve_null()
        sys.exit(0)
    sys.exit(main())
