"""Engine.generate_stream: tokens as they are sampled, the same as generate, and cancellable.

The transformers engine runs a tiny random Qwen2 (fp32, seeded), as in test_engine.py.
"""

from __future__ import annotations

import asyncio

import pytest
from transformers import Qwen2ForCausalLM

from tests.helpers import tiny_qwen2
from tether.engine import (
    Engine,
    EngineFailed,
    GenerateResult,
    SamplingParams,
    TokenDelta,
    TransformersEngine,
)
from tether.engine.testing import FaultyEngine, NullEngine, ScriptedEngine

VOCAB = 300


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(VOCAB, max_position_embeddings=1024).eval()


@pytest.fixture
async def engine(model):
    eng = TransformersEngine(model, None, seed=0)
    yield eng
    await eng.close()


async def collect(stream) -> tuple[list[TokenDelta], GenerateResult]:
    items = [item async for item in stream]
    *deltas, result = items
    assert isinstance(result, GenerateResult)
    assert all(isinstance(d, TokenDelta) for d in deltas)
    return deltas, result


def per_choice(deltas: list[TokenDelta], n: int) -> list[list[TokenDelta]]:
    return [[d for d in deltas if d.index == i] for i in range(n)]


async def test_stream_yields_the_tokens_generate_returns(engine):
    params = SamplingParams(temperature=1.0, max_tokens=20, n=3, seed=11, top_logprobs=2)
    deltas, result = await collect(engine.generate_stream([5, 6, 7, 8], params))
    ref = await engine.generate([5, 6, 7, 8], params)  # same seed: same tokens
    for got, want, mine in zip(
        per_choice(deltas, 3), ref.completions, result.completions, strict=True
    ):
        assert [d.token_id for d in got] == want.token_ids == mine.token_ids
        assert [d.logprob for d in got] == pytest.approx(want.logprobs, abs=1e-5)
        assert [d.top_logprobs for d in got] == mine.top_logprobs
        assert [d.finish_reason for d in got] == [None] * (len(got) - 1) + [want.finish_reason]
    assert result.policy_version == engine.policy_version


async def test_tokens_arrive_before_the_generation_ends(engine):
    """The first delta is in hand while the worker still has the request's rows."""
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = engine.generate_stream([1, 2, 3], params)
    first = await anext(stream)
    assert isinstance(first, TokenDelta)
    produced_then = engine.stats.tokens
    deltas, result = await collect(stream)
    assert len(result.completions[0].token_ids) == 200
    assert produced_then < 200  # the rest was sampled after the first token was delivered
    assert [first.token_id] + [d.token_id for d in deltas] == result.completions[0].token_ids


async def test_closing_the_stream_stops_the_generation(engine):
    params = SamplingParams(temperature=0, max_tokens=800, ignore_eos=True)
    stream = engine.generate_stream(list(range(10, 20)), params)
    for _ in range(5):
        await anext(stream)
    await stream.aclose()
    for _ in range(500):  # the worker drops the rows at its next step
        if not engine._scheduler._rows:
            break
        await asyncio.sleep(0.01)
    assert not engine._scheduler._rows
    stopped_at = engine.stats.tokens
    assert stopped_at < 800
    # Nothing more is generated for it, and the engine serves the next call.
    res = await engine.generate([1, 2], SamplingParams(temperature=0, max_tokens=3))
    assert len(res.completions[0].token_ids) == 3
    assert engine.stats.tokens == stopped_at + 3
    assert engine.gate.in_flight == 0


async def test_cancelling_the_consumer_stops_the_generation(engine):
    params = SamplingParams(temperature=0, max_tokens=800, ignore_eos=True)
    got = asyncio.Event()

    async def consume():
        async for _ in engine.generate_stream([3, 4, 5], params):
            got.set()

    task = asyncio.create_task(consume())
    await got.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):
        if not engine._scheduler._rows:
            break
        await asyncio.sleep(0.01)
    assert not engine._scheduler._rows and engine.stats.tokens < 800


async def test_fake_engines_stream_too():
    for eng in (NullEngine([5, 6, 7]), ScriptedEngine([[8, 9]]), FaultyEngine(fault=None)):
        assert isinstance(eng, Engine)
        deltas, result = await collect(eng.generate_stream([1], SamplingParams(max_tokens=8)))
        assert [d.token_id for d in deltas] == result.completions[0].token_ids
        assert deltas[-1].finish_reason == result.completions[0].finish_reason


async def test_a_broken_stream_raises_after_some_tokens():
    eng = FaultyEngine(NullEngine([5, 6, 7, 8]), fault="break")
    seen = []
    with pytest.raises(EngineFailed, match="injected fault"):
        async for item in eng.generate_stream([1], SamplingParams(max_tokens=8)):
            seen.append(item)
    assert [d.token_id for d in seen] == [5, 6]
