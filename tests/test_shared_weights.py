"""The embedded engine decodes with the trainer's own weights: one copy, no copying.

When :meth:`PolicyTrainer.can_share_weights` (no LoRA, no dropout) the run hands
``trainer.model`` to the engine; the optimizer step holds the engine's weights
lock, and the engine's weight update is a version bump.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from tether.engine import SamplingParams, TransformersEngine
from tether.models import load_model
from tether.records import Call
from tether.trainer import PolicyTrainer
from tether.trainer.config import LoraConfig, TrainerConfig
from tether.trainer.samples import build_samples

PROMPT = list(range(40, 60))
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _samples(model: Any) -> list:
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for r in range(2):
        ids = torch.randint(3, 1600, (18,), generator=g).tolist()
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        lps = [logp[11 + i, t].item() for i, t in enumerate(ids[12:])]
        call = Call(
            rollout_id=f"r{r}",
            seq=0,
            prompt_ids=ids[:12],
            completion_ids=ids[12:],
            logprobs=lps,
            policy_version=0,
        )
        rollouts.append([call])
    return build_samples(rollouts, [1.0, -1.0])[0]


def test_which_weights_can_be_shared(starter_dir: Path) -> None:
    assert PolicyTrainer(load_model(starter_dir), TrainerConfig()).can_share_weights()
    lora = PolicyTrainer(load_model(starter_dir), TrainerConfig(lora=LoraConfig(r=4)))
    assert not lora.can_share_weights()  # the engine needs merged weights
    dropout = load_model(starter_dir)
    dropout.config.attention_dropout = 0.1  # train and eval mode would differ
    assert not PolicyTrainer(dropout, TrainerConfig()).can_share_weights()


def test_engine_decodes_with_the_updated_weights_without_a_copy(
    starter_dir: Path, tokenizer: Any
) -> None:
    trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig(lr=1e-2))
    engine = TransformersEngine(trainer.model, tokenizer)
    trainer.share_weights(engine.weights_lock)
    copy = TransformersEngine(load_model(starter_dir), tokenizer)

    async def go() -> None:
        try:
            before = await engine.generate(PROMPT, GREEDY)
            trainer.update(_samples(trainer.model))
            assert trainer.state_dict() == {}  # nothing to copy
            assert await engine.update_weights({}) == 1 == engine.policy_version
            after = await engine.generate(PROMPT, GREEDY)
            await copy.update_weights({k: v.clone() for k, v in trainer.model.state_dict().items()})
            reference = await copy.generate(PROMPT, GREEDY)
        finally:
            await engine.close()
            await copy.close()
        got, old, ref = (r.completions[0].logprobs for r in (after, before, reference))
        assert got != old  # the engine saw the optimizer step
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref))  # and all of it

    asyncio.run(go())


def test_no_decode_step_runs_while_the_weights_lock_is_held(
    starter_dir: Path, tokenizer: Any
) -> None:
    """What the optimizer step relies on: the engine's worker takes the lock for each step."""
    engine = TransformersEngine(load_model(starter_dir), tokenizer)

    async def go() -> None:
        try:
            with engine.weights_lock:
                task = asyncio.ensure_future(engine.generate(PROMPT, GREEDY))
                await asyncio.sleep(0.5)
                assert not task.done()
            result = await asyncio.wait_for(task, 30)
            assert len(result.completions[0].token_ids) == 6
        finally:
            await engine.close()

    asyncio.run(go())
