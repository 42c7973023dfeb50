"""The RL math against slow references written as plain Python loops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tether.trainer.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AggregateStats,
    aggregate,
    compute_advantages,
    ppo_clip_loss,
    truncated_is_weights,
)

# --------------------------------------------------------------------------- references


def ref_advantages(groups: list[list[float]], name: str, eps: float = 1e-6) -> list[list[float]]:
    out = []
    for g in groups:
        n = len(g)
        mean = sum(g) / n
        flat = n < 2 or max(g) == min(g)
        if name == "grpo":
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (n - 1)) if n > 1 else 0.0
            a = [(x - mean) / (std + eps) for x in g]
        elif name in ("dr_grpo", "reinforce_pp"):
            a = [x - mean for x in g]
        elif name == "rloo":
            a = [x - (sum(g) - x) / (n - 1) if n > 1 else 0.0 for x in g]
        out.append([0.0] * n if flat else a)
    if name == "reinforce_pp":
        allv = [x for g in out for x in g]
        mu = sum(allv) / len(allv)
        sd = math.sqrt(sum((x - mu) ** 2 for x in allv) / len(allv))
        flats = [len(g) < 2 or max(g) == min(g) for g in groups]
        out = [
            [0.0] * len(g) if f else [(x - mu) / (sd + eps) for x in g]
            for g, f in zip(out, flats, strict=True)
        ]
    return out


def ref_ppo(lp, old, adv, mask, lo, hi):
    out = []
    for b in range(len(lp)):
        row = []
        for t in range(len(lp[b])):
            if not mask[b][t]:
                row.append(0.0)
                continue
            r = math.exp(lp[b][t] - old[b][t])
            rc = min(max(r, 1 - lo), 1 + hi)
            row.append(-min(r * adv[b], rc * adv[b]))
        out.append(row)
    return out


def ref_aggregate(loss, mask, mode, rollout, max_len=None):
    rows = [
        (sum(v * m for v, m in zip(lr, mr, strict=True)), sum(mr), r)
        for lr, mr, r in zip(loss, mask, rollout, strict=True)
        if sum(mr) > 0
    ]
    if mode == "token_mean":
        return sum(s for s, _, _ in rows) / sum(n for _, n, _ in rows)
    if mode == "seq_mean":
        return sum(s / n for s, n, _ in rows) / len(rows)
    if mode == "seq_mean_token_sum_norm":  # default: the longest completion in the batch
        norm = max(n for _, n, _ in rows) if max_len is None else max_len
        return sum(s for s, _, _ in rows) / (norm * len(rows))
    per: dict[int, list[float]] = {}
    for s, n, r in rows:
        acc = per.setdefault(r, [0.0, 0.0])
        acc[0] += s
        acc[1] += n
    return sum(s / n for s, n in per.values()) / len(per)


# --------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_estimators_equal_groups_match_reference(name):
    rng = random.Random(0)
    groups = [[rng.choice([0.0, 0.5, 1.0]) + rng.random() for _ in range(4)] for _ in range(5)]
    groups[2] = [1.0] * 4  # zero variance
    got = compute_advantages(torch.tensor(groups, dtype=torch.float64), name)
    assert got.advantages.shape == (5, 4) and got.advantages.dtype == torch.float64
    ref = ref_advantages(groups, name)
    torch.testing.assert_close(got.advantages, torch.tensor(ref, dtype=torch.float64))
    assert got.num_groups == 5 and got.zero_variance_groups == 1


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_estimators_ragged_groups_match_reference(name):
    groups = [[1.0, 0.0, 0.0], [0.3], [2.0, 2.0], [0.1, 0.7, 0.2, 0.9, 0.4]]
    ids = [17, 3, 42, 5]  # arbitrary ids, interleaved order
    flat, gidx, where = [], [], []
    for gi, g in enumerate(groups):
        for k, x in enumerate(g):
            flat.append(x)
            gidx.append(ids[gi])
            where.append((gi, k))
    perm = list(range(len(flat)))
    random.Random(1).shuffle(perm)
    r = torch.tensor([flat[i] for i in perm], dtype=torch.float64)
    g = torch.tensor([gidx[i] for i in perm])
    got = compute_advantages(r, name, group_index=g)
    ref = ref_advantages(groups, name)
    expect = torch.tensor([ref[where[i][0]][where[i][1]] for i in perm], dtype=torch.float64)
    torch.testing.assert_close(got.advantages, expect)
    assert got.num_groups == 4 and got.zero_variance_groups == 2  # [0.3] and [2.0, 2.0]


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_zero_variance_groups_give_zeros_not_nan(name):
    r = torch.tensor([[0.1, 0.1, 0.1], [0.0, 0.0, 0.0]], dtype=torch.float64)
    got = compute_advantages(r, name)
    assert torch.equal(got.advantages, torch.zeros_like(r))
    assert got.zero_variance_groups == 2


def test_advantages_refuse_bad_input():
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="unknown"):
        compute_advantages(torch.zeros(2, 2), "nope")
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages(torch.zeros(4))


# --------------------------------------------------------------------------- policy loss


def _toy(b=3, t=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=dtype) * 3
    lp = old + (torch.rand(b, t, generator=g, dtype=dtype) - 0.5) * 0.8
    mask = (torch.rand(b, t, generator=g) > 0.3).to(dtype)
    adv = torch.randn(b, generator=g, dtype=dtype)
    return lp, old, adv, mask


def test_ppo_clip_matches_reference_and_metrics():
    lp, old, adv, mask = _toy()
    loss, metrics = ppo_clip_loss(lp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    ref = ref_ppo(lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.1, 0.3)
    torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float64))
    # per-token advantages give the same as broadcast ones
    loss2, _ = ppo_clip_loss(lp, old, adv[:, None].expand_as(lp), mask, clip_low=0.1, clip_high=0.3)
    torch.testing.assert_close(loss, loss2)
    ratio = (lp - old).exp()
    a = adv[:, None].expand_as(lp)
    took = (-ratio.clamp(0.9, 1.3) * a) > (-ratio * a)
    m = mask.bool()
    assert metrics["clip_frac"].item() == pytest.approx(took[m].double().mean().item())
    assert metrics["ratio_mean"].item() == pytest.approx(ratio[m].mean().item())


def test_clip_higher_asymmetry_and_advantage_sign():
    one = torch.ones(1, 1, dtype=torch.float64)
    cases = [  # (ratio, advantage, expected loss) with clip_low 0.2, clip_high 0.28
        (1.5, 1.0, -1.28),  # positive A: gain capped at 1 + clip_high
        (1.25, 1.0, -1.25),  # inside the higher bound: not clipped
        (0.5, 1.0, -0.5),  # positive A, ratio fell: pessimistic min keeps ρA
        (0.5, -1.0, 0.8),  # negative A: capped at 1 − clip_low
        (0.85, -1.0, 0.85),  # inside the lower bound: not clipped
        (1.5, -1.0, 1.5),  # negative A, ratio rose: unclipped, full penalty
    ]
    for ratio, a, expect in cases:
        lp = torch.full((1, 1), math.log(ratio), dtype=torch.float64, requires_grad=True)
        loss, metrics = ppo_clip_loss(lp, 0 * one, torch.tensor([a], dtype=torch.float64), one)
        assert loss.item() == pytest.approx(expect), (ratio, a)
        loss.sum().backward()
        clipped = expect in (-1.28, 0.8)
        assert (lp.grad.abs().item() == 0) == clipped
        assert metrics["clip_frac"].item() == float(clipped)
        assert metrics["clip_frac_high"].item() == float(clipped and ratio > 1)
        assert metrics["clip_frac_low"].item() == float(clipped and ratio < 1)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean"])
def test_ppo_gradient_matches_finite_differences(mode):
    lp, old, adv, mask = _toy(b=2, t=4, seed=3)
    w = truncated_is_weights(old + 0.05, old, cap=2.0)
    prox = old + 0.02

    def f(x):
        loss, _ = ppo_clip_loss(x, old, adv, mask, prox_logprobs=prox, is_weights=w)
        return aggregate(loss, mask, mode)

    x = lp.clone().requires_grad_(True)
    f(x).backward()
    h = 1e-6
    numeric = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            up, down = lp.clone(), lp.clone()
            up[i, j] += h
            down[i, j] -= h
            numeric[i, j] = (f(up) - f(down)) / (2 * h)
    torch.testing.assert_close(x.grad, numeric, atol=1e-7, rtol=1e-6)
    assert (x.grad[mask == 0] == 0).all()


def test_decoupled_ratio_uses_prox_and_reinforce_loss():
    lp, old, adv, mask = _toy(seed=5)
    prox = lp.detach() - 0.01
    loss, _ = ppo_clip_loss(lp, old, adv, mask, prox_logprobs=prox)
    ref = ref_ppo(lp.tolist(), prox.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float64))
    pg, _ = POLICY_LOSSES["reinforce"](lp, old, adv, mask)
    torch.testing.assert_close(pg, -(lp - old).exp() * adv[:, None] * mask)


def test_truncated_is_weights():
    trainer = torch.tensor([[-1.0, -2.0, -0.1]], requires_grad=True)
    engine = torch.tensor([[-1.5, -1.0, -0.1]])
    w = truncated_is_weights(trainer, engine, cap=1.5)
    ref = [
        min(math.exp(a - b), 1.5)
        for a, b in zip([-1.0, -2.0, -0.1], [-1.5, -1.0, -0.1], strict=True)
    ]
    torch.testing.assert_close(w, torch.tensor([ref]))
    assert not w.requires_grad
    lp, old, adv, mask = _toy(seed=7, dtype=torch.float32)
    plain, _ = ppo_clip_loss(lp, old, adv, mask)
    weighted, _ = ppo_clip_loss(lp, old, adv, mask, is_weights=torch.full_like(lp, 0.5))
    torch.testing.assert_close(weighted, plain * 0.5)


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_kl_estimators_match_reference(name):
    lp, ref_lp, _, _ = _toy(seed=11)
    got = KL_ESTIMATORS[name](lp, ref_lp)
    expect = []
    for a_row, b_row in zip(lp.tolist(), ref_lp.tolist(), strict=True):
        row = []
        for a, b in zip(a_row, b_row, strict=True):
            if name == "k1":
                row.append(a - b)
            elif name == "k2":
                row.append(0.5 * (a - b) ** 2)
            else:
                row.append(math.exp(b - a) - (b - a) - 1)
        expect.append(row)
    torch.testing.assert_close(got, torch.tensor(expect, dtype=torch.float64))
    if name != "k1":
        assert (got >= 0).all()


# --------------------------------------------------------------------------- aggregation


def _agg_case():
    g = torch.Generator().manual_seed(2)
    loss = torch.randn(7, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(7, 6, generator=g) > 0.4).double()
    mask[4] = 0  # a row with nothing to train on
    rollout = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    return loss, mask, rollout


@pytest.mark.parametrize("max_len", [6, None])
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_matches_reference(mode, max_len):
    loss, mask, rollout = _agg_case()
    got = aggregate(loss, mask, mode, rollout_index=rollout, max_len=max_len)
    ref = ref_aggregate(loss.tolist(), mask.tolist(), mode, rollout.tolist(), max_len=max_len)
    assert got.item() == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("max_len", [6, None])
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batched_accumulation_equals_full_batch(mode, max_len):
    loss, mask, rollout = _agg_case()
    mask[1, 3:] = 0  # micro-batch [1, 3] is padded to a narrower width than the rest
    mask[3, 3:] = 0
    x = loss.clone().requires_grad_(True)
    aggregate(x, mask, mode, rollout_index=rollout, max_len=max_len).backward()
    full_grad = x.grad.clone()
    full = aggregate(loss, mask, mode, rollout_index=rollout, max_len=max_len)
    # rollouts 0 and 2 are split across micro-batches, rows of different lengths
    parts = [[1, 3], [0, 5, 6], [2, 4]]
    widths = [3, 6, 6]
    stats = AggregateStats.merge(AggregateStats.of(mask[p], rollout[p]) for p in parts)
    assert stats == AggregateStats.of(mask, rollout)
    x.grad = None
    total = 0.0
    for p, w in zip(parts, widths, strict=True):
        share = aggregate(
            x[p, :w], mask[p, :w], mode, rollout_index=rollout[p], stats=stats, max_len=max_len
        )
        share.backward()
        total += share.item()
    assert total == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(x.grad, full_grad)


def test_aggregate_empty_mask_is_zero_with_graph():
    x = torch.randn(2, 3, requires_grad=True)
    for mode in AGGREGATION_MODES:
        out = aggregate(x, torch.zeros(2, 3), mode, rollout_index=torch.tensor([0, 1]), max_len=3)
        assert out.item() == 0.0 and out.requires_grad
    with pytest.raises(ValueError, match="rollout_index"):
        aggregate(x, torch.ones(2, 3), "rollout_mean")
    with pytest.raises(ValueError, match="max_len"):
        aggregate(x, torch.ones(2, 3), "seq_mean_token_sum_norm", max_len=0)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_takes_the_update_arguments(name: str) -> None:
    """The update calls every loss the same way (no branch on its name): each accepts
    the clip range, π_prox and IS weights, and the loss is 0 where masked."""
    torch.manual_seed(0)
    lp = torch.randn(2, 4, dtype=torch.float64)
    old = lp + 0.3 * torch.randn_like(lp)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES[name](
        lp, old, adv, mask, clip_low=0.1, clip_high=0.2,
        prox_logprobs=old.clone(), is_weights=torch.ones_like(lp),
    )  # fmt: skip
    assert loss.shape == lp.shape and bool((loss[mask == 0] == 0).all())
    assert {"clip_frac", "ratio_mean", "approx_kl"} <= set(metrics)
    if name == "reinforce":  # the clip range is ignored: ρ·A unclipped
        unclipped, _ = POLICY_LOSSES[name](lp, old, adv, mask, clip_low=0.0, clip_high=0.0)
        assert torch.allclose(loss, unclipped)
