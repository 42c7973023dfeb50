"""One admission gate: the gateway admits through the engine's (``Engine.gate``)."""

from __future__ import annotations

import asyncio
from typing import Any

from tether.engine.testing import NullEngine
from tether.gateway._api.openai.schema import ChatCompletionRequest
from tether.store import Store


def test_one_gate_a_call_counts_once_and_an_update_inside_a_pause_leaves_it_paused(
    make_gateway: Any, store: Store
) -> None:
    """The gateway admits through the engine's gate (``Engine.gate``): one call in flight
    counts once, and a weight update while the run has the gateway paused does not resume
    it (the run resumes it after the update). A call's record is committed inside its
    admission, so the pause returns with it stored."""

    async def go() -> None:
        engine = NullEngine([5, 6], delay_s=0.2)
        gw = make_gateway(engine)
        assert gw.gate is engine.gate
        opened = gw.open_rollout({}, rollout_id="r-one-gate")
        req = ChatCompletionRequest(model="policy", messages=[{"role": "user", "content": "hi"}])
        ctx = gw.prepare_chat(opened.rollout_id, opened.attempt, req)
        call = asyncio.create_task(gw.generate(ctx))
        while engine.num_calls == 0:
            await asyncio.sleep(0.01)
        assert gw.admission_state()["in_flight"] == 1  # the gateway's and the engine's admission
        await gw.pause()
        assert gw.admission_state()["in_flight"] == 0  # drained, and its record written
        assert len(store.calls(opened.rollout_id)) == 1
        await engine.update_weights({})
        assert gw.admission_state()["paused"]  # the update paused nothing new: still the run's
        gw.resume()
        assert not gw.admission_state()["paused"]
        await call

    asyncio.run(go())
