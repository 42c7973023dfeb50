"""Time to the first streamed token: ``stream=True`` chat calls through a real gateway.

``tether serve --model <the untrained starter>`` (it never stops early, so
every completion is ``--tokens`` long) in its own process, called with the
official ``openai`` client from this one. Each round makes a streamed call
(time of the first content chunk, and of the last) and a plain call (its
total: when a gateway that buffers the completion could send its first
chunk), interleaved; greedy, so both generate the same tokens.

    .venv/bin/python benchmarks/stream_ttft.py [--tokens 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import psutil

MESSAGES = [
    {"role": "system", "content": "You are a careful calculator agent."},
    {"role": "user", "content": "What is 17 + 25? Explain every step."},
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from tether.starter import build_starter

    starter = Path(build_starter(warm=False))
    key, port = secrets.token_urlsafe(24), _port()
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {key}"}
    first, last, plain, n_tokens = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="stream-ttft-") as tmp:
        cmd = [sys.executable, "-m", "tether.cli", "serve", "--model", str(starter)]
        cmd += ["--port", str(port), "--store", str(Path(tmp) / "traces.sqlite")]
        env = {**os.environ, "TETHER_ADMIN_KEY": key}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("tether serve did not come up")
                time.sleep(0.2)
            for r in range(args.rounds + 1):  # round 0 warms up
                o = httpx.post(f"{base}/admin/rollouts", json={"task": {"r": r}}, headers=admin)
                o.raise_for_status()
                client = openai.OpenAI(base_url=o.json()["base_url"], api_key=o.json()["token"])
                kw = dict(model="policy", messages=MESSAGES, max_tokens=args.tokens, temperature=0)
                t0 = time.perf_counter()
                t_first = None
                for chunk in client.chat.completions.create(**kw, stream=True):
                    if chunk.choices and chunk.choices[0].delta.content and t_first is None:
                        t_first = time.perf_counter() - t0
                t_last = time.perf_counter() - t0
                t0 = time.perf_counter()
                resp = client.chat.completions.create(**kw)
                if r:
                    first.append(t_first or float("nan"))
                    last.append(t_last)
                    plain.append(time.perf_counter() - t0)
                    n_tokens.append(resp.usage.completion_tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    med = statistics.median
    print(
        f"{args.rounds} rounds, {med(n_tokens):.0f}-token greedy completions, untrained starter "
        f"model, tether serve on CPU; {psutil.cpu_count()} CPUs, load average {load}"
    )
    print(
        f"stream=True: first content chunk at {med(first):.3f} s, last at {med(last):.3f} s "
        f"(median); first / last = {med(f / t for f, t in zip(first, last, strict=True)):.1%}"
    )
    print(f"plain call (a buffering gateway's first chunk): {med(plain):.3f} s (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
