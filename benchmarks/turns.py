"""``gateway_overhead.py --turns N``: the gateway's CPU per call as a conversation grows.

Each of ``--rollouts`` agents calls the gateway once per turn: the system
prompt, the calculator tool, the question, then per earlier turn the
assistant's tool call (as the OpenAI SDK sends it back) and a tool result of
~100 tokens. Two gateway processes run side by side, one with the render
cache off (every call renders and tokenizes the whole history: the baseline)
and one with it on, called in alternation (A B, B A, ...): the CPU time of the
called gateway process over each call, summed per turn. The last turn of
each conversation is interleaved with the first turn of a new conversation,
so "turn N vs turn 1" is measured under the same load. A few unmeasured
conversations warm each gateway up first. Every call must be a 200 with the
tool call, and stored. (The null engine keeps no record of its calls here:
a growing heap would make the later turns pay for garbage collection.)
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


async def _cpu_of(proc: psutil.Process, call: Any) -> float:
    """The CPU time in ``proc`` while awaiting ``call`` (user + system, ms; clock ticks: exact only summed)."""
    c0 = sum(proc.cpu_times()[:2])
    await call
    return 1e3 * (sum(proc.cpu_times()[:2]) - c0)


async def run_turns(args: argparse.Namespace, starter: Path, tmp: Path) -> int:
    key = secrets.token_urlsafe(24)
    servers = {}
    for name, cache in (("off", False), ("on", True)):
        store = tmp / f"{name}.sqlite"
        proc, url, _ = start_server(
            starter, store, key, args.loop, render_cache=cache, long_context=True
        )
        servers[name] = (psutil.Process(proc.pid), proc, url, store)
    names = ("off", "on")
    n, last = args.rollouts, args.turns
    cpu = {name: [0.0] * last for name in names}  # summed over the conversations, per turn
    fresh_cpu = {name: 0.0 for name in names}
    bad: list[str] = []
    tokens: list[int] = []
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            for _, _, url, _ in servers.values():  # warm-up, not measured
                for conv in await _open(url, key, 4, http):
                    for _ in range(3):
                        await conv.turn(bad)
            convs = {m: await _open(s[2], key, n, http) for m, s in servers.items()}
            fresh = {m: await _open(s[2], key, n, http) for m, s in servers.items()}
            # Turns 1 .. N-1 (and N below), call by call: off, on, on, off, ...
            for t in range(last - 1):
                for i in range(n):
                    for name in names if (i + t) % 2 == 0 else names[::-1]:
                        conv = convs[name][i]
                        cpu[name][t] += await _cpu_of(servers[name][0], conv.turn(bad))
                tokens.append(convs["on"][0].prompt_tokens)
            # The headline: turn N of the long conversations interleaved with turn 1 of
            # fresh ones, so both are measured under the same load.
            for i in range(n):
                for name in names if i % 2 == 0 else names[::-1]:
                    proc, conv, new = servers[name][0], convs[name][i], fresh[name][i]
                    cpu[name][last - 1] += await _cpu_of(proc, conv.turn(bad))
                    fresh_cpu[name] += await _cpu_of(proc, new.turn(bad))
            tokens.append(convs["on"][0].prompt_tokens)
            ids = {m: [c.path.split("/")[-4] for c in convs[m] + fresh[m]] for m in names}
    finally:
        for _, proc, _, _ in servers.values():
            stop_server(proc)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(
        f"{n} conversations x {last} turns per gateway, render cache off / on, the two "
        f"gateways called in alternation; {psutil.cpu_count()} CPUs, load average {load}"
    )
    print(f"{'turn':>5} {'prompt tokens':>13} {'CPU ms/call off':>16} {'on':>8}")
    shown = sorted({1, 2, 5, 10, 20} & set(range(1, last)))
    for t in shown:
        print(
            f"{t:>5} {tokens[t - 1]:>13} {cpu['off'][t - 1] / n:>16.3f} {cpu['on'][t - 1] / n:>8.3f}"
        )
    print(f"turn {last} of {n} conversations interleaved with turn 1 of {n} new ones:")
    for name in names:
        one, end = fresh_cpu[name] / n, cpu[name][last - 1] / n
        print(
            f"  render cache {name:>3}: turn {last} ({tokens[-1]} prompt tokens) {end:.3f} ms, "
            f"turn 1 {one:.3f} ms of gateway CPU per call: {end / one:.2f}x"
        )
    stored = sum(count_stored(servers[m][3], ids[m]) for m in names)
    sent = 2 * n * (last + 1)  # (the warm-up's calls are not counted)
    ok = stored == sent and not bad
    print(
        f"check: {stored} of {sent} calls stored, failed: {bad[:3] or 'none'} -> {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1
