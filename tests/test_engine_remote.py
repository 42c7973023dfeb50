"""RemoteEngine against the fake vLLM and SGLang servers (real processes, real HTTP).

The same cases run against each fake: the answer equals the embedded engine's for the
same weights, a push by each transport makes the server serve the pushed weights and
report the new version, and with two replicas a dead one's rollouts move to the other.
The fakes are FAKES (tests/fake_backend.py): what they show is that tether speaks the
routes and shapes of the pinned versions, not that a real server behaves the same.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.remote_servers import KINDS, REAL, fake_server
from tether.engine import (
    EngineConfig,
    EngineFailed,
    GenerateResult,
    RemoteEngine,
    SamplingParams,
    TransformersEngine,
    connect_engine,
)
from tether.engine._connect import server_api

PROMPT = [5, 17, 42, 99, 7, 300, 12]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _same(got: GenerateResult, want: GenerateResult, atol: float = 1e-5) -> None:
    for g, w in zip(got.completions, want.completions, strict=True):
        assert g.token_ids == w.token_ids
        torch.testing.assert_close(
            torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=atol, rtol=0
        )


async def _reference(model: Any, params: SamplingParams = GREEDY) -> GenerateResult:
    engine = TransformersEngine(model)
    try:
        return await engine.generate(PROMPT, params)
    finally:
        await engine.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_an_answer_equals_the_embedded_engines(kind: str, starter_dir: Path) -> None:
    from tether.models import load_model

    with fake_server(kind, starter_dir) as url:
        engine = await connect_engine(EngineConfig(kind=kind, urls=[url]))
        try:
            assert engine.model and engine.max_positions
            got = await engine.generate(PROMPT, GREEDY)
            streamed = [x async for x in engine.generate_stream(PROMPT, GREEDY)]
        finally:
            await engine.close()
    want = await _reference(load_model(starter_dir))
    _same(got, want)
    assert got.policy_version == 0
    assert isinstance(streamed[-1], GenerateResult)
    _same(streamed[-1], want)
    assert [d.token_id for d in streamed[:-1]] == want.completions[0].token_ids


def _pushed(starter_dir: Path, transport: str) -> tuple[dict[str, Any], dict | None, Any]:
    """What a trainer would push by ``transport``, its LoRA config, and the model whose
    answers the server must then give."""
    import copy

    from tether._hf import adapter_config, adapter_weights
    from tether.models import load_model

    torch.manual_seed(1)
    model = load_model(starter_dir)
    if transport != "lora":
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return {k: v.clone() for k, v in model.state_dict().items()}, None, model
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    merged = copy.deepcopy(peft_model).merge_and_unload()  # peft's own merge: the reference
    return adapter_weights(peft_model), adapter_config(peft_model), merged


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["disk", "lora", "nccl"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_push_serves_the_new_weights_at_the_new_version(
    kind: str, transport: str, starter_dir: Path, tmp_path: Path
) -> None:
    if REAL and transport == "nccl":
        pytest.skip("vLLM's CPU build has no NCCL to push weights over")
    state, lora_config, expected = _pushed(starter_dir, transport)
    with fake_server(kind, starter_dir, transport) as url:
        engine = await RemoteEngine.connect(
            server_api(kind), [url], transport=transport, weights_dir=tmp_path / "weights",
            model_dir=starter_dir, lora_config=lora_config, nccl=("127.0.0.1", 0, "gloo"),
        )  # fmt: skip
        try:
            before = await engine.generate(PROMPT, GREEDY)
            assert await engine.update_weights(state) == 1
            after = await engine.generate(PROMPT, GREEDY)
            assert await engine.update_weights(state, version=7) == 7  # a resumed run's version
            again = await engine.generate(PROMPT, GREEDY)
        finally:
            await engine.close()
    assert before.policy_version == 0 and after.policy_version == 1 and again.policy_version == 7
    want = await _reference(expected)
    assert after.completions[0].token_ids != before.completions[0].token_ids
    _same(after, want, atol=1e-4)


@pytest.mark.slow
async def test_a_dead_replicas_rollouts_move_to_the_live_one(starter_dir: Path) -> None:
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(contextlib.ExitStack())
        a = first.enter_context(fake_server("vllm", starter_dir))
        b = stack.enter_context(fake_server("vllm", starter_dir))
        # no health checks but the test's own: one during a's shutdown (seconds, for the
        # real server) would leave it out before the call that is to find it dead
        cfg = EngineConfig(kind="vllm", urls=[a, b], health_interval_s=3600)
        engine = await connect_engine(cfg)
        try:
            served = {f"r-{i}": engine.replicas.pick(f"r-{i}").url for i in range(20)}
            on_a = next(k for k, u in served.items() if u == a)
            on_b = next(k for k, u in served.items() if u == b)
            ok = await engine.generate(PROMPT, _with(GREEDY, on_a))
            first.close()  # replica a dies
            with pytest.raises(EngineFailed, match=f"cannot reach the vLLM server at {a}"):
                await engine.generate(PROMPT, _with(GREEDY, on_a))
            retried = await engine.generate(PROMPT, _with(GREEDY, on_a))  # the retried attempt
            await engine.generate(PROMPT, _with(GREEDY, on_b))
            assert [r.url for r in engine.replicas.live()] == [b]
            await engine.check_health()  # a is still down
            assert [r.url for r in engine.replicas.live()] == [b]
        finally:
            await engine.close()
    _same(retried, ok)


def _with(params: SamplingParams, affinity: str) -> SamplingParams:
    from dataclasses import replace

    return replace(params, affinity=affinity)


async def test_an_unreachable_server_is_one_line_naming_it() -> None:
    with pytest.raises(
        EngineFailed, match=r"cannot reach the SGLang server at http://127\.0\.0\.1:9"
    ):
        await connect_engine(EngineConfig(kind="sglang", urls=["http://127.0.0.1:9"]))
