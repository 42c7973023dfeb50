"""Throughput and CPU cost of the three local runner modes: process, pool, inprocess.

Each mode runs ``--rollouts`` rollouts (default 32) of a trivial agent that
makes one chat call with the official openai SDK, ``--concurrency`` at a time
(default 8), against a canned OpenAI-compatible server on 127.0.0.1. The
server is a separate process whose CPU is not counted; what is counted is this
process plus every agent/worker process it starts (psutil: live descendants
plus reaped children). ``cold`` includes starting the pool's workers or
importing the SDK in-process; ``warm`` is a second batch on the same runner.

    .venv/bin/python benchmarks/runner_modes.py [--rollouts 32] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from tether.runner import Launch, Runner, RunnerConfig, make_runner

AGENT = """
from openai import OpenAI

def main():
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    r = client.chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "What is 6*7?"}])
    print(r.choices[0].message.content)

async def agent(task, client):
    r = await client.chat.completions.create(
        model="starter", messages=[{"role": "user", "content": task["q"]}])
    return r.choices[0].message.content

if __name__ == "__main__":
    main()
"""

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "starter",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
).encode()


class _Canned(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(COMPLETION)))
        self.end_headers()
        self.wfile.write(COMPLETION)

    def log_message(self, *args: object) -> None:
        pass


def serve(port_file: str, handler: type[BaseHTTPRequestHandler] = _Canned) -> None:
    """Run the canned server (in its own process) and write its port to ``port_file``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


@dataclass
class Setup:
    """What a runner benchmark runs against: the agent file, the canned server, shared config."""

    agent: Path
    gateway: str
    server_pid: int
    common: dict[str, Any]


@contextlib.asynccontextmanager
async def canned_setup(script: str, concurrency: int) -> AsyncIterator[Setup]:
    """Write the agent to a temp dir and start ``script --serve`` (the canned server)."""
    with tempfile.TemporaryDirectory() as tmp:
        agent = Path(tmp, "bench_agent.py")
        agent.write_text(textwrap.dedent(AGENT))
        port_file = Path(tmp, "port")
        server = subprocess.Popen([sys.executable, script, "--serve", str(port_file)])
        try:
            while not port_file.exists() or not port_file.read_text():
                await asyncio.sleep(0.05)
            common = {"concurrency": concurrency, "cwd": tmp, "timeout_s": 120.0}
            yield Setup(agent, f"http://127.0.0.1:{port_file.read_text()}", server.pid, common)
        finally:
            server.terminate()
            server.wait()


def cpu_seconds(exclude: set[int]) -> float:
    """CPU (user+system) of this process, its reaped children and its live descendants."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        if child.pid in exclude:
            continue
        try:
            c = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += c.user + c.system
    return total


async def batch(runner: Runner, gateway: str, n: int, first: int) -> list[str | None]:
    launches = [
        Launch(f"r{i}", 1, f"{gateway}/rollouts/r{i}/v1", f"tok-{i}", {"q": "What is 6*7?"})
        for i in range(first, first + n)
    ]
    results = await asyncio.gather(*(runner.run(launch) for launch in launches))
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"{len(bad)} rollouts failed, e.g. {bad[0]}")
    return [r.final_answer for r in results]


async def measure(config: RunnerConfig, gateway: str, n: int, server_pid: int) -> list[tuple]:
    """``(mode, batch, rollouts/s, CPU s/rollout)`` for a cold batch and, if any, a warm one."""
    exclude = {server_pid}
    rows = []
    cpu0, t0 = cpu_seconds(exclude), time.perf_counter()
    runner = make_runner(config)  # in-process mode imports the SDK here
    answers = await batch(runner, gateway, n, 0)
    rate = n / (time.perf_counter() - t0)
    rows.append((config.mode, "cold", rate, (cpu_seconds(exclude) - cpu0) / n))
    if config.mode != "process":  # a fresh process per rollout has no warm state
        cpu1, t1 = cpu_seconds(exclude), time.perf_counter()
        answers += await batch(runner, gateway, n, n)
        rate = n / (time.perf_counter() - t1)
        rows.append((config.mode, "warm", rate, (cpu_seconds(exclude) - cpu1) / n))
    await runner.close()
    assert set(answers) == {"42"}, answers[:3]
    return rows


async def main(args: argparse.Namespace) -> None:
    async with canned_setup(__file__, args.concurrency) as setup:
        agent, common = setup.agent, setup.common
        configs = [
            RunnerConfig(mode="process", command=[sys.executable, str(agent)], **common),
            RunnerConfig(mode="pool", entry=f"{agent}:main", **common),
            RunnerConfig(mode="inprocess", entry=f"{agent}:agent", **common),
        ]
        rows = []
        for config in configs:
            rows += await measure(config, setup.gateway, args.rollouts, setup.server_pid)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{args.rollouts} rollouts per batch, concurrency {args.concurrency}, "
        f"{psutil.cpu_count()} CPUs, load average {load}"
    )
    print(f"{'mode':<10} {'batch':<6} {'rollouts/s':>11} {'CPU s/rollout':>14}")
    for mode, kind, rate, cpu in rows:
        print(f"{mode:<10} {kind:<6} {rate:>11.1f} {cpu:>14.3f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
