"""What the training run tells its on_event listener while an eval runs (see _loop.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Counted", "EvalStart"]


@dataclass
class EvalStart:
    step: int
    rollouts: int  # attempts expected (retries add more)
    what: str  # "100 tasks × 4 samples + greedy"


class Counted:
    """A runner that calls ``tick`` after each attempt (the progress of an eval)."""

    def __init__(self, runner: Any, tick: Any):
        self._runner, self._tick = runner, tick

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    async def run(self, launch: Any) -> Any:
        try:
            return await self._runner.run(launch)
        finally:
            self._tick()
