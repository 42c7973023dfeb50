"""Running groups of rollouts through the gateway and a runner, and grading them."""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.errors import UserError
from tether.gateway import Gateway
from tether.records import Call, RewardSource, RolloutStatus, Task
from tether.runner import AttemptResult, Launch, Runner

__all__ = ["Collected", "Grader", "RolloutOutcome", "collect_groups", "load_grader"]

log = logging.getLogger(__name__)

Grader = Callable[[dict[str, Any], str | None], float]


def load_grader(spec: str) -> Grader | None:
    """Import ``"module:function"``; an empty spec means the agent reports its own reward."""
    if not spec:
        return None
    module, sep, name = spec.partition(":")
    if not sep:
        raise UserError(f"rollout.grader ({spec!r}) must look like 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"rollout.grader ({spec!r}) cannot be imported: {exc}") from None
    return fn


@dataclass
class RolloutOutcome:
    rollout_id: str
    group: int
    status: RolloutStatus
    reward: float | None  # None when missing or unusable (NaN/inf/not a number)
    calls: list[Call] = field(default_factory=list)
    final_answer: str | None = None

    @property
    def usable(self) -> bool:
        return self.status is RolloutStatus.SUCCEEDED and self.reward is not None


@dataclass
class Collected:
    outcomes: list[RolloutOutcome]
    wall_s: float
    completion_tokens: int

    def groups(self) -> list[list[RolloutOutcome]]:
        by: dict[int, list[RolloutOutcome]] = {}
        for o in self.outcomes:
            by.setdefault(o.group, []).append(o)
        return [by[k] for k in sorted(by)]


def _reward(
    result: AttemptResult, task: dict[str, Any], grader: Grader | None, gw: Gateway
) -> tuple[float | None, RewardSource]:
    if grader is not None:
        try:
            value = grader(task, result.final_answer)
        except Exception as exc:  # a grader bug makes this rollout unusable, not the run
            log.warning("grader raised on rollout %s: %s", result.rollout_id, exc)
            return None, RewardSource.GRADER
        return value, RewardSource.GRADER
    if result.agent_value is not None:
        return result.agent_value, RewardSource.AGENT
    finals = [
        r
        for r in gw.store.rewards(result.rollout_id)
        if r.call_seq is None and r.attempt == result.attempt
    ]
    return (finals[-1].value if finals else None), RewardSource.AGENT


def _clean(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


async def collect_groups(
    gw: Gateway,
    runner: Runner,
    tasks: list[Task],
    n: int,
    *,
    grader: Grader | None,
    run_id: str,
    tag: str,
    sampling: dict[str, float] | None = None,
) -> Collected:
    """Run ``n`` rollouts of every task (one group per task), grade them, return their calls."""
    t0 = time.perf_counter()
    opened = []
    for g, task in enumerate(tasks):
        for i in range(n):
            o = gw.open_rollout(
                task.data,
                rollout_id=f"{run_id}-{tag}-g{g}-{i}",
                run_id=run_id,
                group_id=f"{run_id}-{tag}-g{g}",
                task_id=task.id,
                sampling=sampling,
            )
            opened.append((g, task, o))
    launches = [
        Launch(
            rollout_id=o.rollout_id,
            attempt=o.attempt,
            base_url=o.base_url,
            token=o.token,
            task=task.data,
            reward_url=o.reward_url if gw.config.allow_agent_rewards else None,
        )
        for _, task, o in opened
    ]
    results = await asyncio.gather(*(runner.run(launch) for launch in launches))
    outcomes = []
    tokens = 0
    for (g, task, o), result in zip(opened, results, strict=True):
        reward: float | None = None
        source = RewardSource.GRADER
        if result.ok:
            raw, source = _reward(result, task.data, grader, gw)
            reward = _clean(raw)
        error = result.error
        if result.ok and reward is None:
            error = "no usable reward (missing, NaN, inf or not a number)"
        rollout = gw.finish_rollout(
            o.rollout_id,
            result.status,
            attempt=o.attempt,
            reward=reward,
            source=source,
            final_answer=result.final_answer,
            error=error,
        )
        calls = gw.store.calls(o.rollout_id, attempt=o.attempt)
        tokens += sum(len(c.completion_ids) for c in calls)
        outcomes.append(
            RolloutOutcome(
                o.rollout_id,
                g,
                rollout.status,
                reward if rollout.usable else None,
                calls,
                result.final_answer,
            )
        )
    return Collected(outcomes, time.perf_counter() - t0, tokens)
