"""The gateway and its store on the hot path: a call's record is written off the event
loop, in order, and a chat call reads the store once (to authorize it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tether.engine.testing import NullEngine
from tether.gateway import Gateway, GatewayConfig, create_app
from tether.records import Call, Rollout
from tether.store import Store, StoreError

from .conftest import ADMIN_KEY

MESSAGES = [{"role": "user", "content": "hi"}]


class SlowStore(Store):
    """A test double: the real store, whose ``record_call`` takes ``write_s`` seconds
    longer (a slow disk), blocking the thread it runs on; ``fail`` makes it raise."""

    def __init__(self, path: Path, write_s: float) -> None:
        super().__init__(path)
        self.write_s = write_s
        self.fail = False

    def record_call(self, call: Call) -> int:
        time.sleep(self.write_s)
        if self.fail:
            raise StoreError("the disk is full")
        return super().record_call(call)


class CountingReadsStore(Store):
    """A test double: the real store, counting the reader connections it hands out (every
    read of the store takes one)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0
        read = self._db.read

        def counted(**kwargs: Any) -> Any:
            self.reads += 1
            return read(**kwargs)

        self._db.read = counted  # type: ignore[method-assign]


def _gateway(store: Store, tokenizer: Any, engine: Any = None) -> Gateway:
    engine = engine or NullEngine([5, 6, 7])
    return Gateway(engine, tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY))


def _client(gw: Gateway, rollout_id: str, token: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(gw)))
    return openai.AsyncOpenAI(
        base_url=f"http://gw/rollouts/{rollout_id}/v1", api_key=token, http_client=http,
        max_retries=0,
    )  # fmt: skip


async def test_a_slow_store_write_does_not_block_the_event_loop(
    tmp_path: Path, tokenizer: Any
) -> None:
    store = SlowStore(tmp_path / "traces.sqlite", write_s=0.5)
    gw = _gateway(store, tokenizer)
    opened = gw.open_rollout({}, rollout_id="r-slow")
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    async with _client(gw, opened.rollout_id, opened.token) as client:
        answer = await client.chat.completions.create(model="policy", messages=MESSAGES)
    done = True
    await ticker
    assert answer.choices[0].finish_reason == "stop"
    assert [c.seq for c in store.calls("r-slow")] == [0]  # committed before the answer
    assert ticks >= 10  # the loop ran on during the 0.5 s write (about 50 ticks)
    store.close()


async def test_writes_sent_to_the_writer_commit_in_the_order_sent(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "traces.sqlite", write_s=0.0)
    store.create_rollout(Rollout(id="r-order"))
    store.start_attempt("r-order", "hash")
    calls = [replace(_any_call("r-order"), completion_ids=[i]) for i in range(6)]
    # later ones are quicker: a pool of several writers would commit them first
    slow = [asyncio.create_task(_slowly(store, c, 0.06 - 0.01 * i)) for i, c in enumerate(calls)]
    seqs = await asyncio.gather(*slow)
    assert seqs == list(range(6))
    assert [c.completion_ids for c in store.calls("r-order")] == [[i] for i in range(6)]
    store.close()


async def _slowly(store: SlowStore, call: Call, write_s: float) -> int:
    def write() -> int:
        time.sleep(write_s)
        return store.record_call(call)

    return await store.in_writer(write)


async def test_a_failed_write_surfaces_as_before(tmp_path: Path, tokenizer: Any) -> None:
    """A record that cannot be written fails the call with the store's error (503), and
    the agent never sees an answer that is not stored."""
    store = SlowStore(tmp_path / "traces.sqlite", write_s=0.0)
    gw = _gateway(store, tokenizer)
    opened = gw.open_rollout({}, rollout_id="r-fail")
    store.fail = True
    async with _client(gw, opened.rollout_id, opened.token) as client:
        with pytest.raises(openai.APIStatusError) as err:
            await client.chat.completions.create(model="policy", messages=MESSAGES)
    assert err.value.status_code == 503
    assert store.calls("r-fail") == []
    with pytest.raises(StoreError, match="disk is full"):  # the very error, through the writer
        await store.in_writer(store.record_call, _any_call("r-fail"))
    store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.in_writer(store.record_call, _any_call("r-fail"))


def _any_call(rollout_id: str) -> Call:
    return Call(
        rollout_id=rollout_id, seq=-1, attempt=1, prompt_ids=[1], completion_ids=[2],
        logprobs=[-0.5], policy_version=0, request={}, finish_reason="stop",
    )  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_call_reads_the_store_once(
    tmp_path: Path, tokenizer: Any, stream: bool
) -> None:
    """Authorize reads the rollout; overrides and the seed come from memory."""
    store = CountingReadsStore(tmp_path / "traces.sqlite")
    gw = _gateway(store, tokenizer)
    opened = gw.open_rollout({}, rollout_id="r-reads", sampling={"temperature": 0.5})
    async with _client(gw, opened.rollout_id, opened.token) as client:
        for _ in range(2):
            before = store.reads
            if stream:
                chunks = await client.chat.completions.create(
                    model="policy", messages=MESSAGES, stream=True
                )
                async for _chunk in chunks:
                    pass
            else:
                await client.chat.completions.create(model="policy", messages=MESSAGES)
            assert store.reads - before == 1
    assert len(store.calls("r-reads")) == 2
    store.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", {"model": "m", "messages": MESSAGES}),
        ("responses", {"model": "m", "input": "hi"}),
        ("messages", {"model": "m", "max_tokens": 8, "messages": MESSAGES}),
    ],
)
async def test_every_dialect_reads_the_store_once_per_call(
    tmp_path: Path, tokenizer: Any, path: str, body: dict[str, Any]
) -> None:
    store = CountingReadsStore(tmp_path / "traces.sqlite")
    gw = _gateway(store, tokenizer)
    opened = gw.open_rollout({}, rollout_id="r-dialect")
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        before = store.reads
        got = await http.post(
            f"/rollouts/r-dialect/v1/{path}",
            json=body,
            headers={"Authorization": f"Bearer {opened.token}"},
        )
        assert got.status_code == 200, got.text
        assert store.reads - before == 1
    store.close()
