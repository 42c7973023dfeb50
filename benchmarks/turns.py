"""``gateway_overhead.py --turns N``: the gateway's CPU per call as a conversation grows.

Each of ``--rollouts`` agents calls the gateway once per turn: the system
prompt, the calculator tool, the question, then per earlier turn the
assistant's tool call (as the OpenAI SDK sends it back) and a tool result of
~100 tokens. Two gateway processes run side by side, one with the render
cache off (every call renders and tokenizes the whole history: the baseline)
and one with it on; at every turn each serves the same calls, in alternating
order (A B, B A, ...), and the CPU time of its process over those calls is
divided by their number. A few unmeasured conversations warm each gateway up
first. Every call must be a 200 with the tool call, and stored.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import Any

import httpx
import psutil
from _calls import SYSTEM, TOOLS, USER
from gateway_overhead import MAX_TOKENS, count_stored, start_server, stop_server

RESULT = (
    "calculator result: 500-17*25 = 75. Intermediate values: 17*25 = 425; 500-425 = 75. "
    "Checked with exact integer arithmetic; no rounding was applied. Units: cents. "
    "Inputs: 500, 17, 25."
)


class Conversation:
    def __init__(self, http: httpx.AsyncClient, path: str, headers: dict[str, str], n: int):
        self.http, self.path, self.headers = http, path, headers
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER.format(n=n)},
        ]
        self.prompt_tokens = 0

    async def turn(self, bad: list[str]) -> None:
        body = {
            "model": "policy",
            "messages": self.messages,
            "tools": TOOLS,
            "max_tokens": MAX_TOKENS,
        }
        r = await self.http.post(self.path, json=body, headers=self.headers)
        if r.status_code != 200 or r.json()["choices"][0]["finish_reason"] != "tool_calls":
            bad.append(f"{r.status_code}: {r.text[:200]}")
            return
        out = r.json()
        self.prompt_tokens = out["usage"]["prompt_tokens"]
        message = out["choices"][0]["message"]
        self.messages.append(
            {
                "role": "assistant",
                "content": message["content"],
                "tool_calls": message["tool_calls"],
            }
        )
        for call in message["tool_calls"]:
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULT})


async def _open(url: str, key: str, count: int, http: httpx.AsyncClient) -> list[Conversation]:
    admin = {"Authorization": f"Bearer {key}"}
    out = []
    for i in range(count):
        r = await http.post(f"{url}/admin/rollouts", json={"task": {"i": i}}, headers=admin)
        r.raise_for_status()
        o = r.json()
        path = f"{url}/rollouts/{o['rollout_id']}/v1/chat/completions"
        out.append(Conversation(http, path, {"Authorization": f"Bearer {o['token']}"}, 1000 + i))
    return out


async def run_turns(args: argparse.Namespace, starter: Path, tmp: Path) -> int:
    key = secrets.token_urlsafe(24)
    servers = {}
    for name, cache in (("off", False), ("on", True)):
        store = tmp / f"{name}.sqlite"
        proc, url, _ = start_server(
            starter, store, key, args.loop, render_cache=cache, long_context=True
        )
        servers[name] = (proc, url, store)
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    bad: list[str] = []
    tokens: list[int] = []
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            for _, url, _ in servers.values():  # warm-up, not measured
                for conv in await _open(url, key, 4, http):
                    for _ in range(3):
                        await conv.turn(bad)
            convs = {
                n: await _open(url, key, args.rollouts, http) for n, (_, url, _) in servers.items()
            }
            ids = {n: [c.path.split("/")[-4] for c in cs] for n, cs in convs.items()}
            for t in range(args.turns):
                order = ("off", "on") if t % 2 == 0 else ("on", "off")
                for name in order:
                    proc = psutil.Process(servers[name][0].pid)
                    c0 = sum(proc.cpu_times()[:2])
                    for conv in convs[name]:
                        await conv.turn(bad)
                    cpu[name].append(1e3 * (sum(proc.cpu_times()[:2]) - c0) / args.rollouts)
                tokens.append(convs["on"][0].prompt_tokens)
    finally:
        for proc, _, _ in servers.values():
            stop_server(proc)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{args.rollouts} conversations x {args.turns} turns per gateway (render cache off / on, "
        f"alternating per turn); {psutil.cpu_count()} CPUs, load average {load}"
    )
    print(f"{'turn':>5} {'prompt tokens':>13} {'CPU ms/call off':>16} {'on':>8}")
    shown = sorted({1, 2, 5, 10, 20, args.turns} & set(range(1, args.turns + 1)))
    for t in shown:
        print(f"{t:>5} {tokens[t - 1]:>13} {cpu['off'][t - 1]:>16.3f} {cpu['on'][t - 1]:>8.3f}")
    w = min(3, args.turns)
    for name in ("off", "on"):
        first, last = cpu[name][0], cpu[name][-1]
        head, tail = sum(cpu[name][:w]) / w, sum(cpu[name][-w:]) / w
        print(
            f"render cache {name:>3}: turn {args.turns} / turn 1 = {last:.3f} / {first:.3f} ms "
            f"= {last / first:.2f}x; last {w} turns / first {w} = {tail / head:.2f}x"
        )
    stored = sum(count_stored(servers[n][2], ids[n]) for n in servers)
    sent = 2 * args.rollouts * args.turns  # (the warm-up's calls are not counted)
    ok = stored == sent and not bad
    print(
        f"check: {stored} of {sent} calls stored, failed: {bad[:3] or 'none'} -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1
