"""Runner overhead: time from "rollout queued" to the agent's first model call, and rollouts/s.

A trivial agent (one chat call with the official openai SDK) runs under each
runner: local ``process``, ``pool`` and ``inprocess``, and Ray (a local
``ray.init``, the agent as an in-process async agent and as a command inside
the Ray task). The model server is the canned OpenAI-compatible server of
``runner_modes.py`` in its own process, extended to note when each rollout's
first request arrives (wall clock, shared by all processes). "queued" is the
moment the batch is handed to the runner, so with ``--concurrency`` below
``--rollouts`` the latency includes waiting for a slot. Each runner does a
cold batch (workers, SDK import, Ray workers start) and a warm one;
``process`` has no warm state. The baseline is in-process, in the same run.

    .venv/bin/python benchmarks/runner_overhead.py [--rollouts 16] [--concurrency 8] [--no-ray]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.request

import psutil
from runner_modes import _Canned, canned_setup, serve

from tether.runner import Launch, Runner, RunnerConfig, make_runner

FIRST_CALL: dict[str, float] = {}  # rollout id -> wall time of its first request (server side)


class _Noting(_Canned):
    def do_POST(self) -> None:
        parts = self.path.split("/")
        if len(parts) > 2 and parts[1] == "rollouts":
            FIRST_CALL.setdefault(parts[2], time.time())
        super().do_POST()

    def do_GET(self) -> None:
        body = json.dumps(FIRST_CALL).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def first_calls(gateway: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{gateway}/first") as resp:
        return json.loads(resp.read())


async def batch(runner: Runner, gateway: str, n: int, tag: str) -> tuple[float, list[float]]:
    """``(rollouts/s, [queued -> first call seconds])`` for ``n`` rollouts."""
    ids = [f"{tag.replace(' ', '_')}-{i}" for i in range(n)]
    launches = [Launch(r, 1, f"{gateway}/rollouts/{r}/v1", "tok", {"q": "6*7"}) for r in ids]
    queued = time.time()
    results = await asyncio.gather(*(runner.run(launch) for launch in launches))
    wall = time.time() - queued
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"{len(bad)} rollouts failed under {tag}, e.g. {bad[0]}")
    seen = first_calls(gateway)
    return n / wall, [seen[r] - queued for r in ids]


async def measure(name: str, config: RunnerConfig, gateway: str, n: int) -> list[tuple]:
    runner = make_runner(config)
    rows = []
    kinds = ["cold"] if config.mode == "process" and config.runner == "local" else ["cold", "warm"]
    for kind in kinds:
        rate, lat = await batch(runner, gateway, n, f"{name}-{kind}")
        rows.append((name, kind, rate, statistics.median(lat), max(lat)))
    await runner.close()
    return rows


async def main(args: argparse.Namespace) -> None:
    async with canned_setup(__file__, args.concurrency) as setup:
        agent, common, gateway = setup.agent, setup.common, setup.gateway
        command = [sys.executable, str(agent)]
        configs = [
            ("inprocess", RunnerConfig(mode="inprocess", entry=f"{agent}:agent", **common)),
            ("pool", RunnerConfig(mode="pool", entry=f"{agent}:main", **common)),
            ("process", RunnerConfig(mode="process", command=command, **common)),
        ]
        ray_init = None
        if not args.no_ray:
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=args.concurrency, include_dashboard=False, log_to_driver=False)
            ray_init = time.perf_counter() - t0
            ray_cfg = {"runner": "ray", "ray": {"num_cpus": 1}, **common}
            configs += [
                ("ray inprocess", _build(mode="inprocess", agent=f"{agent}:agent", **ray_cfg)),
                ("ray process", _build(mode="process", command=command, **ray_cfg)),
            ]
        rows = []
        for name, config in configs:
            rows += await measure(name, config, gateway, args.rollouts)
        if ray_init is not None:
            ray.shutdown()
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{args.rollouts} rollouts per batch, concurrency {args.concurrency}, "
        f"{psutil.cpu_count()} CPUs, load average {load}"
        + (f", ray.init {ray_init:.1f}s (not counted)" if ray_init is not None else "")
    )
    base = {kind: rate for name, kind, rate, _, _ in rows if name == "inprocess"}
    print(
        f"{'runner':<14} {'batch':<6} {'rollouts/s':>10} {'vs inproc':>9} "
        f"{'queued->1st call median':>23} {'max':>7}"
    )
    for name, kind, rate, median, worst in rows:
        ratio = rate / base.get(kind, base["cold"])
        print(
            f"{name:<14} {kind:<6} {rate:>10.1f} {ratio:>8.2f}x {median * 1000:>20.0f} ms "
            f"{worst * 1000:>5.0f} ms"
        )


def _build(**data: object) -> RunnerConfig:
    from tether.configio import build

    return build(RunnerConfig, dict(data))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2], _Noting)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runner")
    asyncio.run(main(parser.parse_args()))
