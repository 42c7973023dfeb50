"""Helpers shared by several test modules (test modules do not import each other).

Agent and grader specs in test configs may point here too, e.g.
``grader="tests.helpers:alternating_grader"``.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

from tether.gateway import BackgroundServer, Gateway, GatewayConfig, create_app
from tether.runner import Launch
from tether.store import Store

__all__ = [
    "ADMIN_KEY",
    "CHAT_MESSAGES",
    "CHAT_TOOLS",
    "TETHER",
    "LiveGateway",
    "Served",
    "alive",
    "alternating_grader",
    "free_port",
    "launch",
    "script",
    "serving",
    "tiny_qwen2",
]

ADMIN_KEY = "test-admin-key-0123456789"  # the admin key of the test gateways (conftest)
TETHER = [sys.executable, "-m", "tether.cli"]  # the command as a user runs it

# A chat with one tool, as the gateway tests send it.
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a careful calculator agent."},
    {"role": "user", "content": "What is 17 + 25?"},
]


def tiny_qwen2(vocab: int, *, seed: int = 0, **config: Any) -> Any:
    """A random Qwen2 model small enough for any test (2 layers of 64 unless ``config``
    says otherwise), built after ``torch.manual_seed(seed)``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, **{**shape, **config}))


class LiveGateway:
    """A gateway over ``engine`` on a loopback port, with its own SQLite store at ``path``,
    for tests that drive it with the official ``openai`` client.

    ``task``: what each rollout opened by :meth:`open` holds; ``config``: more
    :class:`GatewayConfig` fields (e.g. ``record_keys``).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        path: Path,
        task: dict | None = None,
        seed: int | None = None,
        **config: Any,
    ) -> None:
        self.store = Store(path)
        self.tokenizer = tokenizer
        self.task = {"question": "17 + 25"} if task is None else task
        cfg = GatewayConfig(admin_key=ADMIN_KEY, **config)
        self.gw = Gateway(engine, tokenizer, self.store, cfg, seed=seed)
        self.server = BackgroundServer(create_app(self.gw)).start()
        self.gw.config.public_url = self.server.url

    def open(self, rid: str) -> tuple[str, str]:
        """Open rollout ``rid``; its base URL and token (also kept as :attr:`token`)."""
        opened = self.gw.open_rollout(self.task, rollout_id=rid)
        self.token = opened.token
        return opened.base_url, opened.token

    def client(self, rid: str) -> openai.OpenAI:
        base, token = self.open(rid)
        return openai.OpenAI(base_url=base, api_key=token, max_retries=0)

    def clients(self, rid: str) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
        """A sync and an async client of the same rollout."""
        base, token = self.open(rid)
        return (
            openai.OpenAI(base_url=base, api_key=token, max_retries=0),
            openai.AsyncOpenAI(base_url=base, api_key=token, max_retries=0),
        )

    def stop(self) -> None:
        self.server.stop()
        asyncio.run(self.gw.engine.close())
        self.store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A running ``tether serve``: its base URL; ``logs`` is what it printed, once it stopped."""

    base: str
    logs: str = ""


@contextmanager
def serving(model: Path, store: Path, *args: str, env: dict[str, str]) -> Iterator[Served]:
    """``tether serve --model MODEL --store STORE ARGS`` on a free port, until the block ends."""
    port = free_port()
    cmd = [*TETHER, "serve", "--model", str(model), "--port", str(port), "--store", str(store)]
    proc = subprocess.Popen(
        [*cmd, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    served = Served(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{served.base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "tether serve did not come up"
            time.sleep(0.2)
        yield served
    finally:
        proc.terminate()
        served.logs = proc.communicate(timeout=30)[0]


def launch(i: int = 0, task: dict | None = None, **kw) -> Launch:
    """The launch of rollout ``r{i}`` (attempt 1) against a gateway at ``http://gw``."""
    kw.setdefault("reward_url", f"http://gw/rollouts/r{i}/reward")
    return Launch(f"r{i}", 1, f"http://gw/rollouts/r{i}/v1", f"tok-{i}", task or {"x": i}, **kw)


def script(tmp_path: Path, name: str, code: str) -> str:
    """Write a dedented agent script to ``tmp_path/name``; returns its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_graded: collections.Counter[str] = collections.Counter()


def alternating_grader(task: dict, answer: str | None) -> float:
    """Rewards 0, 1, 0, 1, ... per task in grading order: every group of even size has variance.

    Counted per task, not globally: rollouts of concurrent groups finish interleaved, and a
    global count could hand one group 0, 0 (no variance, so no update).
    """
    n = _graded[task["id"]]
    _graded[task["id"]] += 1
    return float(n % 2)


#: ``tether train`` overrides for the smallest run of examples/calc/config.yaml: one eval
#: of 2 tasks x 2 samples before a single update of 2 groups of 2.
TINY_RUN = [
    "tasks.train_size=8", "tasks.val_size=2", "rollout.n=2", "rollout.batch_groups=2",
    "trainer.steps=1", "eval.tasks=2", "eval.samples=2", "eval.greedy=false",
    "checkpoint.every=0",
]  # fmt: skip


def small_run(
    tmp_path: Path,
    name: str,
    agent: str,
    *,
    train_size: int = 8,
    concurrency: int = 8,
    **parts: Any,
) -> Any:
    """A TrainConfig for a short run of the starter model on calc tasks: an in-process
    ``agent`` (``module:function``), no held-out eval unless ``parts`` names one."""
    from tether.run import EvalConfig, TasksConfig, TrainConfig
    from tether.runner import RunnerConfig

    parts.setdefault("eval", EvalConfig(enabled=False))
    return TrainConfig(
        name=name,
        dir=str(tmp_path),
        tasks=TasksConfig(source="calc", train_size=train_size, val_size=2),
        agent=RunnerConfig(mode="inprocess", entry=agent, concurrency=concurrency),
        **parts,
    )


class GroupFates:
    """An async scheduler's ``watch`` (tether/run/_async.py) that keeps what the scheduler
    does not: each step's trained batch, the groups dropped for lag and without signal."""

    def __init__(self) -> None:
        self.trained: list[list[Any]] = []
        self.dropped_lag: list[Any] = []
        self.dropped_no_signal: list[Any] = []

    def __call__(self, fate: str, groups: list[Any]) -> None:
        if fate == "trained":
            self.trained.append(groups)
        else:
            getattr(self, fate).extend(groups)
