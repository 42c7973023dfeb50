"""Runners start the unchanged agent for each rollout attempt and report how it ended.

::

    from tether.runner import Launch, RunnerConfig, make_runner

    runner = make_runner(RunnerConfig(mode="pool", agent="examples/calc_agent.py:main"))
    result = await runner.run(Launch(rollout_id, 1, base_url, token, task))
    await runner.close()

Modes: ``process`` (a fresh process per attempt, any language), ``pool``
(warm Python workers, many attempts each), ``inprocess`` (an
``async def agent(task, client)`` on the caller's loop). See
:mod:`tether.runner._config` for the trade-offs and :mod:`tether.runner._base`
for the contract and the exception tree.
"""

from __future__ import annotations

from ._base import (
    AgentLoadError,
    AttemptResult,
    Launch,
    Runner,
    RunnerConfigError,
    RunnerError,
    WorkerError,
    agent_env,
)
from ._config import MODES, RunnerConfig, make_runner
from ._inprocess import InProcessRunner
from ._pool import PoolRunner
from ._process import ProcessRunner

__all__ = [
    "MODES",
    "AgentLoadError",
    "AttemptResult",
    "InProcessRunner",
    "Launch",
    "PoolRunner",
    "ProcessRunner",
    "Runner",
    "RunnerConfig",
    "RunnerConfigError",
    "RunnerError",
    "WorkerError",
    "agent_env",
    "make_runner",
]
