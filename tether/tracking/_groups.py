"""Where a stored rollout belongs in its run: which update or eval, which group, its advantage.

The training loop names groups ``{run_id}-{tag}-g{index}`` and rollouts
``{group}-{i}`` (``tether/run/_collect.py``, ``_async.py``), with the tag
``s{step}`` for sync mode's update ``step`` (from 1, the run's numbering; stores
written before it counted from 0 are renumbered by the store's migration 7),
``eval{step}-s`` / ``eval{step}-g`` for the sampled / greedy rollouts of the eval
at ``step`` (0: before training, N: after update N), and ``a`` for async
mode (whose groups are not tied to a step in the store). :func:`place` reads
that back. :func:`step_advantages` recomputes the advantages of one sync
update exactly as the loop did: the groups whose rollouts all have a usable
reward, in group order, through the trainer's ``compute_advantages`` with the
run's ``trainer.advantage``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tether.records import Rollout, RolloutStatus

__all__ = ["Place", "StepGroups", "place", "step_groups", "usable"]

_TAG = re.compile(r"(?:s(?P<step>\d+)|eval(?P<eval>\d+)-(?P<how>[sg])|a)-g(?P<group>\d+)")
_INDEX = re.compile(r"-(\d+)$")


@dataclass(frozen=True)
class Place:
    kind: str  # "train", "eval_sampled", "eval_greedy", "async" (trained, step unknown), "other"
    step: int | None  # the update (train) or the step the eval ran at; None when unknown
    group: int | None  # the group's index within its collection
    index: int | None  # the rollout's index within its group


def place(rollout: Rollout) -> Place:
    """Where ``rollout`` sits, read from its group id (``other``: opened through the admin
    API, or by ``tether serve``)."""
    prefix = f"{rollout.run_id}-" if rollout.run_id else ""
    gid = rollout.group_id or ""
    m = _TAG.fullmatch(gid[len(prefix) :]) if prefix and gid.startswith(prefix) else None
    if m is None:
        return Place("other", None, None, None)
    found = _INDEX.search(rollout.id)
    index = int(found.group(1)) if found and rollout.id.startswith(gid + "-") else None
    group = int(m["group"])
    if m["step"] is not None:
        return Place("train", int(m["step"]), group, index)
    if m["eval"] is not None:
        kind = "eval_sampled" if m["how"] == "s" else "eval_greedy"
        return Place(kind, int(m["eval"]), group, index)
    return Place("async", None, group, index)


def usable(rollout: Rollout) -> bool:
    """As the loop decides: succeeded, with a finite final reward."""
    r = rollout.reward
    return rollout.status is RolloutStatus.SUCCEEDED and r is not None and math.isfinite(r)


@dataclass
class StepGroups:
    """One sync update's groups: ``kept`` (all usable, in group order) and their advantages
    (``advantages[i][j]`` of ``kept[i][j]``); ``dropped`` groups had an unusable rollout."""

    step: int
    kept: list[list[Rollout]]
    dropped: list[list[Rollout]]
    advantages: list[list[float]]
    zero_variance_groups: int


def step_groups(rollouts: list[Rollout], estimator: str) -> dict[int, StepGroups]:
    """The sync updates among ``rollouts`` (one run record's), by step."""
    from torch import float64, tensor

    from tether.trainer.algorithms import compute_advantages

    by_step: dict[int, dict[int, list[tuple[int, Rollout]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rollouts:
        p = place(r)
        if p.kind == "train" and p.step is not None and p.group is not None:
            by_step[p.step][p.group].append((p.index if p.index is not None else 0, r))
    out: dict[int, StepGroups] = {}
    for step, groups in sorted(by_step.items()):
        ordered = [[r for _, r in sorted(groups[g], key=lambda x: x[0])] for g in sorted(groups)]
        kept = [g for g in ordered if all(usable(r) for r in g)]
        dropped = [g for g in ordered if not all(usable(r) for r in g)]
        advantages: list[list[float]] = []
        zero = 0
        if kept and len({len(g) for g in kept}) == 1:
            rewards = tensor([[r.reward for r in g] for g in kept], dtype=float64)
            adv = compute_advantages(rewards, estimator)
            advantages, zero = adv.advantages.tolist(), adv.zero_variance_groups
        out[step] = StepGroups(step, kept, dropped, advantages, zero)
    return out


def run_estimator(config: dict[str, Any]) -> str:
    """The advantage estimator of a run record's config (``grpo`` when it names none)."""
    trainer = config.get("trainer")
    return str((trainer if isinstance(trainer, dict) else {}).get("advantage") or "grpo")
