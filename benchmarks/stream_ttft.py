"""Time to the first streamed token: ``stream=True`` chat calls through a real gateway.

The untrained starter model (it never stops early, so every completion is
``--tokens`` long) in the embedded transformers engine, served by the gateway
on 127.0.0.1, called with the official ``openai`` client. Each round makes a
streamed call (time of the first content chunk, and of the last) and a plain
call (its total: when a gateway that buffers the completion could send its
first chunk), interleaved; greedy, so both generate the same tokens.

    .venv/bin/python benchmarks/stream_ttft.py [--tokens 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai
import psutil

MESSAGES = [
    {"role": "system", "content": "You are a careful calculator agent."},
    {"role": "user", "content": "What is 17 + 25? Explain every step."},
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from tether.engine import TransformersEngine
    from tether.gateway import BackgroundServer, Gateway, GatewayConfig, create_app
    from tether.starter import build_starter, load_model, load_tokenizer
    from tether.store import Store

    starter = Path(build_starter(warm=False))
    tokenizer = load_tokenizer(starter)
    engine = TransformersEngine(load_model(starter), tokenizer)
    with tempfile.TemporaryDirectory(prefix="stream-ttft-") as tmp:
        store = Store(Path(tmp) / "traces.sqlite")
        gw = Gateway(
            engine, tokenizer, store, GatewayConfig(admin_key="bench-admin-key-0123456789")
        )
        server = BackgroundServer(create_app(gw)).start()
        gw.config.public_url = server.url
        first, last, plain, n_tokens = [], [], [], []
        try:
            for r in range(args.rounds + 1):  # round 0 warms up
                opened = gw.open_rollout({"round": r})
                client = openai.OpenAI(base_url=opened.base_url, api_key=opened.token)
                kw = dict(model="policy", messages=MESSAGES, max_tokens=args.tokens, temperature=0)
                t0 = time.perf_counter()
                t_first = None
                for chunk in client.chat.completions.create(**kw, stream=True):
                    if chunk.choices and chunk.choices[0].delta.content and t_first is None:
                        t_first = time.perf_counter() - t0
                t_last = time.perf_counter() - t0
                t0 = time.perf_counter()
                client.chat.completions.create(**kw)
                t_plain = time.perf_counter() - t0
                calls = store.calls(opened.rollout_id)
                if r:
                    first.append(t_first or float("nan"))
                    last.append(t_last)
                    plain.append(t_plain)
                    n_tokens.append(len(calls[0].completion_ids))
        finally:
            server.stop()
            asyncio.run(engine.close())
            store.close()
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    med = statistics.median
    print(
        f"{args.rounds} rounds, {med(n_tokens):.0f}-token greedy completions, starter model on "
        f"CPU; {psutil.cpu_count()} CPUs, load average {load}"
    )
    print(
        f"stream=True: first content chunk at {med(first):.3f} s, last at {med(last):.3f} s "
        f"(median); first / last = {med(f / t for f, t in zip(first, last, strict=True)):.1%}"
    )
    print(f"plain call (a buffering gateway's first chunk): {med(plain):.3f} s (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
