"""Memory-lean updates: chunked LM head and gradient checkpointing give the plain numbers.

Every comparison is in float32 against the plain computation, ``model(ids).logits``
→ :func:`token_logprobs_and_entropy`, on random tiny Qwen2 models (tied embeddings,
as Qwen2.5-0.5B), plain and LoRA, on rows that share a prompt prefix. Tolerances:
logprobs and entropies 1e-5 absolute; gradients 1e-5 absolute + 1e-4 relative (the
chunked head multiplies other blocks of rows, so sums round differently).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.helpers import tiny_qwen2
from tether.records import Call
from tether.trainer import LoraConfig, PolicyTrainer, TrainerConfig
from tether.trainer._forward import token_logprobs_and_entropy, token_logprobs_from_hidden
from tether.trainer.samples import build_samples, collate

VOCAB = 300
ATOL, RTOL = 1e-5, 1e-4


def _model(seed: int = 0) -> Any:
    return tiny_qwen2(
        VOCAB,
        seed=seed,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )


def _batch(prefix_len: int = 20) -> dict[str, torch.Tensor]:
    """Three rollouts whose prompts share ``prefix_len`` tokens, at two temperatures."""
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, VOCAB, (prefix_len,), generator=g).tolist()
    rollouts = []
    for r in range(3):
        prompt = prefix + torch.randint(3, VOCAB, (r + 2,), generator=g).tolist()
        completion = torch.randint(3, VOCAB, (6 + 2 * r,), generator=g).tolist()
        lps = [-1.0 - 0.1 * i for i in range(len(completion))]
        rollouts.append([Call(f"r{r}", 0, prompt, completion, lps, 0, temperature=0.7 + 0.3 * r)])
    return collate(build_samples(rollouts, [1.0, -0.5, 0.25])[0])


def _plain(model: Any, batch: dict[str, torch.Tensor]) -> tuple:
    """The reference: full logits from the model's own forward; logprobs, entropies, grads."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp, ent = token_logprobs_and_entropy(logits, batch["input_ids"], batch["temperature"])
    return _finish(model, lp, ent, batch)


def _finish(model: Any, lp: torch.Tensor, ent: torch.Tensor, batch: dict) -> tuple:
    mask = batch["loss_mask"]
    (lp * mask * batch["advantages"][:, None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return (lp.detach() * mask, ent * mask, grads)


def _assert_same(got: tuple, want: tuple) -> None:
    (lp, ent, grads), (lp0, ent0, grads0) = got, want
    torch.testing.assert_close(lp, lp0, atol=ATOL, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=ATOL, rtol=0)
    assert grads.keys() == grads0.keys() and grads0
    for name in grads0:
        torch.testing.assert_close(grads[name], grads0[name], atol=ATOL, rtol=RTOL, msg=name)
    assert any(g.abs().sum() > 0 for g in grads0.values())


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_head_matches_full_logits_and_their_gradients(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 11, 16, generator=g, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False)
    ids = torch.randint(0, 50, (3, 11), generator=g)
    temps = torch.tensor([1.0, 0.6, 1.3])
    weights = torch.randn(3, 11, generator=g)

    lp0, ent0 = token_logprobs_and_entropy(head(hidden), ids, temps)
    (lp0 * weights).sum().backward()
    want = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None

    lp, ent = token_logprobs_from_hidden(hidden, head, ids, temps, chunk)
    (lp * weights).sum().backward()
    torch.testing.assert_close(lp, lp0, atol=ATOL, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=ATOL, rtol=0)
    torch.testing.assert_close(hidden.grad, want[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(head.weight.grad, want[1], atol=ATOL, rtol=RTOL)
    assert lp[:, 0].abs().sum() == 0 and ent[:, 0].abs().sum() == 0


def test_chunked_head_without_gradients_or_entropy() -> None:
    hidden = torch.randn(2, 5, 8)
    head = torch.nn.Linear(8, 20, bias=False)
    ids = torch.randint(0, 20, (2, 5))
    with torch.no_grad():
        lp0 = token_logprobs_and_entropy(head(hidden), ids, 0.9, entropy=False)[0]
        lp, ent = token_logprobs_from_hidden(hidden, head, ids, 0.9, 3, entropy=False)
    assert ent is None
    torch.testing.assert_close(lp, lp0, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs_from_hidden(hidden, head, ids, 1.0, 0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize(
    ("chunk", "checkpointing", "every_n"),
    [(0, False, 1), (5, False, 1), (0, True, 1), (5, True, 1), (5, True, 2)],
    ids=["plain", "chunked", "checkpointed", "chunked+checkpointed", "chunked+every-2nd"],
)
def test_update_forward_matches_the_plain_forward(
    lora: bool, chunk: int, checkpointing: bool, every_n: int
) -> None:
    """Logprobs, entropies and every trainable parameter's gradient, with the shared
    prefix run once, the LM head chunked and/or the layers checkpointed (all of them, or
    every second: layers 0 and 2 of 3), equal the plain forward's (same weights: the LoRA
    B matrices are made nonzero first)."""
    batch = _batch()
    lora_cfg = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    cfg = TrainerConfig(
        lora=lora_cfg if lora else None,
        logprob_chunk_tokens=chunk,
        gradient_checkpointing=checkpointing,
        checkpoint_every_n_layers=every_n,
    )
    trainer = PolicyTrainer(_model(), cfg)
    if checkpointing:  # the decoder layers: every every_n-th one checkpointed
        flags = [m.gradient_checkpointing for m in _decoder_layers(trainer.model)]
        assert flags == [i % every_n == 0 for i in range(3)], flags
    if lora:
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    reference = copy.deepcopy(trainer.model)
    if checkpointing:  # the reference runs without it
        reference.get_base_model().gradient_checkpointing_disable() if lora else (
            reference.gradient_checkpointing_disable()
        )
    want = _plain(reference, batch)

    trainer.model.zero_grad(set_to_none=True)
    lp, ent = trainer._forward_logprobs(trainer.model, batch, entropy=True)
    _assert_same(_finish(trainer.model, lp, ent, batch), want)


def _decoder_layers(model: Any) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def test_update_with_chunks_and_checkpointing_lands_on_the_same_weights() -> None:
    """One full GRPO update (PolicyTrainer.update) with the memory-lean forward gives the
    parameters of the plain one."""
    batch_samples = build_samples(
        [
            [Call(f"r{r}", 0, list(range(3, 40)), [50 + r, 60, 70 + r], [-1.0] * 3, 0)]
            for r in range(4)
        ],
        [1.0, -1.0, 0.5, -0.5],
    )[0]
    results = []
    for chunk, ckpt in ((0, False), (4, True)):
        cfg = TrainerConfig(lr=1e-2, logprob_chunk_tokens=chunk, gradient_checkpointing=ckpt)
        trainer = PolicyTrainer(_model(), cfg)
        metrics = trainer.update(batch_samples)
        results.append((metrics, dict(trainer.model.named_parameters())))
    (m0, p0), (m1, p1) = results
    assert abs(m0["loss"] - m1["loss"]) < 1e-6 and abs(m0["entropy"] - m1["entropy"]) < 1e-5
    before = dict(_model().named_parameters())
    for name in p0:
        torch.testing.assert_close(p1[name], p0[name], atol=1e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(p0[n], before[n]) for n in p0)
