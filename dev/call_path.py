"""How many of tether's files one chat call and one training step pass through.

A profile hook (``sys.setprofile`` and ``threading.setprofile``, every thread) notes the
source file of every Python function called under ``tether/`` while:

- **chat**: one ``POST /rollouts/{id}/v1/chat/completions`` through the gateway's ASGI
  app (an in-process ``httpx`` client), the starter model on the embedded engine, after
  a first call that warmed every cache;
- **step**: one ``TrainingRun.train_step`` of the calc task on the starter model (an
  in-process agent, 2 groups of 2 rollouts), after a first step.

It prints each count and, with ``--list``, the files. Structure, not speed: the count is
of distinct files, whatever the number of calls. It needs the starter model in the
cache (``TETHER_TEST_CACHE`` or ``~/.cache/tether/starter``; built if missing, ~10 s).

    .venv/bin/python dev/call_path.py [--list]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PACKAGE = str(ROOT / "tether") + os.sep


class Files:
    """The tether files whose functions run while :meth:`watch` is on."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def _hook(self, frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            self.seen.add(frame.f_code.co_filename[len(PACKAGE) :])

    async def watch(self, work: Callable[[], Awaitable[Any]]) -> set[str]:
        self.seen = set()
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        try:
            await work()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        return set(self.seen)


def starter() -> Path:
    from tether.starter import build_starter

    cache = os.environ.get("TETHER_TEST_CACHE")
    return Path(build_starter(cache_dir=cache, warm=False))


async def chat_call(model: Path, tmp: Path) -> set[str]:
    import httpx

    from tether.engine import TransformersEngine
    from tether.gateway import Gateway, GatewayConfig, create_app
    from tether.models import load_tokenizer
    from tether.store import Store

    tokenizer = load_tokenizer(model)
    engine = TransformersEngine.from_pretrained(str(model))
    store = Store(tmp / "traces.sqlite")
    gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key="k" * 32))
    body = {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}],
            "max_tokens": 8, "seed": 1}  # fmt: skip
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

        async def one() -> None:
            opened = gw.open_rollout(task={"question": "2+2?"})
            r = await client.post(
                f"/rollouts/{opened.rollout_id}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {opened.token}"},
            )  # fmt: skip
            r.raise_for_status()

        await one()  # warm every cache first
        files = await Files().watch(one)
    await engine.close()
    store.close()
    return files


async def train_step(model: Path, tmp: Path) -> set[str]:
    from tether.run import (
        EvalConfig,
        RolloutConfig,
        TasksConfig,
        TrainConfig,
        TrainerConfig,
        TrainingRun,
    )
    from tether.runner import RunnerConfig

    cfg = TrainConfig(
        name="path", dir=str(tmp), tasks=TasksConfig(source="calc", train_size=8, val_size=2),
        agent=RunnerConfig(mode="inprocess", entry="tether.starter.calc:agent"),
        rollout=RolloutConfig(n=2, batch_groups=2), eval=EvalConfig(enabled=False),
        trainer=TrainerConfig(steps=2, lr=1e-4),
    )  # fmt: skip
    async with TrainingRun(cfg, model_path=model) as run:
        await run.train_step(1)
        return await Files().watch(lambda: run.train_step(2))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the files too")
    args = p.parse_args()
    model = starter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, walk in (("chat call", chat_call), ("training step", train_step)):
            (Path(tmp) / name).mkdir()
            files = asyncio.run(walk(model, Path(tmp) / name))
            print(f"{name}: {len(files)} files under tether/")
            if args.list:
                print("".join(f"  {f}\n" for f in sorted(files)), end="")


if __name__ == "__main__":
    main()
