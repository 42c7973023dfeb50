"""Rollouts → samples: prefix merging, masks, packing, collation and logprob alignment."""

from __future__ import annotations

import math

import pytest
import torch

from tether.records import Call, CallStatus
from tether.trainer._forward import token_entropy, token_logprobs, token_logprobs_and_entropy
from tether.trainer.algorithms import aggregate, mismatch_metrics, ppo_clip_loss
from tether.trainer.samples import Sample, build_samples, collate, make_micro_batches


def call(seq, prompt, completion, logprobs=None, *, version=0, temperature=1.0, rid="r"):
    lps = logprobs if logprobs is not None else [-0.5 - i for i in range(len(completion))]
    return Call(rid, seq, list(prompt), list(completion), lps, version, temperature=temperature)


def test_two_call_rollout_is_merged_with_the_right_masks():
    c0 = call(0, [1, 2, 3], [4, 5], [-0.1, -0.2], version=3)
    c1 = call(1, [1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [-0.3, -0.4, -0.5], version=2)
    samples, stats = build_samples([[c1, c0]], [0.75])  # order by seq, not by list position
    assert len(samples) == 1
    s = samples[0]
    assert s.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert s.old_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5]
    assert (s.advantage, s.rollout_index, s.num_calls) == (0.75, 0, 2)
    assert stats.calls == 2 and stats.merged_calls == 1 and stats.merge_fraction == 0.5


def test_non_extending_call_starts_a_new_sample():
    c0 = call(0, [1, 2, 3], [4, 5])
    c1 = call(1, [1, 2, 9, 4, 5, 6], [7])  # history rewritten: not a prefix
    c2 = call(2, [1, 2, 3, 4, 5, 6], [7], temperature=0.7)  # prefix, other temperature
    samples, stats = build_samples([[c0, c1, c2]], [-1.0])
    assert [s.input_ids for s in samples] == [
        [1, 2, 3, 4, 5],
        [1, 2, 9, 4, 5, 6, 7],
        [*c2.prompt_ids, 7],
    ]
    assert samples[1].loss_mask == [0, 0, 0, 0, 0, 0, 1]
    assert [s.temperature for s in samples] == [1.0, 1.0, 0.7]
    assert all(s.advantage == -1.0 for s in samples)
    assert stats.merged_calls == 0 and stats.samples == 3


def test_interleaved_side_call_does_not_break_merging():
    main0 = call(0, [1, 2], [3])
    side = call(1, [50, 51], [52])  # e.g. a summarizer call in between
    main1 = call(2, [1, 2, 3, 4], [5])
    samples, stats = build_samples([[main0, side, main1]], [1.0])
    assert [s.input_ids for s in samples] == [[1, 2, 3, 4, 5], [50, 51, 52]]
    assert samples[0].loss_mask == [0, 0, 1, 0, 1]
    assert stats.merged_calls == 1


def test_failed_empty_and_malformed_calls():
    failed = call(0, [1, 2], [3])
    failed.status = CallStatus.FAILED
    empty = call(0, [7, 8], [], rid="q")
    greedy = call(1, [1, 2], [3], temperature=0.0)
    samples, stats = build_samples([[failed, greedy], [empty]], [1.0, 2.0])
    assert len(samples) == 1 and samples[0].temperature == 1.0  # greedy logprobs are at T = 1
    assert (stats.failed_calls, stats.empty_samples, stats.calls) == (1, 1, 2)
    with pytest.raises(ValueError, match="logprobs"):
        build_samples([[call(0, [1], [2, 3], [-1.0])]], [0.0])
    with pytest.raises(ValueError, match="advantages"):
        build_samples([[greedy]], [])


def _sample(n, i=0):
    return Sample([1] * n, [0] + [1] * (n - 1), [0.0] * n, 0.0, i, 1.0)


def test_micro_batches_respect_the_budget_and_are_deterministic():
    lengths = [5, 17, 3, 8, 8, 12, 40, 2, 9]
    samples = [_sample(n, i) for i, n in enumerate(lengths)]
    batches = make_micro_batches(samples, 32)
    assert batches == make_micro_batches(list(samples), 32)
    seen = sorted(s.rollout_index for b in batches for s in b)
    assert seen == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(len(s) for s in b) <= 32 or len(b) == 1
    assert [len(s) for s in batches[0]] == [40]  # over budget: alone
    flat = [len(s) for b in batches for s in b]
    assert flat == sorted(flat, reverse=True)
    with pytest.raises(ValueError, match="positive"):
        make_micro_batches(samples, 0)


def test_collate_pads_right_and_keeps_alignment():
    c0 = call(0, [1, 2], [3, 4], [-0.1, -0.2], version=5)
    c1 = call(0, [6], [7], [-0.3], temperature=0.5, rid="other")
    samples, _ = build_samples([[c0], [c1]], [0.5, -0.5])
    batch = collate(samples, pad_id=99)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [6, 7, 99, 99]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    torch.testing.assert_close(
        batch["old_logprobs"], torch.tensor([[0, 0, -0.1, -0.2], [0, -0.3, 0, 0]])
    )
    assert batch["advantages"].tolist() == [0.5, -0.5]
    assert batch["rollout_index"].tolist() == [0, 1]
    assert batch["temperature"].tolist() == [1.0, 0.5]


# --------------------------------------------------------------------------- tiny Qwen2


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _one_at_a_time(model, ids: list[int], t: int, temperature: float) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids[:t]])).logits[0, -1].float()
    return torch.log_softmax(logits / temperature, -1)[ids[t]].item()


def test_token_logprobs_match_one_position_at_a_time(tiny_model):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (9, 6)]
    temps = torch.tensor([1.0, 0.7])
    batch = collate([Sample(r, [0] * len(r), [0.0] * len(r), 0.0, 0, 1.0) for r in rows])
    with torch.no_grad():
        logits = tiny_model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    got = token_logprobs(logits, batch["input_ids"], temps)
    assert got.shape == batch["input_ids"].shape and got.dtype == torch.float32
    for b, ids in enumerate(rows):
        assert got[b, 0].item() == 0.0
        for t in range(1, len(ids)):
            ref = _one_at_a_time(tiny_model, ids, t, temps[b].item())
            assert got[b, t].item() == pytest.approx(ref, abs=1e-5)
    # chunking does not change the result, and gradients flow
    x = logits.clone().requires_grad_(True)
    again = token_logprobs(x, batch["input_ids"], temps, chunk_rows=2)
    torch.testing.assert_close(again, got)
    again.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_token_entropy_matches_an_explicit_softmax_loop():
    """Entropy of softmax(logits / T) per position, against a plain loop over a 5-word vocabulary."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 5, generator=g) * 3
    logits[1, 2] = torch.tensor([40.0, 0.0, 0.0, 0.0, 0.0])  # nearly one-hot: entropy ~0
    temps = torch.tensor([1.0, 0.7, 1.5])
    got = token_entropy(logits, temps)
    assert got.shape == (3, 4) and got.dtype == torch.float32
    for b in range(3):
        assert got[b, 0].item() == 0.0  # column t: the distribution token t was drawn from
        for t in range(1, 4):
            z = [x / temps[b].item() for x in logits[b, t - 1].tolist()]
            weights = [math.exp(x - max(z)) for x in z]
            probs = [w / sum(weights) for w in weights]
            ref = -sum(p * math.log(p) for p in probs if p > 0)
            assert got[b, t].item() == pytest.approx(ref, abs=1e-5)
    assert got[1, 3].item() < 1e-6
    torch.testing.assert_close(token_entropy(logits, temps, chunk_rows=2), got)
    uniform = token_entropy(torch.zeros(1, 2, 5))
    assert uniform[0, 1].item() == pytest.approx(math.log(5))
    # the trainer's one-pass version gives both, equal to the separate functions
    ids = torch.randint(0, 5, (3, 4), generator=g)
    both, ent = token_logprobs_and_entropy(logits, ids, temps)
    torch.testing.assert_close(both, token_logprobs(logits, ids, temps))
    torch.testing.assert_close(ent, got)
    assert token_logprobs_and_entropy(logits, ids, temps, entropy=False)[1] is None


def test_merged_samples_reproduce_engine_logprobs(tiny_model):
    """Engine logprobs recorded per call equal the trainer's on the merged sequence."""

    def engine_call(seq, prompt, completion, temperature, rid):
        full = prompt + completion
        lps = [
            _one_at_a_time(tiny_model, full, len(prompt) + i, temperature)
            for i in range(len(completion))
        ]
        return call(seq, prompt, completion, lps, temperature=temperature, rid=rid)

    a0 = engine_call(0, [1, 2, 3], [10, 11], 1.0, "a")
    a1 = engine_call(1, [1, 2, 3, 10, 11, 20, 21], [12, 13, 14], 1.0, "a")
    b0 = engine_call(0, [5, 6], [30], 0.8, "b")
    samples, stats = build_samples([[a0, a1], [b0]], [1.0, -1.0])
    assert stats.merged_calls == 1
    batch = collate(samples)
    with torch.no_grad():
        logits = tiny_model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    trainer = token_logprobs(logits, batch["input_ids"], batch["temperature"])
    mask = batch["loss_mask"]
    torch.testing.assert_close(trainer * mask, batch["old_logprobs"], atol=1e-5, rtol=0)
    assert mismatch_metrics(trainer, batch["old_logprobs"], mask)["max_abs_diff"] < 1e-5
    loss, metrics = ppo_clip_loss(trainer, batch["old_logprobs"], batch["advantages"], mask)
    assert metrics["clip_frac"].item() == 0.0
    value = aggregate(loss, mask, "rollout_mean", rollout_index=batch["rollout_index"])
    assert torch.isfinite(value)
