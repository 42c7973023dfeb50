"""The embedded engine serving several LoRA adapters (agent roles, docs/credit.md "Roles").

A tiny random Qwen2 wrapped by peft with two adapters (``default``, the shared
policy, and ``solver``), both with random nonzero B so each changes the output.
Each request of a mixed batch must get the logprobs of a model with only its own
adapter; ``base`` the base model's.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from tests.helpers import tiny_qwen2
from tether.engine import BASE_ADAPTER, RoleAdaptersPush, SamplingParams, TransformersEngine
from tether.errors import UserError

VOCAB = 300
PROMPT = list(range(20, 60))  # long enough for the prefix cache (min 16 tokens)
LONGER = [*PROMPT, 7]


def lora_model(lora_seed: int = 1):
    base = tiny_qwen2(VOCAB, seed=0).eval()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    peft = get_peft_model(base, config)
    peft.add_adapter("solver", config)
    torch.manual_seed(lora_seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return peft.eval()


def alone(model, adapter: str | None):
    """A copy of ``model`` running only ``adapter`` (None: the base model)."""
    solo = copy.deepcopy(model)
    if adapter is None:
        return solo.unload()  # the LoRA layers removed, nothing merged
    solo.set_adapter(adapter)
    return solo


def reference(model, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    return torch.log_softmax(rows, -1)[range(len(completion)), completion].tolist()


def greedy(adapter: str | None = None, n: int = 10) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, adapter=adapter)


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def model():
    return lora_model()


async def test_a_mixed_batch_gives_each_request_its_own_adapter(model):
    engine = TransformersEngine(copy.deepcopy(model), seed=0)
    try:
        assert engine.adapters == {"default", "solver"}
        assert type(engine.weight_push) is RoleAdaptersPush  # a run pushes every adapter
        adapters = [None, "solver", BASE_ADAPTER, "solver"]
        prompts = [PROMPT, PROMPT, PROMPT, PROMPT[3:]]
        results = await asyncio.gather(
            *(engine.generate(p, greedy(a)) for p, a in zip(prompts, adapters, strict=True))
        )
        assert max(engine.stats.batch_sizes) == 4  # decoded together
        ids = [r.completions[0].token_ids for r in results]
        for p, a, r in zip(prompts, adapters, results, strict=True):
            solo = alone(model, "default" if a is None else None if a == BASE_ADAPTER else a)
            c = r.completions[0]
            assert gap(reference(solo, p, c.token_ids), c.logprobs) < 1e-5, a
            with torch.no_grad():  # greedy: the adapter's own argmax path
                want = solo.generate(
                    torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None
                )[0, len(p) :].tolist()
            assert c.token_ids == want, a
        assert len({tuple(i) for i in ids[:3]}) == 3  # three adapters, three completions
    finally:
        await engine.close()


async def test_the_prefix_cache_keys_on_the_adapter(model):
    engine = TransformersEngine(copy.deepcopy(model), seed=0)
    try:
        await engine.generate(PROMPT, greedy(None))
        hits = engine.stats.prefix_hits
        other = await engine.generate(LONGER, greedy("solver"))
        assert engine.stats.prefix_hits == hits  # the default adapter's KV is not solver's
        c = other.completions[0]
        assert gap(reference(alone(model, "solver"), LONGER, c.token_ids), c.logprobs) < 1e-5
        again = await engine.generate(LONGER, greedy(None))
        assert engine.stats.prefix_hits == hits + 1  # its own adapter's KV is reused
        d = again.completions[0]
        assert gap(reference(alone(model, "default"), LONGER, d.token_ids), d.logprobs) < 1e-5
    finally:
        await engine.close()


async def test_update_weights_per_adapter_bumps_the_version_once(model):
    engine = TransformersEngine(copy.deepcopy(model), seed=0)
    try:
        before = {a: await engine.generate(PROMPT, greedy(a)) for a in (None, "solver")}
        trained = lora_model(lora_seed=5)  # the same base, other random B
        new = get_peft_model_state_dict(trained, adapter_name="solver")
        assert await engine.update_weights({"solver": new}) == 1
        after = {a: await engine.generate(PROMPT, greedy(a)) for a in (None, "solver")}
        same = before[None].completions[0]
        assert after[None].completions[0].logprobs == pytest.approx(same.logprobs, abs=1e-6)
        c = after["solver"].completions[0]
        assert gap(reference(alone(trained, "solver"), PROMPT, c.token_ids), c.logprobs) < 1e-5
        assert await engine.update_weights({}) == 2
        with pytest.raises(UserError, match="does not serve"):
            await engine.update_weights({"critic": new})
        with pytest.raises(UserError, match="not served by this engine"):
            await engine.generate(PROMPT, greedy("critic"))
    finally:
        await engine.close()


async def test_a_plain_model_refuses_a_named_adapter():
    engine = TransformersEngine(tiny_qwen2(VOCAB).eval(), seed=0)
    try:
        with pytest.raises(UserError, match="adapter 'solver' is not served"):
            await engine.generate(PROMPT, greedy("solver"))
        # the base weights are what a plain model serves anyway
        assert (await engine.generate(PROMPT, greedy(BASE_ADAPTER))).completions[0].token_ids
    finally:
        await engine.close()
