"""What a training run tells its ``on_event`` listener: one frozen class per kind of event.

:data:`RunEvent` is their union; a listener (the CLI's progress display,
``tether/cli/_progress.py``) dispatches on the class:

- :class:`Status`: a line about start-up (loading the model, the run folder, the dashboard);
- :class:`EvalStart`, :class:`EvalProgress` (after each eval attempt), :class:`EvalDone`;
- :class:`StepDone`: an update's report;
- :class:`Resumed`: ``--resume`` continued from a checkpoint;
- :class:`CheckpointSaved`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.run._evaluate import EvalResult, StepReport
    from tether.run._rundir import ResumePoint
    from tether.runner import AttemptResult, Launch, Runner

__all__ = [
    "CheckpointSaved",
    "Counted",
    "EvalDone",
    "EvalProgress",
    "EvalStart",
    "Resumed",
    "RunEvent",
    "Status",
    "StepDone",
]


@dataclass(frozen=True)
class Status:
    text: str


@dataclass(frozen=True)
class EvalStart:
    step: int
    rollouts: int  # attempts expected (retries add more)
    what: str  # "100 tasks × 4 samples + greedy"


@dataclass(frozen=True)
class EvalProgress:
    """One more attempt of the running eval ended."""


@dataclass(frozen=True)
class EvalDone:
    result: EvalResult


@dataclass(frozen=True)
class StepDone:
    report: StepReport


@dataclass(frozen=True)
class Resumed:
    at: ResumePoint


@dataclass(frozen=True)
class CheckpointSaved:
    step: int
    path: Path


RunEvent = Status | EvalStart | EvalProgress | EvalDone | StepDone | Resumed | CheckpointSaved


def ignore(event: RunEvent) -> None:
    """The listener of a run that was given none."""


class Counted:
    """A runner that calls ``tick`` after each attempt (the progress of an eval); the
    rest (its config, its ``on_start``) is the wrapped runner's."""

    def __init__(self, runner: Runner, tick: Callable[[], None]):
        self._runner, self._tick = runner, tick
        self.on_start = runner.on_start  # what the wrapped runner calls, for the protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    async def run(self, launch: Launch) -> AttemptResult:
        try:
            return await self._runner.run(launch)
        finally:
            self._tick()

    async def close(self) -> None:
        await self._runner.close()
