"""A training run's held-out evaluation: its result, and the rollouts it collects.

An eval runs the agent as it really runs on the first ``eval.tasks`` val
tasks: ``eval.samples`` rollouts per task at ``eval.temperature``, and with
``eval.greedy`` one more at temperature 0. Success is each rollout's own
verdict (see ``_collect``), the same as in train steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.gateway import Gateway
from tether.records import Task
from tether.run._collect import Grader, RolloutOutcome, collect_groups
from tether.run.config import EvalConfig

__all__ = ["EvalResult", "StepReport", "collect_eval", "success_rate"]


@dataclass
class EvalResult:
    step: int
    sampled: float  # success rate at the eval temperature, several samples per task
    greedy: float | None  # success rate at temperature 0, one per task
    tasks: int
    rollouts: int
    wall_s: float

    @classmethod
    def from_metrics(cls, step: int, m: dict[str, float]) -> EvalResult:
        """Rebuilt from the ``eval/*`` metrics that :meth:`metrics` gives the store."""
        return cls(
            step,
            m.get("eval/sampled_success", float("nan")),
            m.get("eval/greedy_success"),
            int(m.get("eval/tasks", 0)),
            int(m.get("eval/rollouts", 0)),
            m.get("eval/wall_s", 0.0),
        )

    def metrics(self) -> dict[str, float]:
        """The ``eval/*`` metrics of this result (what the store keeps)."""
        return {
            "eval/sampled_success": self.sampled,
            **({"eval/greedy_success": self.greedy} if self.greedy is not None else {}),
            "eval/tasks": float(self.tasks),
            "eval/rollouts": float(self.rollouts),
            "eval/wall_s": self.wall_s,
        }


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


def success_rate(outcomes: Sequence[RolloutOutcome]) -> float:
    return sum(1 for o in outcomes if o.success) / max(len(outcomes), 1)


async def collect_eval(
    gateway: Gateway,
    runner: Any,
    tasks: list[Task],
    e: EvalConfig,
    *,
    step: int,
    grader: Grader | None,
    run_id: str,
    success_threshold: float | None,
) -> tuple[float, float | None, list[RolloutOutcome]]:
    """(sampled success, greedy success or None, every outcome) of one eval."""
    common: dict[str, Any] = {
        "grader": grader,
        "run_id": run_id,
        "success_threshold": success_threshold,
    }
    sampled = await collect_groups(
        gateway,
        runner,
        tasks,
        e.samples,
        tag=f"eval{step}-s",
        sampling={"temperature": e.temperature},
        **common,
    )
    greedy = None
    outcomes = list(sampled.outcomes)
    if e.greedy:
        g = await collect_groups(
            gateway, runner, tasks, 1, tag=f"eval{step}-g", sampling={"temperature": 0.0}, **common
        )
        greedy = success_rate(g.outcomes)
        outcomes += g.outcomes
    return success_rate(sampled.outcomes), greedy, outcomes
