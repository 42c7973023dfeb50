"""The gateway's admission gate as async training uses it: hold, drain, resume, time out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from tether.engine import AdmissionGate
from tether.engine.testing import NullEngine
from tether.store import Store

from .conftest import ADMIN_KEY
from .test_async import RUN, Live


def test_pause_holds_new_calls_and_lets_in_flight_ones_finish(tokenizer: Any, store: Store) -> None:
    """Through the admin routes: pause returns after the in-flight call, the new call waits.
    (A 1.5 s engine call: under load the test must see the hold before the first call ends.)"""
    ok = [*tokenizer.encode("ok"), tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def go() -> None:
        async with Live(NullEngine(ok, delay_s=1.5), tokenizer, store, port=0) as live:
            gw = live.gw
            a, b = (gw.open_rollout({}, rollout_id=f"r{i}", run_id=RUN) for i in range(2))
            clients = [
                openai.AsyncOpenAI(base_url=o.base_url, api_key=o.token, max_retries=0)
                for o in (a, b)
            ]
            admin = httpx.AsyncClient(
                base_url=live.server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
            )
            msgs = [{"role": "user", "content": "hi"}]
            first = asyncio.create_task(
                clients[0].chat.completions.create(model="policy", messages=msgs)
            )
            while gw.gate.in_flight == 0:
                await asyncio.sleep(0.01)
            pause = asyncio.create_task(admin.post("/admin/pause"))
            while not gw.gate.paused:
                await asyncio.sleep(0.01)
            second = asyncio.create_task(
                clients[1].chat.completions.create(model="policy", messages=msgs)
            )
            while gw.gate.held == 0:
                await asyncio.sleep(0.01)
            assert not first.done() and not pause.done()  # the drain waits for the first call
            assert (await first).choices[0].message.content == "ok"
            assert (await pause).status_code == 200
            await asyncio.sleep(0.3)
            assert not second.done() and gw.engine.num_calls == 1  # held, not refused
            t0 = time.monotonic()
            assert (await admin.post("/admin/resume")).status_code == 200
            assert (await second).choices[0].message.content == "ok"
            assert time.monotonic() - t0 >= 0.35  # served after the resume, by the engine
            assert gw.gate.held_total == 1 and gw.gate.held_seconds >= 0.3
            assert [len(store.calls(o.rollout_id)) for o in (a, b)] == [1, 1]
            await admin.aclose()

    asyncio.run(go())


def test_a_held_call_woken_by_resume_waits_again_if_paused_again() -> None:
    """resume() then pause() at once: the woken call must not slip into the new pause."""

    async def go() -> None:
        gate = AdmissionGate()
        await gate.pause()
        ran: list[bool] = []

        async def call() -> None:
            async with gate.admit(5.0):
                ran.append(gate.paused)

        task = asyncio.create_task(call())
        while gate.held == 0:
            await asyncio.sleep(0.01)
        gate.resume()
        await gate.pause()  # no await point in between: the woken call has not run yet
        await asyncio.sleep(0.1)
        assert ran == [] and gate.held == 1
        gate.resume()
        await task
        assert ran == [False] and gate.held_total == 1 and gate.held_seconds >= 0.1

    asyncio.run(go())


def test_a_call_held_past_the_hold_timeout_gets_a_503(tokenizer: Any, store: Store) -> None:
    async def go() -> None:
        async with Live(NullEngine([5, 6]), tokenizer, store, port=0) as live:
            o = live.gw.open_rollout({}, rollout_id="r0", run_id=RUN)
            live.gw.config.admission_timeout_s = 0.2
            await live.gw.gate.pause()
            client = openai.AsyncOpenAI(base_url=o.base_url, api_key=o.token, max_retries=0)
            with pytest.raises(openai.APIStatusError) as err:
                await client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}]
                )
            assert err.value.status_code == 503 and "admission timeout" in err.value.message
            assert live.gw.gate.held == 0 and live.gw.gate.held_seconds >= 0.2

    asyncio.run(go())
