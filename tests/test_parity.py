"""Parity: one tether update against the published GRPO / DAPO formulas, written out here.

One fixed batch: the untrained starter model's weights, calc prompts (one
question per group, sharing the system prompt, so tether's shared-prefix
forward runs), fixed completion token ids, fixed rewards for three groups of
four rollouts (the third group has zero reward variance), and "old" (engine)
logprobs taken from a no-grad forward and then moved by ±0.5 nat on every
other completion token, so that ratios fall beyond 1 + clip_high and below
1 − clip_low and both clip branches are taken. One rollout is two merged calls
(a tool turn between them), one is two calls that do not merge (two samples).

The reference runs every sequence alone through a plain full forward (no
padding, no micro-batches, no shared prefix) and writes, from the papers:

- GRPO advantage ``(r − mean_g) / (std_g + 1e-6)``, unbiased group std;
- PPO clip with clip-higher (DAPO): ``−min(ρ·A, clip(ρ, 1 − 0.2, 1 + 0.28)·A)``,
  ``ρ = exp(log π_θ − log π_old)``, no KL;
- the aggregation under test (DAPO's token mean: sum over all tokens / all tokens);
- grad-norm clipping, then ``torch.optim.AdamW`` with the trainer's hyper-parameters.

Tether's side goes through its public API only: ``compute_advantages``,
``build_samples``, ``PolicyTrainer.update``; its gradient is read by a step
pre-hook on the trainer's optimizer (after clipping, as AdamW sees it).

Tolerances (fp32 throughout): advantages 1e-12 (float64); per-token logprobs
within 1e-5 nat (max over every completion token, read as the trainer's
``logprob_gap_max`` against old logprobs set to the reference's own); loss
rel 1e-5; every parameter's gradient cosine > 0.99999 and relative norm error
< 1e-4 (and ``assert_close`` rtol 1e-4, atol 1e-7); the parameter delta after
the optimizer step cosine > 0.99999 and relative norm error < 1e-4. Measured
on this batch (2026-12-01): logprobs 9.5e-7, loss 9e-7 relative, gradients
cosine 1 − 3e-12 and relative error ≤ 2.1e-6, delta cosine ≥ 0.9999999993
and relative error ≤ 3.8e-5 (Adam's first step divides by |g|, so tiny
gradient entries carry their rounding into the delta).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.chat import render_prompt
from tether.models import load_model, load_tokenizer
from tether.records import Call
from tether.starter.calc import SYSTEM_PROMPT
from tether.trainer import PolicyTrainer, TrainerConfig, build_samples
from tether.trainer.algorithms import compute_advantages

QUESTIONS = ("What is 12*34?", "What is 7+58?", "What is 90-13?")
REWARDS = ((1.0, 0.0, 0.0, 1.0), (0.2, 0.9, 0.4, 0.0), (1.0, 1.0, 1.0, 1.0))  # last: flat
REPLIES = (
    '{"expression": "12*34"}',
    "The answer is 408.",
    "12 times 34",
    '{"expression": "12+34"} then 46',
    "The answer is 65.",
    '{"expression": "7+58"}',
    "58",
    "7 plus 58 is 66, I think",
    '{"expression": "90-13"}',
    "The answer is 77.",
    "77",
    "it is 77",
)
MERGED, SPLIT = 1, 5  # rollout 1: two merged calls; rollout 5: two calls, two samples
TOOL_RESULT = "\n<tool_response>408</tool_response>\n"
SECOND_REPLY = "The answer is 408."
SIDE_QUESTION = "Summarise: 7+58"
SHIFT = 0.5  # nat; every other completion token's old logprob moves by ±SHIFT
CLIP_LOW, CLIP_HIGH, EPS = 0.2, 0.28, 1e-6
LOGPROB_ATOL = 1e-5
COSINE, REL_ERR = 0.99999, 1e-4

Segments = list[tuple[list[int], bool]]  # (token ids, is a completion) in sequence order


def _rollouts(tokenizer: Any) -> list[list[Segments]]:
    """Rollout i → its sequences → segments. Groups are rollouts 4g..4g+3 (question g)."""

    def enc(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    def prompt(question: str) -> list[int]:
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        return render_prompt(tokenizer, msgs)

    out: list[list[Segments]] = []
    for i, reply in enumerate(REPLIES):
        seqs: list[Segments] = [[(prompt(QUESTIONS[i // 4]), False), (enc(reply), True)]]
        if i == MERGED:
            seqs[0] += [(enc(TOOL_RESULT), False), (enc(SECOND_REPLY), True)]
        if i == SPLIT:
            seqs.append([(prompt(SIDE_QUESTION), False), (enc("65"), True)])
        out.append(seqs)
    return out


def _flat(seq: Segments) -> tuple[list[int], list[int]]:
    ids = [t for part, _ in seq for t in part]
    mask = [int(c) for part, c in seq for _ in part]
    return ids, mask


def _plain_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """``[L]``: column t = log π(token t | tokens < t) from one full forward; column 0 is 0."""
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
    return torch.cat([logp.new_zeros(1), logp.gather(-1, x[0, 1:, None])[:, 0]])


def _old_logprobs(model: Any, rollouts: list[list[Segments]], shift: float) -> list[list[list]]:
    """Per rollout, per sequence: old logprobs ``[L]`` (float32 values, 0 off the mask)."""
    out = []
    with torch.no_grad():
        for seqs in rollouts:
            mine = []
            for seq in seqs:
                ids, mask = _flat(seq)
                logp = _plain_logprobs(model, ids)
                k = torch.cumsum(torch.tensor(mask), 0)  # 1-based index among completion tokens
                move = torch.where(k % 2 == 0, shift, -shift) * (k % 4 != 0)
                old = (logp + move) * torch.tensor(mask)
                mine.append(old.float().tolist())
            out.append(mine)
    return out


def _calls(rollouts: list[list[Segments]], old: list[list[list]]) -> list[list[Call]]:
    """The gateway's records of each rollout: one call per completion segment."""
    out = []
    for r, seqs in enumerate(rollouts):
        calls: list[Call] = []
        for s, seq in enumerate(seqs):
            pos, before = 0, []
            for part, completion in seq:
                if completion:
                    calls.append(
                        Call(
                            rollout_id=f"r{r}",
                            seq=len(calls),
                            prompt_ids=list(before),
                            completion_ids=list(part),
                            logprobs=old[r][s][pos : pos + len(part)],
                            policy_version=0,
                        )
                    )
                before += part
                pos += len(part)
        out.append(calls)
    return out


def _reference_loss(
    model: Any, rollouts: list[list[Segments]], old: list[list[list]], adv: list[float], mode: str
) -> tuple[torch.Tensor, dict[str, int]]:
    """The aggregated PPO-clip loss, each sequence alone; and how often each clip branch won."""
    per_seq = []  # (rollout, per-token loss [n] over the completion tokens)
    clipped = {"low": 0, "high": 0}
    for r, seqs in enumerate(rollouts):
        a = torch.tensor(adv[r], dtype=torch.float32)
        for s, seq in enumerate(seqs):
            ids, mask = _flat(seq)
            m = torch.tensor(mask).bool()
            logp = _plain_logprobs(model, ids)[m]
            ratio = torch.exp(logp - torch.tensor(old[r][s])[m])
            unclipped, bounded = -ratio * a, -ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * a
            took = (bounded > unclipped).detach()
            clipped["low"] += int((took & (ratio < 1)).sum())
            clipped["high"] += int((took & (ratio > 1)).sum())
            per_seq.append((r, torch.maximum(unclipped, bounded)))
    tokens = sum(len(t) for _, t in per_seq)
    if mode == "token_mean":  # DAPO: every token of the batch weighs the same
        return sum(t.sum() for _, t in per_seq) / tokens, clipped
    if mode == "seq_mean":  # GRPO paper: mean over sequences of the token mean
        return sum(t.mean() for _, t in per_seq) / len(per_seq), clipped
    if mode == "seq_mean_token_sum_norm":  # Dr. GRPO: sum / (longest completion · sequences)
        longest = max(len(t) for _, t in per_seq)
        return sum(t.sum() for _, t in per_seq) / (longest * len(per_seq)), clipped
    # rollout_mean: mean over rollouts of the token mean of all that rollout's tokens
    by_rollout: dict[int, list[torch.Tensor]] = {}
    for r, t in per_seq:
        by_rollout.setdefault(r, []).append(t)
    means = [torch.cat(ts).mean() for ts in by_rollout.values()]
    return sum(means) / len(means), clipped


def _params(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same_direction(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g, w = got.flatten().double(), want.flatten().double()
    if w.norm() == 0:
        assert g.norm() == 0, f"{what}: reference is 0, tether's norm is {g.norm():.3g}"
        return
    cosine = float(torch.nn.functional.cosine_similarity(g, w, dim=0))
    rel = float((g - w).norm() / w.norm())
    assert cosine > COSINE and rel < REL_ERR, f"{what}: cosine {cosine:.8f}, rel err {rel:.2e}"


@pytest.fixture(scope="module")
def batch(starter_dir: Path) -> dict[str, Any]:
    tokenizer = load_tokenizer(starter_dir)
    rollouts = _rollouts(tokenizer)
    model = load_model(starter_dir)
    return {
        "rollouts": rollouts,
        "old": _old_logprobs(model, rollouts, SHIFT),
        "exact": _old_logprobs(model, rollouts, 0.0),
    }


def test_parity_advantages_match_the_grpo_formula() -> None:
    """tether's GRPO advantages = (r − mean_g) / (std_g + eps), unbiased std; flat group → 0."""
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    got = compute_advantages(rewards, "grpo", eps=EPS)
    mean, std = rewards.mean(1, keepdim=True), rewards.std(1, keepdim=True)  # Bessel
    torch.testing.assert_close(got.advantages, (rewards - mean) / (std + EPS), rtol=0, atol=1e-12)
    assert got.zero_variance_groups == 1 and bool((got.advantages[2] == 0).all())


def test_parity_logprobs_match_a_plain_forward(starter_dir: Path, batch: dict) -> None:
    """The trainer's per-token logprobs (shared-prefix forward over a padded micro-batch) equal
    a plain full forward of each sequence alone: with old logprobs set to the reference's,
    the trainer's own ``logprob_gap_max`` is the largest per-token difference."""
    adv = compute_advantages(torch.tensor(REWARDS), "grpo").advantages.flatten().tolist()
    samples, stats = build_samples(_calls(batch["rollouts"], batch["exact"]), adv)
    assert stats.merged_calls == 1 and len(samples) == len(REPLIES) + 1
    trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig(lr=1e-3))
    metrics = trainer.update(samples)
    assert metrics["logprob_gap_max"] < LOGPROB_ATOL


@pytest.mark.parametrize(
    ("aggregation", "budget"),
    [
        ("token_mean", 8192),
        ("token_mean", 300),  # several micro-batches: gradients accumulate
        ("seq_mean", 8192),
        ("rollout_mean", 8192),
        ("seq_mean_token_sum_norm", 8192),
    ],
)
def test_parity_one_update_matches_the_reference(
    starter_dir: Path, batch: dict, aggregation: str, budget: int
) -> None:
    """Loss, every parameter's gradient (after clipping) and the AdamW step's parameter delta
    agree with the reference written from the papers (module docstring for the tolerances)."""
    cfg = TrainerConfig(
        lr=1e-3,
        betas=(0.9, 0.99),
        weight_decay=0.01,
        grad_clip=0.05,  # below the batch's gradient norm: the clip engages
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        aggregation=aggregation,
        max_tokens_per_micro_batch=budget,
    )
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    adv = compute_advantages(rewards, "grpo", eps=EPS).advantages.flatten().tolist()

    # reference: plain forward per sequence, the formula, clip, AdamW
    reference = load_model(starter_dir)
    start = _params(reference)
    loss, clipped = _reference_loss(reference, batch["rollouts"], batch["old"], adv, aggregation)
    assert clipped["low"] > 0 and clipped["high"] > 0, clipped  # both clip branches exercised
    loss.backward()
    params = list(reference.parameters())
    norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
    assert norm > cfg.grad_clip
    want_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    opt.step()
    want_delta = {n: p.detach() - start[n] for n, p in reference.named_parameters()}

    # tether: records → samples → one update
    samples, _ = build_samples(_calls(batch["rollouts"], batch["old"]), adv)
    model = load_model(starter_dir)
    trainer = PolicyTrainer(model, cfg)
    grads: dict[str, torch.Tensor] = {}
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.update({n: copy.deepcopy(p.grad) for n, p in model.named_parameters()})
    )
    metrics = trainer.update(samples)

    assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-8)
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-4)
    for side in ("low", "high"):  # tether's clip fractions are over the trained tokens
        assert round(metrics[f"clip_frac_{side}"] * metrics["trained_tokens"]) == clipped[side]
    for name, want in want_grads.items():
        got = grads[name] if grads[name] is not None else torch.zeros_like(want)
        _assert_same_direction(got, want, f"gradient of {name}")
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7, msg=name)
    for name, p in model.named_parameters():
        _assert_same_direction(p.detach() - start[name], want_delta[name], f"delta of {name}")


def test_parity_catches_a_wrong_clip(starter_dir: Path, batch: dict) -> None:
    """The comparison can fail: a trainer with clip_high 0.2 (symmetric PPO) moves the
    weights differently from the clip-higher reference's."""
    cfg = TrainerConfig(lr=1e-3, clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    adv = compute_advantages(torch.tensor(REWARDS), "grpo").advantages.flatten().tolist()
    samples, _ = build_samples(_calls(batch["rollouts"], batch["old"]), adv)
    reference = load_model(starter_dir)
    loss, _ = _reference_loss(reference, batch["rollouts"], batch["old"], adv, "token_mean")
    wrong = PolicyTrainer(load_model(starter_dir), replace(cfg, clip_high=CLIP_LOW))
    assert wrong.update(samples)["loss"] != pytest.approx(loss.item(), rel=1e-3)
