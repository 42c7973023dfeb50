"""A training run's held-out evaluation: its result, and the rollouts it collects.

An eval runs the agent as it really runs on the first ``eval.tasks`` val
tasks: ``eval.samples`` rollouts per task at ``eval.temperature``, and with
``eval.greedy`` one more at temperature 0. Success is each rollout's own
verdict (see ``_collect``), the same as in train steps. Beside success the
result holds the mean reward of the rollouts with a usable reward (a shaped
reward's held-out signal). An eval over zero tasks is never run (``_loop``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tether.records import Phase, Place, Task
from tether.run._collect import Collector, RolloutOutcome
from tether.run.config import EvalConfig

__all__ = [
    "EvalResult",
    "EvalRollouts",
    "StepReport",
    "collect_eval",
    "mean_reward",
    "success_rate",
]


@dataclass
class EvalResult:
    step: int
    sampled: float  # success rate at the eval temperature, several samples per task
    greedy: float | None  # success rate at temperature 0, one per task
    tasks: int
    rollouts: int
    wall_s: float
    #: Mean reward of the sampled (and greedy) rollouts with a usable reward: the held-out
    #: signal of a shaped reward, where success alone says little. NaN when none had one.
    sampled_reward: float = float("nan")
    greedy_reward: float | None = None

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
            m.get("eval/sampled_reward_mean", float("nan")),
            m.get("eval/greedy_reward_mean"),
        )

    def metrics(self) -> dict[str, float]:
        """The ``eval/*`` metrics of this result (what the store keeps)."""
        return {
            "eval/sampled_success": self.sampled,
            **({"eval/greedy_success": self.greedy} if self.greedy is not None else {}),
            "eval/sampled_reward_mean": self.sampled_reward,
            **(
                {"eval/greedy_reward_mean": self.greedy_reward}
                if self.greedy_reward is not None
                else {}
            ),
            "eval/tasks": float(self.tasks),
            "eval/rollouts": float(self.rollouts),
            "eval/wall_s": self.wall_s,
        }


@dataclass
class EvalRollouts:
    """The outcomes of one eval: the sampled ones, and the greedy ones (None without)."""

    sampled: list[RolloutOutcome]
    greedy: list[RolloutOutcome] | None

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        return self.sampled + (self.greedy or [])

    def result(self, step: int, tasks: int, wall_s: float) -> EvalResult:
        g = self.greedy
        return EvalResult(
            step,
            success_rate(self.sampled),
            None if g is None else success_rate(g),
            tasks,
            len(self.outcomes),
            wall_s,
            mean_reward(self.sampled),
            None if g is None else mean_reward(g),
        )


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


def success_rate(outcomes: Sequence[RolloutOutcome]) -> float:
    return sum(1 for o in outcomes if o.success) / max(len(outcomes), 1)


def mean_reward(outcomes: Sequence[RolloutOutcome]) -> float:
    """Mean over the rollouts with a usable reward (unusable ones are not 0); NaN if none."""
    rewards = [o.reward for o in outcomes if o.usable and o.reward is not None]
    return sum(rewards) / len(rewards) if rewards else float("nan")


async def collect_eval(
    collector: Collector, tasks: list[Task], e: EvalConfig, *, step: int
) -> EvalRollouts:
    """The sampled (and greedy) outcomes of one eval at ``step``."""
    at = Place(Phase.EVAL, step)
    sampled = await collector.collect(tasks, e.samples, at, sampling={"temperature": e.temperature})
    greedy = None
    if e.greedy:
        at = Place(Phase.EVAL, step, greedy=True)
        g = await collector.collect(tasks, 1, at, sampling={"temperature": 0.0})
        greedy = list(g.outcomes)
    return EvalRollouts(list(sampled.outcomes), greedy)
