"""Groups that carry signal (``rollout.filter_groups``): DAPO's dynamic sampling, sync mode.

A group whose rollouts all got the same reward (with ``trainer.credit: turn``:
whose returns are equal at every turn) has advantage 0 everywhere and teaches
nothing; its rollouts only cost time. With ``filter_groups`` an update collects
its ``batch_groups`` groups as usual, then, while fewer than ``batch_groups``
trainable groups carry signal, samples more groups of other train tasks, until
``max_oversample × batch_groups`` groups in all have been sampled. Each round
asks for the missing groups divided by the share of groups that carried signal
so far (one batch more when none did yet), within what is left of that budget;
the rounds' groups continue the step's numbering (``s{step}-g{batch_groups}``,
…). :func:`tether.run._learn.learn_metrics` then trains the first
``batch_groups`` groups with signal (fewer when the budget ran out) and counts
the others.

The extra tasks are a pure function of (seed, step, round), drawn from the
train tasks apart from the data order of :func:`tasks_for_step`, so a resumed
run samples the same ones and the next steps' tasks are unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable

from tether.records import Task
from tether.run._collect import Collected, RolloutOutcome
from tether.run._learn import Learning, has_signal, trainable

__all__ = ["collect_with_signal", "extra_tasks"]

Collect = Callable[[list[Task], int], Awaitable[Collected]]  # (tasks, first group) → groups


def extra_tasks(train: list[Task], step: int, round_: int, count: int, seed: int) -> list[Task]:
    """``count`` train tasks for refill round ``round_`` (from 1) of update ``step``: a
    seeded draw without repeats (cycling when ``count`` exceeds the train tasks)."""
    order = list(range(len(train)))
    random.Random(f"filter-{seed}-{step}-{round_}").shuffle(order)
    return [train[order[i % len(order)]] for i in range(count)]


def _with_signal(groups: list[list[RolloutOutcome]], how: Learning) -> int:
    return sum(1 for g in groups if trainable(g, how.credit) and has_signal(g, how))


async def collect_with_signal(
    collect: Collect,
    first: list[Task],
    more: Callable[[int, int], list[Task]],
    how: Learning,
    max_oversample: int,
) -> tuple[list[list[RolloutOutcome]], dict[str, float]]:
    """The step's groups: ``first`` (the batch), then rounds of ``more(round, count)``
    tasks until ``how.signal_only`` groups carry signal or ``max_oversample ×
    len(first)`` groups were sampled. Returns every group and the metrics
    ``groups_sampled``, ``groups_extra``, ``rollouts_extra``, ``filter_rounds``,
    ``completion_tokens``; without ``how.signal_only`` (no filter) the batch alone and
    ``completion_tokens``."""
    batch = len(first)
    collected = await collect(first, 0)
    groups = collected.groups()
    tokens = collected.completion_tokens
    if how.signal_only is None:
        return groups, {"completion_tokens": float(tokens)}
    want, budget = how.signal_only, max_oversample * batch
    rounds = 0
    while (have := _with_signal(groups, how)) < want and len(groups) < budget:
        rounds += 1
        need = want - have
        ask = math.ceil(need * len(groups) / have) if have else batch
        ask = min(max(ask, need), budget - len(groups))
        extra = await collect(more(rounds, ask), len(groups))
        groups += extra.groups()
        tokens += extra.completion_tokens
    extra_groups = len(groups) - batch
    m = {
        "groups_sampled": float(len(groups)),
        "groups_extra": float(extra_groups),
        "rollouts_extra": float(sum(len(g) for g in groups[batch:])),
        "filter_rounds": float(rounds),
        "completion_tokens": float(tokens),
    }
    return groups, m
