"""The one admission gate (engines and gateway): hold, drain, time out, close, pause for an update."""

from __future__ import annotations

import asyncio

import pytest

from tether.engine import AdmissionGate, AdmissionTimeout, EngineFailed


def test_a_call_held_past_its_timeout_raises_admission_timeout() -> None:
    async def go() -> None:
        gate = AdmissionGate()
        await gate.pause()
        with pytest.raises(AdmissionTimeout, match="admission timeout"):
            async with gate.admit(0.1):
                pytest.fail("admitted while paused")
        assert gate.held == 0 and gate.held_total == 1 and gate.held_seconds >= 0.1
        assert gate.in_flight == 0

    asyncio.run(go())


def test_paused_for_update_drains_and_resumes_only_what_it_paused() -> None:
    async def go() -> None:
        gate = AdmissionGate()
        release = asyncio.Event()

        async def call() -> None:
            async with gate.admit():
                await release.wait()

        running = asyncio.create_task(call())
        await asyncio.sleep(0)
        assert gate.in_flight == 1
        update = asyncio.create_task(gate.paused_for_update().__aenter__())
        await asyncio.sleep(0.05)
        assert gate.paused and not update.done()  # drains the call in flight first
        release.set()
        await running
        await update
        async with gate.paused_for_update():
            assert gate.paused
        assert gate.paused  # it was paused before (the update above never left): stays paused
        gate.resume()
        async with gate.paused_for_update():
            assert gate.paused
        assert not gate.paused

    asyncio.run(go())


def test_paused_for_update_resumes_after_an_error() -> None:
    async def go() -> None:
        gate = AdmissionGate()
        with pytest.raises(RuntimeError):
            async with gate.paused_for_update():
                raise RuntimeError("load failed")
        assert not gate.paused

    asyncio.run(go())


def test_close_wakes_held_calls_with_engine_failed() -> None:
    async def go() -> None:
        gate = AdmissionGate()
        await gate.pause()

        async def call() -> None:
            async with gate.admit():
                pass

        task = asyncio.create_task(call())
        while gate.held == 0:
            await asyncio.sleep(0.01)
        gate.close()
        with pytest.raises(EngineFailed, match="closed"):
            await task
        assert gate.held == 0 and gate.in_flight == 0

    asyncio.run(go())


def test_the_gate_follows_the_running_event_loop() -> None:
    gate = AdmissionGate()

    async def one_call() -> None:
        async with gate.admit(1.0):
            pass
        await gate.pause()
        gate.resume()

    asyncio.run(one_call())
    asyncio.run(one_call())  # a second loop: the gate's events are rebound, not stale
    assert gate.state() == {
        "paused": False,
        "in_flight": 0,
        "held": 0,
        "held_total": 0,
        "held_seconds": 0.0,
    }


def test_a_call_admitted_once_passes_its_own_gate_again_without_a_hold() -> None:
    """The gateway admits a call, then the engine admits it through the same gate: a pause
    landing between the two must not hold the inner one (the drain would wait forever)."""

    async def go() -> None:
        gate = AdmissionGate()
        inner_in_flight: list[int] = []

        async def call() -> None:
            async with gate.admit(5.0):
                await asyncio.sleep(0.05)  # the pause lands here
                async with gate.admit():
                    inner_in_flight.append(gate.in_flight)

        task = asyncio.create_task(call())
        await asyncio.sleep(0.01)
        await asyncio.wait_for(gate.pause(), 2.0)  # drains: no deadlock
        await task
        assert inner_in_flight == [1] and gate.held_total == 0 and gate.in_flight == 0
        gate.resume()
        async with gate.admit():  # a later call outside is admitted (and counted) again
            assert gate.in_flight == 1

    asyncio.run(go())


def test_paused_for_update_without_drain_holds_new_calls_only() -> None:
    async def go() -> None:
        gate = AdmissionGate()
        entered = asyncio.Event()
        leave = asyncio.Event()

        async def running() -> None:
            async with gate.admit():
                entered.set()
                await leave.wait()

        task = asyncio.create_task(running())
        await entered.wait()
        async with gate.paused_for_update(drain=False):
            assert gate.paused and gate.in_flight == 1  # not waited for
        assert not gate.paused
        leave.set()
        await task

    asyncio.run(go())
