"""The local runner, in-process mode and the pool worker script (split from test_runner.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

import tether.runner
from tests.helpers import launch, script
from tether.records import RolloutStatus
from tether.runner import (
    AgentLoadError,
    InProcessRunner,
    Launch,
    RunnerConfig,
    make_runner,
)

PY = sys.executable
CONTRACT = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "TETHER_ROLLOUT_ID", "TETHER_TASK"}
CONTRACT |= {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"}


# --- in-process mode ---------------------------------------------------------------------

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "starter",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class _Canned(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """A canned OpenAI-compatible server on loopback: ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def gw_launch(gateway: str, i: int = 0, **kw) -> Launch:
    return Launch(f"r{i}", 1, f"{gateway}/rollouts/r{i}/v1", f"tok-{i}", {"q": "6*7"}, **kw)


async def test_inprocess_real_openai_client(tmp_path: Path, gateway: str) -> None:
    agent = script(
        tmp_path,
        "agent.py",
        """
        async def agent(task, client):
            r = await client.chat.completions.create(
                model="starter", messages=[{"role": "user", "content": task["q"]}])
            answer = r.choices[0].message.content
            return {"answer": answer, "reward": float(answer == "42")}
        """,
    )
    runner = make_runner(RunnerConfig(mode="inprocess", entry=f"{agent}:agent"))
    result = await runner.run(gw_launch(gateway, 7))
    await runner.close()
    assert result.status is RolloutStatus.SUCCEEDED
    assert (result.final_answer, result.agent_value) == ("42", 1.0)
    assert ("/rollouts/r7/v1/chat/completions", "Bearer tok-7") in _Canned.seen


async def test_process_agent_uses_openai_sdk_from_env(tmp_path: Path, gateway: str) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        from openai import OpenAI
        r = OpenAI().chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        print(r.choices[0].message.content)
        """,
    )
    runner = make_runner(RunnerConfig(command=[PY, agent]))
    result = await runner.run(gw_launch(gateway, 8))
    assert result.status is RolloutStatus.SUCCEEDED and result.final_answer == "42"
    assert ("/rollouts/r8/v1/chat/completions", "Bearer tok-8") in _Canned.seen


async def _returns_str(task, client):
    return "the answer"


async def _returns_number(task, client):
    return 0.5


async def _returns_none(task, client):
    return None


async def _returns_list(task, client):
    return [1]


async def _raises(task, client):
    raise KeyError("missing")


async def _sleeps(task, client):
    await asyncio.sleep(30)


async def _ignores_cancel(task, client):
    for _ in range(3):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.5)


@pytest.mark.parametrize(
    ("agent", "status", "answer", "value", "error"),
    [
        (_returns_str, RolloutStatus.SUCCEEDED, "the answer", None, None),
        (_returns_number, RolloutStatus.SUCCEEDED, None, 0.5, None),
        (_returns_none, RolloutStatus.SUCCEEDED, None, None, None),
        (_returns_list, RolloutStatus.FAILED, None, None, "returned list"),
        (_raises, RolloutStatus.FAILED, None, None, "KeyError: 'missing'"),
        (_sleeps, RolloutStatus.TIMEOUT, None, None, "timeout of 0.3s"),
        (_ignores_cancel, RolloutStatus.TIMEOUT, None, None, "timeout of 0.3s"),
    ],
)
async def test_inprocess_return_values(agent, status, answer, value, error) -> None:
    config = RunnerConfig(mode="inprocess", entry="unused:agent", timeout_s=0.3, grace_s=0.2)
    runner = InProcessRunner(config, agent=agent)  # imports the openai SDK, outside the clock
    t0 = time.monotonic()
    result = await runner.run(Launch("r0", 1, "http://127.0.0.1:9/v1", "tok", {}))
    await runner.close()
    assert time.monotonic() - t0 < 0.3 + 0.2 + 1.0  # deadline + grace + slack for a busy box
    assert (result.status, result.final_answer, result.agent_value) == (status, answer, value)
    assert (error is None and result.error is None) or error in (result.error or "")


async def test_inprocess_concurrency_limit() -> None:
    running = peak = 0

    async def agent(task, client):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return task["i"]

    runner = InProcessRunner(
        RunnerConfig(mode="inprocess", entry="x:agent", concurrency=3), agent=agent
    )
    assert isinstance(runner, tether.runner.Runner)
    results = await asyncio.gather(*(runner.run(launch(i, {"i": i})) for i in range(10)))
    await runner.close()
    assert peak == 3 and [r.agent_value for r in results] == [float(i) for i in range(10)]


def test_inprocess_agent_must_be_async(tmp_path: Path) -> None:
    agent = script(tmp_path, "sync_agent.py", "def agent(task, client):\n    return 1\n")
    with pytest.raises(AgentLoadError, match="async def"):
        make_runner(RunnerConfig(mode="inprocess", entry=f"{agent}:agent"))
    with pytest.raises(AgentLoadError, match="cannot import"):
        make_runner(RunnerConfig(mode="inprocess", entry="no_such_module_xyz:agent"))


def test_worker_script_runs_without_tether_on_path(tmp_path: Path) -> None:
    """A pool worker needs only the standard library (tether may not be importable there)."""
    script(tmp_path, "m.py", "def main():\n    print('hi')\n")
    worker = Path(tether.runner.__file__).with_name("_pool_worker.py")
    request = json.dumps({"env": {"PATH": os.defpath}, "max_output_bytes": 1024})
    out = subprocess.run(
        [PY, "-S", "-u", str(worker), "m:main"],
        input=request + "\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.defpath},
        timeout=20,
    )
    hello, reply = (json.loads(line) for line in out.stdout.splitlines())
    assert hello["ready"] and reply["final_answer"] == "hi" and reply["exit_code"] == 0


async def test_inprocess_failure_keeps_the_traceback_as_output_tail() -> None:
    """What the store keeps and ``tether rollouts show`` prints for an in-process agent."""
    config = RunnerConfig(mode="inprocess", entry="unused:agent", max_output_bytes=512)
    runner = InProcessRunner(config, agent=_raises)
    result = await runner.run(Launch("r0", 1, "http://127.0.0.1:9/v1", "tok", {}))
    await runner.close()
    assert result.status is RolloutStatus.FAILED
    tail = result.output_tail
    assert tail.rstrip().endswith("KeyError: 'missing'") and "in _raises" in tail
    assert len(tail.encode()) <= 512 + 40  # bounded by max_output_bytes (plus the cut marker)
