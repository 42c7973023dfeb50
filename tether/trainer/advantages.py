"""The advantage estimators: a reward per rollout (or per turn, per role) → its advantage.

Pure tensor → tensor functions chosen by name from the config
(``ADVANTAGE_ESTIMATORS``: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``); this
module imports torch and nothing of tether. ``N`` rollouts in ``G`` groups (a group is
the ``n`` rollouts of one task). :func:`compute_advantages` compares final rewards within
their group, :func:`turn_advantages` returns-to-go per turn (:func:`returns_to_go`),
:func:`keyed_advantages` any grouping (per role), :func:`state_advantages` GiGPO's
step advantage within identical states added to the episode one. The losses that use them are in
:mod:`tether.trainer.algorithms`; the glue from rollouts in :mod:`tether.trainer.credit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "GroupAdvantages",
    "compute_advantages",
    "keyed_advantages",
    "returns_to_go",
    "state_advantages",
    "turn_advantages",
]


def _group_stats(rewards: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``rewards`` ``[N]``, ``group`` ``[N]`` in ``0..G-1`` → per element ``[N]``: group mean,
    sum, size, and zero-variance (all rewards equal, or one member: no signal).
    """
    g = int(group.max()) + 1
    zeros = torch.zeros(g, dtype=rewards.dtype, device=rewards.device)
    sums = zeros.index_add(0, group, rewards)
    counts = zeros.index_add(0, group, torch.ones_like(rewards))
    hi = zeros.scatter_reduce(0, group, rewards, "amax", include_self=False)
    lo = zeros.scatter_reduce(0, group, rewards, "amin", include_self=False)
    flat = (hi == lo) | (counts < 2)
    return (sums / counts)[group], sums[group], counts[group], flat[group]


def grpo(rewards: Tensor, group: Tensor, eps: float = 1e-6) -> Tensor:
    """``(r − mean_g) / (std_g + eps)`` with the *unbiased* (Bessel, ``n − 1``) group std,
    as TRL's ``GRPOTrainer`` (``rewards.view(-1, n).std(dim=1)``) and verl do.
    ``[N]`` → ``[N]``."""
    mean, _, count, flat = _group_stats(rewards, group)
    dev = rewards - mean
    g = int(group.max()) + 1
    var = torch.zeros(g, dtype=rewards.dtype, device=rewards.device).index_add(0, group, dev * dev)
    std = (var[group] / (count - 1).clamp(min=1)).sqrt()
    return torch.where(flat, torch.zeros_like(dev), dev / (std + eps))


def dr_grpo(rewards: Tensor, group: Tensor, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: ``r − mean_g``, no division by the std. ``[N]`` → ``[N]``."""
    mean, _, _, flat = _group_stats(rewards, group)
    return torch.where(flat, torch.zeros_like(rewards), rewards - mean)


def rloo(rewards: Tensor, group: Tensor, eps: float = 1e-6) -> Tensor:
    """RLOO: ``r_i − mean of the other members of the group``. ``[N]`` → ``[N]``."""
    _, total, count, flat = _group_stats(rewards, group)
    baseline = (total - rewards) / (count - 1).clamp(min=1)
    return torch.where(flat, torch.zeros_like(rewards), rewards - baseline)


def reinforce_pp(rewards: Tensor, group: Tensor, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline (OpenRLHF ``reinforce_baseline``): subtract the group mean,
    then whiten across the whole batch, ``(a − mean_batch) / (std_batch + eps)``
    with the *population* std. OpenRLHF whitens over action tokens; here every
    rollout counts once (outcome reward, no KL in the reward, so a rollout's
    tokens share one value and only the length weighting differs). ``[N]`` → ``[N]``.
    """
    mean, _, _, flat = _group_stats(rewards, group)
    centred = torch.where(flat, torch.zeros_like(rewards), rewards - mean)
    whitened = (centred - centred.mean()) / (centred.std(correction=0) + eps)
    return torch.where(flat, torch.zeros_like(rewards), whitened)


AdvantageFn = Callable[[Tensor, Tensor, float], Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}


class GroupAdvantages(NamedTuple):
    advantages: Tensor  # same shape as the rewards, float64
    num_groups: int
    zero_variance_groups: int  # groups whose advantages are all zero (equal rewards or n = 1)


def compute_advantages(
    rewards: Tensor,
    estimator: str = "grpo",
    *,
    group_index: Tensor | None = None,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Advantages of ``rewards`` by the named estimator.

    Either ``rewards`` ``[G, n]`` (equal groups, one per row), or ``rewards``
    ``[N]`` with ``group_index`` ``[N]`` (any integer ids; ragged groups).
    Returns advantages of the same shape as ``rewards`` (float64). Rewards must
    be finite: unusable rollouts are dropped before, never turned into 0.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        known = sorted(ADVANTAGE_ESTIMATORS)
        raise ValueError(f"advantage estimator {estimator!r} is unknown; choose one of {known}")
    r = rewards.to(torch.float64)
    if r.dim() == 2 and group_index is None:
        group = torch.arange(r.shape[0], device=r.device).repeat_interleave(r.shape[1])
        flat_r = r.reshape(-1)
    elif r.dim() == 1 and group_index is not None and group_index.shape == r.shape:
        group = torch.unique(group_index, return_inverse=True)[1]
        flat_r = r
    else:
        raise ValueError(
            f"rewards of shape {tuple(r.shape)} need either shape [G, n] and no group_index, "
            "or shape [N] and a group_index of the same shape"
        )
    if flat_r.numel() == 0:
        return GroupAdvantages(torch.zeros_like(r), 0, 0)
    if not torch.isfinite(flat_r).all():
        raise ValueError("rewards must be finite; drop rollouts with NaN/inf rewards first")
    adv = ADVANTAGE_ESTIMATORS[estimator](flat_r, group, eps)
    flat = _group_stats(flat_r, group)[3]
    num_flat = int(group[flat].unique().numel())
    return GroupAdvantages(adv.reshape(r.shape), int(group.max()) + 1, num_flat)


# --------------------------------------------------------------------------- turn-level credit


def returns_to_go(
    turn_rewards: Tensor, final: Tensor, lengths: Tensor, gamma: float = 1.0
) -> Tensor:
    """Each turn's discounted return: its own and later turns' rewards plus the final one.

    ``turn_rewards`` ``[N, K]`` (rollout ``i``'s intermediate reward at turn ``k``, 0
    where none), ``final`` ``[N]`` (the rollout's final reward, received at its last
    turn), ``lengths`` ``[N]`` (turns of each rollout, ``0..K``). For ``k < lengths[i]``
    with ``L = lengths[i]``: ``G[i, k] = Σ_{j=k}^{L−1} γ^{j−k} r[i, j] + γ^{L−1−k} R_i``;
    0 beyond. Returns ``[N, K]`` float64.
    """
    n, k = turn_rewards.shape
    steps = torch.arange(k, device=turn_rewards.device)
    valid = steps < lengths[:, None]
    last = steps == (lengths[:, None] - 1)
    zero = torch.zeros((n, k), dtype=torch.float64, device=turn_rewards.device)
    r = torch.where(valid, turn_rewards.to(torch.float64), zero)
    r = r + torch.where(last, final.to(torch.float64)[:, None].expand(n, k), zero)
    out = zero.clone()
    running = torch.zeros(n, dtype=torch.float64, device=r.device)
    for t in reversed(range(k)):  # turns past a rollout's end hold 0, so running stays 0 there
        running = r[:, t] + gamma * running
        out[:, t] = running
    return out


def turn_advantages(
    returns: Tensor,
    lengths: Tensor,
    group_index: Tensor,
    estimator: str = "grpo",
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Turn-level advantages: each turn's return against the same turn of its group.

    ``returns`` ``[N, K]`` (:func:`returns_to_go`), ``lengths`` ``[N]`` (turns of each
    rollout), ``group_index`` ``[N]`` (any integer ids; the rollouts of one task). The
    returns at turn ``k`` of the rollouts of one group that reached turn ``k`` form one
    comparison group for the named estimator (a turn only one rollout of its group
    reached has no baseline: advantage 0, as a group of one). ``reinforce_pp`` whitens
    over every (rollout, turn). Returns advantages ``[N, K]`` float64 (0 beyond each
    rollout's length), the number of rollout groups, and how many of them carry no
    signal at any turn.
    """
    n, k = returns.shape
    if group_index.shape != (n,) or lengths.shape != (n,):
        raise ValueError(
            f"returns of shape {tuple(returns.shape)} need lengths and group_index of shape [{n}]"
        )
    r = returns.to(torch.float64)
    if n == 0 or k == 0:
        return GroupAdvantages(torch.zeros_like(r), 0, 0)
    group = torch.unique(group_index, return_inverse=True)[1]
    valid = torch.arange(k, device=r.device) < lengths[:, None]
    key = (group[:, None] * k + torch.arange(k, device=r.device))[valid]
    out = torch.zeros_like(r)
    num_groups = int(group.max()) + 1
    if not bool(valid.any()):
        return GroupAdvantages(out, num_groups, num_groups)
    flat_r = r[valid]
    out[valid] = compute_advantages(flat_r, estimator, group_index=key, eps=eps).advantages
    dense = torch.unique(key, return_inverse=True)[1]
    flat = _group_stats(flat_r, dense)[3]  # per (rollout, turn): its comparison is flat
    owner = group[:, None].expand(n, k)[valid]
    signal = torch.zeros(num_groups, dtype=torch.bool, device=r.device)
    signal = signal.index_put((owner[~flat],), torch.tensor(True, device=r.device))
    return GroupAdvantages(out, num_groups, int((~signal).sum()))


def keyed_advantages(
    values: Tensor, key: Tensor, owner: Tensor, estimator: str = "grpo", eps: float = 1e-6
) -> GroupAdvantages:
    """Advantages of entries compared only within their key (e.g. per (group, role): the
    calls of one agent role in a group's rollouts, docs/credit.md "Roles").

    ``values`` ``[M]`` (finite), ``key`` ``[M]`` (each entry's comparison group, any
    integer ids), ``owner`` ``[M]`` (the rollout group of each entry, any integer ids;
    a key lies within one owner). Each key's entries are one group of the named
    estimator (``reinforce_pp`` whitens over every entry). Returns advantages ``[M]``
    float64, the number of owners, and how many owners have no key with signal.
    """
    if not values.shape == key.shape == owner.shape or values.dim() != 1:
        raise ValueError("values, key and owner must all have one shape [M]")
    v = values.to(torch.float64)
    if v.numel() == 0:
        return GroupAdvantages(v.clone(), 0, 0)
    adv = compute_advantages(v, estimator, group_index=key, eps=eps).advantages
    signal = _owner_signal(v, key, owner)
    return GroupAdvantages(adv, signal.numel(), int((~signal).sum()))


def _owner_signal(values: Tensor, key: Tensor, owner: Tensor) -> Tensor:
    """``[M]`` entries → ``[owners]`` bool (dense owner ids in sorted order): whether
    some key of the owner has entries that differ (its advantages are not all 0)."""
    flat = _group_stats(values, torch.unique(key, return_inverse=True)[1])[3]
    owners = torch.unique(owner, return_inverse=True)[1]
    signal = torch.zeros(int(owners.max()) + 1, dtype=torch.bool, device=values.device)
    return signal.index_put((owners[~flat],), torch.tensor(True, device=values.device))


def state_advantages(
    returns: Tensor,
    state: Tensor,
    owner: Tensor,
    episode: Tensor,
    weight: float = 1.0,
    estimator: str = "grpo",
    eps: float = 1e-6,
) -> GroupAdvantages:
    """GiGPO's two-level advantage (arXiv 2505.10978, Eq. 8): ``A = A_episode + ω · A_step``.

    ``returns`` ``[M]`` (each call's return-to-go, finite), ``state`` ``[M]`` (any integer
    ids; calls with one id reached the identical state in one group), ``owner`` ``[M]``
    (the rollout group of each call; a state lies within one owner), ``episode`` ``[M]``
    (each call's episode-level advantage: its rollout's, from its final reward against
    the group). The step advantage ``A_step`` is the named estimator over the returns of
    one state's calls (a state one call reached: 0, as a group of one); ``weight`` is
    ``ω ≥ 0``. Returns ``[M]`` float64, the number of owners, and how many owners carry
    no signal (every episode advantage 0, and no state with differing returns or ω = 0).
    """
    if not returns.shape == state.shape == owner.shape == episode.shape or returns.dim() != 1:
        raise ValueError("returns, state, owner and episode must all have one shape [M]")
    ep = episode.to(torch.float64)
    step = keyed_advantages(returns, state, owner, estimator, eps)
    if returns.numel() == 0:
        return step
    owners = torch.unique(owner, return_inverse=True)[1]
    signal = torch.zeros(step.num_groups, dtype=torch.bool, device=ep.device)
    signal = signal.index_put((owners[ep != 0],), torch.tensor(True, device=ep.device))
    if weight > 0:
        signal = signal | _owner_signal(returns.to(torch.float64), state, owner)
    out = ep + weight * step.advantages
    return GroupAdvantages(out, step.num_groups, int((~signal).sum()))
