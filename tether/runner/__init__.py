"""Runners start the unchanged agent for each rollout attempt and report how it ended.

::

    from tether.runner import Launch, RunnerConfig, make_runner

    runner = make_runner(RunnerConfig(mode="pool", agent="examples/calc_agent.py:main"))
    result = await runner.run(Launch(rollout_id, 1, base_url, token, task))
    await runner.close()

Modes: ``process`` (a fresh process per attempt, any language), ``pool``
(warm Python workers, many attempts each), ``inprocess`` (an
``async def agent(task, client)`` on the caller's loop). Runners: ``local``
(this machine), ``ray`` (a Ray task per attempt), ``kubernetes`` (a Job per
attempt); the last two are optional extras, imported by :func:`make_runner`.
``Attempt(runner, launch)`` starts an attempt to watch or cancel. See
:mod:`tether.runner._config` for the trade-offs and :mod:`tether.runner._base`
for the contract and the exception tree.
"""

from __future__ import annotations

from ._base import (
    INFRA_FAULTS,
    AgentLoadError,
    Attempt,
    AttemptResult,
    Launch,
    Runner,
    RunnerConfigError,
    RunnerError,
    WorkerError,
    agent_env,
)
from ._child import kill_live_groups
from ._config import MODES, RUNNERS, RunnerConfig, make_runner
from ._inprocess import InProcessRunner
from ._pool import PoolRunner
from ._process import ProcessRunner
from ._remote_config import KubernetesConfig, RayConfig

__all__ = [
    "INFRA_FAULTS",
    "MODES",
    "RUNNERS",
    "AgentLoadError",
    "Attempt",
    "AttemptResult",
    "InProcessRunner",
    "KubernetesConfig",
    "Launch",
    "PoolRunner",
    "ProcessRunner",
    "RayConfig",
    "Runner",
    "RunnerConfig",
    "RunnerConfigError",
    "RunnerError",
    "WorkerError",
    "agent_env",
    "kill_live_groups",
    "make_runner",
]
