"""The policy update's math end to end: the trainer's loss and gradient against plain loops.

Each sample is run through the model alone (no padding, no micro-batches, no
shared prefix) and the loss is written per token in Python; the trainer, which
pads, packs micro-batches and accumulates gradients, must give the same loss
and the same gradient.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tether.models import load_model
from tether.records import Call
from tether.trainer import PolicyTrainer
from tether.trainer.config import TrainerConfig
from tether.trainer.samples import build_samples

PROMPTS = (20, 6, 13, 4)  # different prompt and completion lengths: micro-batches of
COMPLETIONS = (3, 9, 5, 7)  # different padded widths, none equal to the longest completion
ADVANTAGES = (1.0, -1.0, 0.5, -0.25)


def _samples(model: Any, shift: float = 0.0) -> list:
    """One call per rollout; the engine's logprobs are the model's, moved by up to ±``shift``."""
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for r, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        ids = torch.randint(3, 1600, (p + c,), generator=g).tolist()
        logp = _token_logprobs(model, ids).detach()
        noise = (torch.rand(c, generator=g) * 2 - 1) * shift
        engine = [float(logp[p - 1 + i] + noise[i]) for i in range(c)]
        call = Call(
            rollout_id=f"r{r}",
            seq=0,
            prompt_ids=ids[:p],
            completion_ids=ids[p:],
            logprobs=engine,
            policy_version=0,
        )
        rollouts.append([call])
    return build_samples(rollouts, list(ADVANTAGES))[0]


def _token_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """``[L - 1]``: logprob of token ``t + 1`` given tokens ``0..t``, one sequence alone."""
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
    return logp.gather(-1, x[0, 1:, None])[:, 0]


def _trainer_step(starter_dir: Path, samples: list, cfg: TrainerConfig) -> tuple[float, dict]:
    """One update; the loss it reports and the raw gradient it stepped with."""
    model = load_model(starter_dir)
    trainer = PolicyTrainer(model, cfg)
    grads: dict[str, torch.Tensor] = {}

    def capture(*_: Any) -> None:
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(capture)
    metrics = trainer.update(samples)
    return metrics["loss"], grads


def _assert_grads(got: dict, reference: torch.nn.Module, atol: float = 1e-7) -> None:
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=atol, msg=name)


@pytest.mark.parametrize("budget", [10**6, 40])
def test_seq_mean_token_sum_norm_divides_by_the_longest_completion(
    starter_dir: Path, budget: int
) -> None:
    """Dr. GRPO's sum / (max completion length · rows), with the max over the whole batch:
    one micro-batch or several of different padded widths give the same loss and gradient
    (the bug divided each micro-batch by its own padded width, prompt included)."""
    reference = load_model(starter_dir)
    samples = _samples(reference)
    cfg = TrainerConfig(
        lr=1e-3,
        grad_clip=0,
        aggregation="seq_mean_token_sum_norm",
        max_tokens_per_micro_batch=budget,
    )
    norm = max(COMPLETIONS) * len(samples)
    loss = torch.zeros(())
    for s in samples:  # on-policy: ratio 1, per-token loss −A·ρ, gradient −A·∇log π
        logp = _token_logprobs(reference, s.input_ids)
        for t, m in enumerate(s.loss_mask[1:]):
            if m:
                ratio = torch.exp(logp[t] - logp[t].detach())
                loss = loss - s.advantage * ratio / norm
    loss.backward()

    got, grads = _trainer_step(starter_dir, samples, cfg)
    assert got == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    _assert_grads(grads, reference)


def test_tis_corrects_the_engine_mismatch_once(starter_dir: Path) -> None:
    """With tis_cap > 0: ratio π_θ / π_prox (the trainer's own logprobs before the update)
    clipped as PPO, times the truncated weight min(π_prox / π_engine, cap), stop-gradient.
    Written per token against a plain loop, loss and gradient."""
    reference = load_model(starter_dir)
    samples = _samples(reference, shift=1.0)  # engine ≠ trainer by up to ±1 nat per token
    cap, clip_low, clip_high = 1.5, 0.2, 0.28
    cfg = TrainerConfig(lr=1e-3, grad_clip=0, tis_cap=cap, clip_low=clip_low, clip_high=clip_high)
    n_tokens = sum(COMPLETIONS)
    loss = torch.zeros(())
    for s in samples:
        logp = _token_logprobs(reference, s.input_ids)
        for t, m in enumerate(s.loss_mask[1:]):
            if not m:
                continue
            prox = logp[t].detach().item()
            engine = s.old_logprobs[t + 1]
            weight = min(torch.exp(torch.tensor(prox - engine)).item(), cap)
            ratio = torch.exp(logp[t] - prox)
            clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
            token_loss = torch.maximum(-ratio * s.advantage, -clipped * s.advantage)
            loss = loss + token_loss * weight / n_tokens
    loss.backward()

    got, grads = _trainer_step(starter_dir, samples, cfg)
    assert got == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    _assert_grads(grads, reference)


def test_tis_keeps_the_pre_update_policy_as_proximal_across_optimizer_steps(
    starter_dir: Path,
) -> None:
    """With updates_per_batch > 1, π_old stays the weights before the batch's first step:
    the first step's ratio is exactly 1, the second's measures how far the policy moved."""
    model = load_model(starter_dir)
    cfg = TrainerConfig(lr=1e-2, tis_cap=2.0, updates_per_batch=2)
    metrics = PolicyTrainer(model, cfg).update(_samples(model, shift=0.5))
    assert abs(metrics["ratio_mean"] - 1.0) > 1e-4
    assert metrics["approx_kl"] > 0


def _multi_call_rollouts(model: Any) -> list[list[Call]]:
    """Two rollouts: one of two prefix-merged calls and a call that forks (new prompt), one
    of a single call; the engine's logprobs are the model's own (on-policy)."""
    g = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 1600, (n,), generator=g).tolist()

    def call(rid: str, seq: int, prompt: list[int], completion: list[int]) -> Call:
        logp = _token_logprobs(model, prompt + completion).detach()
        lps = [float(logp[len(prompt) - 1 + i]) for i in range(len(completion))]
        return Call(rid, seq, prompt, completion, lps, policy_version=0)

    p0, c0 = ids(9), ids(4)
    p1 = p0 + c0 + ids(3)  # the tool's answer, masked
    first = [call("a", 0, p0, c0), call("a", 1, p1, ids(6)), call("a", 2, ids(5), ids(3))]
    return [first, [call("b", 0, ids(7), ids(5))]]


@pytest.mark.parametrize("aggregation", ["token_mean", "rollout_mean"])
def test_per_call_advantages_update_matches_a_loop_over_tokens(
    starter_dir: Path, aggregation: str
) -> None:
    """Turn credit: a merged sample's tokens carry their own call's advantage ([B, L]
    advantages through the loss), and rollout "a" is cut into two segments (its call 2
    forks); loss and gradient against a per-token loop, where rollout_mean gives each
    rollout one weight whatever its segments."""
    reference = load_model(starter_dir)
    per_call = [{0: 1.0, 1: -0.5, 2: 0.25}, {0: -2.0}]
    samples, stats = build_samples(_multi_call_rollouts(reference), per_call)
    assert stats.merged_calls == 1 and len(samples) == 3 and stats.forked_rollouts == 1
    tokens = {r: sum(sum(s.loss_mask) for s in samples if s.rollout_index == r) for r in (0, 1)}
    loss = torch.zeros(())
    for s in samples:
        assert s.token_advantages is not None
        weight = (
            1 / sum(tokens.values())
            if aggregation == "token_mean"
            else 1 / (len(tokens) * tokens[s.rollout_index])
        )
        logp = _token_logprobs(reference, s.input_ids)
        for t, m in enumerate(s.loss_mask[1:]):
            if m:
                ratio = torch.exp(logp[t] - logp[t].detach())
                loss = loss - s.token_advantages[t + 1] * ratio * weight
    loss.backward()

    cfg = TrainerConfig(
        lr=1e-3, grad_clip=0, max_tokens_per_micro_batch=40, aggregation=aggregation
    )
    got, grads = _trainer_step(starter_dir, samples, cfg)
    assert got == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    _assert_grads(grads, reference, atol=1e-6)  # gradients up to ~1.3: float32 rounding


def test_per_token_advantages_equal_to_the_rollouts_give_the_same_update(starter_dir: Path) -> None:
    """Per-call advantages that all equal the rollout's: the [B, L] path gives exactly the
    loss and gradient of the [B] path (trajectory credit)."""
    model = load_model(starter_dir)
    rollouts = _multi_call_rollouts(model)
    whole, _ = build_samples(rollouts, [0.75, -0.75])
    per_call, _ = build_samples(rollouts, [dict.fromkeys(range(3), 0.75), {0: -0.75}])
    cfg = TrainerConfig(lr=1e-3, grad_clip=0)
    loss_whole, grads_whole = _trainer_step(starter_dir, whole, cfg)
    loss_per_call, grads_per_call = _trainer_step(starter_dir, per_call, cfg)
    assert loss_per_call == loss_whole
    for name, grad in grads_whole.items():
        assert torch.equal(grads_per_call[name], grad), name
