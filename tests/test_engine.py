"""Tests of tether.engine: the fake engines and the batched transformers engine.

The transformers engine runs a tiny random Qwen2 (fp32, seeded) with a
one-character-per-token tokenizer, so every generated id decodes to exactly
one character and stop strings can be checked against greedy output.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import time

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from tests.helpers import tiny_qwen2
from tether.engine import (
    Engine,
    EngineFailed,
    SamplingParams,
    TransformersEngine,
)
from tether.engine._prefix import PrefixCache
from tether.engine.testing import FaultyEngine, NullEngine, ScriptedEngine
from tether.errors import UserError

VOCAB = 300
IM_END = VOCAB - 1


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(VOCAB).eval()


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {chr(0x100 + i): i for i in range(VOCAB - 1)}
    vocab["<|im_end|>"] = IM_END
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|im_end|>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


@pytest.fixture
async def engine(model, tokenizer):
    eng = TransformersEngine(model, tokenizer, seed=0)
    yield eng
    await eng.close()


def reference_logprobs(model, prompt: list[int], completion: list[int], t: float) -> list[float]:
    """One plain forward pass over prompt + completion: log_softmax(logits / T)[token]."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    t = t or 1.0
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)] / t
    return torch.log_softmax(rows, -1)[range(len(completion)), completion].tolist()


def assert_token_exact(model, prompt: list[int], completion, t: float) -> None:
    """The engine's logprobs of ``completion`` match a plain forward pass."""
    ref = reference_logprobs(model, prompt, completion.token_ids, t)
    assert max(abs(a - b) for a, b in zip(ref, completion.logprobs, strict=True)) < 1e-4


def greedy(n: int = 12, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 47)), [1]]


# -- the fakes ---------------------------------------------------------------------------------


def test_fakes_are_engines():
    for eng in (NullEngine(), ScriptedEngine([]), FaultyEngine()):
        assert isinstance(eng, Engine)


async def test_null_engine_honours_params():
    eng = NullEngine(token_ids=[5, 6, 7, 8], logprob=-0.5)
    res = await eng.generate([1], SamplingParams(n=3, stop_token_ids=(7,)))
    assert [c.token_ids for c in res.completions] == [[5, 6, 7]] * 3
    assert res.completions[0].logprobs == [-0.5] * 3 and res.completions[0].finish_reason == "stop"
    res = await eng.generate([1], SamplingParams(max_tokens=2))
    assert res.completions[0].token_ids == [5, 6] and res.completions[0].finish_reason == "length"
    res = await NullEngine().generate([1], SamplingParams(max_tokens=4))
    assert res.completions[0].token_ids == [0] * 4 and res.completions[0].finish_reason == "length"
    assert eng.num_calls == 2 and eng.calls[0][0] == [1]


async def test_scripted_engine_texts_ids_and_faults(tokenizer):
    text = chr(0x100) + chr(0x105)
    eng = ScriptedEngine([text, [3, 4], ValueError("boom")], tokenizer)
    with pytest.raises(AssertionError, match="3 of 3 script items were never used"):
        eng.assert_exhausted()
    first = (await eng.generate([1], SamplingParams())).completions[0]
    assert first.token_ids == [0, 5, IM_END] and first.finish_reason == "stop"
    assert (await eng.generate([1], SamplingParams())).completions[0].token_ids == [3, 4]
    with pytest.raises(AssertionError, match="1 of 3"):
        eng.assert_exhausted()
    with pytest.raises(EngineFailed, match="boom"):
        await eng.generate([1], SamplingParams())
    eng.assert_exhausted()
    with pytest.raises(EngineFailed, match="exhausted"):
        await eng.generate([1], SamplingParams())


async def test_faulty_engine_raises_hangs_and_delays():
    eng = FaultyEngine(fault="raise", on_calls={0})
    with pytest.raises(EngineFailed):
        await eng.generate([1], SamplingParams(max_tokens=2))
    assert len((await eng.generate([1], SamplingParams(max_tokens=2))).completions) == 1
    hung = FaultyEngine(fault="hang")
    task = asyncio.create_task(hung.generate([1], SamplingParams()))
    done, _ = await asyncio.wait({task}, timeout=0.1)
    assert not done
    await hung.close()
    with pytest.raises(EngineFailed):
        await task


async def test_fake_pause_resume_and_update():
    eng = NullEngine(delay_s=0.2)
    first = asyncio.create_task(eng.generate([1], SamplingParams(max_tokens=2)))
    await asyncio.sleep(0.05)
    await eng.pause()
    assert first.done()
    held = asyncio.create_task(eng.generate([1], SamplingParams(max_tokens=2)))
    await asyncio.sleep(0.3)
    assert not held.done()
    await eng.resume()
    await held
    assert await eng.update_weights({}) == 1 == eng.policy_version


# -- the transformers engine -------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_token_exact_in_mixed_batches(model, engine, temperature):
    async def late(prompt, delay):  # arrives mid-generation: merged into the running batch
        await asyncio.sleep(delay)
        return await engine.generate(prompt, params)

    params = SamplingParams(temperature=temperature, max_tokens=16, ignore_eos=True)
    delays = [0, 0, 0.005, 0.01]
    results = await asyncio.gather(*(late(p, d) for p, d in zip(PROMPTS, delays, strict=True)))
    assert max(engine.stats.batch_sizes) > 1
    for prompt, res in zip(PROMPTS, results, strict=True):
        comp = res.completions[0]
        assert len(comp.token_ids) == 16 and comp.finish_reason == "length"
        assert_token_exact(model, prompt, comp, temperature)


async def test_top_p_truncates_sampling_not_logprobs(model, engine):
    res = await engine.generate(
        PROMPTS[0], SamplingParams(temperature=0.7, top_p=1e-6, max_tokens=24)
    )
    comp = res.completions[0]
    want = await engine.generate(PROMPTS[0], greedy(len(comp.token_ids)))
    assert comp.token_ids == want.completions[0].token_ids  # top_p → 0 is greedy
    assert_token_exact(model, PROMPTS[0], comp, 0.7)


async def test_greedy_matches_model_generate(model, engine):
    results = await asyncio.gather(*(engine.generate(p, greedy(10)) for p in PROMPTS))
    for prompt, res in zip(PROMPTS, results, strict=True):
        ids = torch.tensor([prompt])
        out = model.generate(ids, do_sample=False, max_new_tokens=10, min_new_tokens=10)
        assert res.completions[0].token_ids == out[0, len(prompt) :].tolist()


async def test_seeded_requests_reproducible_and_n(engine):
    params = SamplingParams(max_tokens=12, seed=7, ignore_eos=True)
    alone = await engine.generate(PROMPTS[0], params)
    crowd = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_tokens=20)) for p in PROMPTS[1:]),
        engine.generate(PROMPTS[0], params),
    )
    assert crowd[-1].completions[0].token_ids == alone.completions[0].token_ids
    many = await engine.generate(PROMPTS[1], SamplingParams(n=4, max_tokens=8, top_logprobs=3))
    assert len(many.completions) == 4
    assert len({tuple(c.token_ids) for c in many.completions}) > 1
    top = many.completions[0].top_logprobs
    assert top is not None and all(len(t) == 3 for t in top)
    assert max(top[0].values()) >= many.completions[0].logprobs[0]


async def test_stop_strings_and_stop_ids(engine, tokenizer):
    full = (await engine.generate(PROMPTS[0], greedy(12))).completions[0].token_ids
    text = tokenizer.decode(full)
    stop = text[4:6]
    res = await engine.generate(PROMPTS[0], greedy(12, stop=(stop,)))
    comp = res.completions[0]
    assert comp.finish_reason == "stop"
    assert comp.token_ids == full[: text.find(stop) + len(stop)]
    res = await engine.generate(PROMPTS[0], greedy(12, stop_token_ids=(full[3],)))
    assert res.completions[0].token_ids == full[: full.index(full[3]) + 1]
    assert res.completions[0].finish_reason == "stop"


async def test_eos_from_generation_config_and_ignore_eos(model):
    full = (await _one(model, PROMPTS[1], greedy(8))).completions[0].token_ids
    m = copy.deepcopy(model)
    m.generation_config.eos_token_id = full[2]
    stopped = (await _one(m, PROMPTS[1], SamplingParams(temperature=0, max_tokens=8))).completions
    assert stopped[0].token_ids == full[: full.index(full[2]) + 1]
    ignored = (await _one(m, PROMPTS[1], greedy(8))).completions[0]
    assert ignored.token_ids == full and ignored.finish_reason == "length"


async def _one(model, prompt, params):
    eng = TransformersEngine(model)
    try:
        return await eng.generate(prompt, params)
    finally:
        await eng.close()


async def test_concurrent_requests_share_batches(engine):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    await asyncio.gather(*(engine.generate([3 + i, 4], params) for i in range(8)))
    assert max(engine.stats.batch_sizes) == 8
    assert engine.stats.steps < 8 * 24 / 3  # one-by-one would need ~8 × 23 steps


async def test_pause_holds_new_requests_and_lets_in_flight_finish(engine):
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    running = [asyncio.create_task(engine.generate(p, params)) for p in PROMPTS]
    while engine.stats.steps < 2:
        await asyncio.sleep(0.005)
    await engine.pause()
    assert all(t.done() for t in running)
    held = asyncio.create_task(engine.generate(PROMPTS[0], greedy(4)))
    steps = engine.stats.steps
    await asyncio.sleep(0.2)
    assert not held.done() and engine.stats.steps == steps
    await engine.resume()
    assert len((await held).completions[0].token_ids) == 4


async def test_update_weights_bumps_version_and_changes_output(model):
    m = copy.deepcopy(model)
    eng = TransformersEngine(m)
    try:
        before = await eng.generate(PROMPTS[0], greedy(8))
        state = {k: v + 0.05 * torch.randn_like(v) for k, v in m.state_dict().items()}
        assert await eng.update_weights(state) == 1 == eng.policy_version
        after = await eng.generate(PROMPTS[0], greedy(8))
        assert (before.policy_version, after.policy_version) == (0, 1)
        assert after.completions[0].logprobs != before.completions[0].logprobs
        with pytest.raises(UserError):
            await eng.update_weights({"nope.weight": torch.zeros(1)})
    finally:
        await eng.close()


async def test_prefix_cache_is_exact_and_dropped_on_update(model):
    m = copy.deepcopy(model)
    eng = TransformersEngine(m, prefix_cache_tokens=4096)
    system = list(range(100, 140))  # a shared "system + tools" prompt
    prompts = [[*system, i, i + 1] for i in range(6)]
    params = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)
    try:
        await eng.generate(prompts[0], params)
        results = await asyncio.gather(*(eng.generate(p, params) for p in prompts[1:]))
        assert eng.stats.prefix_hits >= 5 and eng.stats.prefix_tokens >= 5 * len(system)
        for prompt, res in zip(prompts[1:], results, strict=True):
            assert_token_exact(m, prompt, res.completions[0], 0.8)
        state = {k: v + 0.05 * torch.randn_like(v) for k, v in m.state_dict().items()}
        await eng.update_weights(state)
        comp = (await eng.generate(prompts[2], params)).completions[0]  # no stale KV
        assert_token_exact(m, prompts[2], comp, 0.8)
    finally:
        await eng.close()


def test_prefix_cache_finds_the_longest_stored_run_and_evicts_by_tokens():
    def kv(n: int, fill: float) -> list:
        return [(torch.full((1, 2, n, 4), fill), torch.full((1, 2, n, 4), -fill))]

    cache = PrefixCache(max_tokens=100, min_tokens=4, block=4)
    a = list(range(100, 130))  # 30 tokens
    cache.store(a, kv(30, 1.0))
    assert cache.lookup(a) is not None and len(cache.lookup(a).tokens) == 29  # proper prefix
    hit = cache.lookup([*a[:17], 7, 8, 9])  # the front of an entry, beyond a block boundary
    assert hit.tokens == tuple(a[:17]) and hit.layers[0][0].shape == (1, 2, 17, 4)
    assert cache.lookup([*a, 1, 2]).tokens == tuple(a)  # the whole entry, and more to prefill
    assert cache.lookup(a[:3] + [0] * 10) is None  # shorter than min_tokens
    assert cache.lookup([5] * 40) is None
    b = a[:8] + list(range(500, 560))  # 68 tokens: 98 held
    cache.store(b, kv(68, 2.0))
    assert cache.lookup([*b, 1]).layers[0][0][0, 0, 0, 0] == 2.0
    cache.store(list(range(900, 910)), kv(10, 3.0))  # 108 > 100: the least recently used goes
    assert cache.size == 78 and cache.lookup([*a, 1]).tokens == tuple(a[:8])  # only via b
    cache.clear()
    assert cache.lookup([*b, 1]) is None and cache.size == 0


async def test_batched_prefill_on_different_prefixes_is_exact(model):
    """Prompts on different cached prefixes (and none) prefill in one forward; identical
    prompts once; an agent's next call reuses the KV of the previous prompt + completion."""
    m = copy.deepcopy(model)
    eng = TransformersEngine(m, prefix_cache_tokens=8192)
    system = list(range(100, 140))
    params = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)
    try:
        first = await eng.generate([*system, 7, 8], params)  # cached: the prompt, the completion
        done = first.completions[0].token_ids
        prompts = [
            [*system, 7, 8, *done, 50, 51, 52],  # an agent's next call
            [*system, 9, 9, 9],  # the system prompt only
            [*system, 9, 9, 9],  # the same prompt again: one prefill row
            list(range(200, 230)),  # nothing cached
        ]
        prefills, hits = eng.stats.prefills, eng.stats.prefix_hits
        loop = asyncio.get_running_loop()  # keep the worker busy while all four queue up
        eng._scheduler.inbox.put((time.sleep, 0.3, loop.create_future(), loop))
        results = await asyncio.gather(*(eng.generate(p, params) for p in prompts))
        assert eng.stats.prefills - prefills == 1  # one forward for all four
        assert eng.stats.prefix_hits - hits == 3
        assert eng.stats.prefix_tokens >= 42 + 7 + 2 * 40  # the completion's KV was reused
        for prompt, res in zip(prompts, results, strict=True):
            assert_token_exact(m, prompt, res.completions[0], 0.8)
    finally:
        await eng.close()


async def test_model_fault_fails_request_and_engine_keeps_serving(model):
    m = copy.deepcopy(model)
    poison, fail_decode = 298, {"on": False}
    forward = m.forward

    @functools.wraps(forward)
    def faulty(*args, input_ids=None, **kwargs):
        if (input_ids == poison).any() or (fail_decode["on"] and input_ids.shape[1] == 1):
            raise RuntimeError("injected model fault")
        return forward(*args, input_ids=input_ids, **kwargs)

    m.forward = faulty
    eng = TransformersEngine(m)
    try:
        good = [eng.generate(p, greedy(6)) for p in PROMPTS[:2]]
        results = await asyncio.gather(
            eng.generate([1, poison], greedy(6)), *good, return_exceptions=True
        )
        assert isinstance(results[0], EngineFailed)
        assert all(len(r.completions[0].token_ids) == 6 for r in results[1:])
        fail_decode["on"] = True
        with pytest.raises(EngineFailed, match="injected"):
            await asyncio.wait_for(eng.generate(PROMPTS[0], greedy(6)), 10)
        fail_decode["on"] = False
        assert len((await eng.generate(PROMPTS[0], greedy(6))).completions) == 1
    finally:
        await eng.close()


async def test_cancelled_request_is_dropped_and_close_fails_pending(engine):
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(engine.generate([1], SamplingParams(max_tokens=250)), 0.02)
    await asyncio.sleep(0.05)
    steps = engine.stats.steps
    await asyncio.sleep(0.1)
    assert engine.stats.steps == steps  # the worker went idle
    pending = asyncio.create_task(engine.generate([1], SamplingParams(max_tokens=250)))
    await asyncio.sleep(0.02)
    await engine.close()
    with pytest.raises(EngineFailed):
        await pending
    with pytest.raises(EngineFailed):
        await engine.generate([1], greedy(2))


async def test_from_pretrained_loads_model_and_tokenizer(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    eng = TransformersEngine.from_pretrained(str(tmp_path), max_batch_size=4)
    try:
        assert eng.tokenizer is not None and eng._scheduler.max_batch_size == 4
        res = await eng.generate(PROMPTS[0], greedy(5, stop=("x",)))
        assert len(res.completions[0].token_ids) <= 5
    finally:
        await eng.close()


async def test_bad_input_is_a_user_error(engine):
    with pytest.raises(UserError):
        await engine.generate([], greedy(2))
    with pytest.raises(UserError):
        await engine.generate([VOCAB + 5], greedy(2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_logprobs_token_exact(model):
    eng = TransformersEngine(copy.deepcopy(model), device="cuda")
    try:
        params = SamplingParams(temperature=0.7, max_tokens=16, ignore_eos=True)
        results = await asyncio.gather(*(eng.generate(p, params) for p in PROMPTS))
        for prompt, res in zip(PROMPTS, results, strict=True):
            assert_token_exact(model, prompt, res.completions[0], 0.7)
    finally:
        await eng.close()


def test_from_pretrained_keeps_the_starter_tokenizer(starter_dir) -> None:
    """AutoTokenizer would load a starter folder as Qwen2Tokenizer and split numbers by digit."""
    from tether.models import load_tokenizer

    engine = TransformersEngine.from_pretrained(str(starter_dir))
    try:
        text = "What is 12345 + 678?"
        assert engine.tokenizer.encode(text) == load_tokenizer(starter_dir).encode(text)
    finally:
        asyncio.run(engine.close())
