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
:mod:`tether.runner._config` for the trade-offs, :mod:`tether.runner._base`
for the contract and the exception tree, :class:`RunnerBase` for what every
runner shares.

Importing this package for its configs loads no runner: the runner classes
(and :func:`kill_live_groups`) are imported on first use, so a run config
starts nothing and registers no exit hook.
"""

from __future__ import annotations

import typing as _typing

from tether._lazy import lazy_exports

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
    rebase,
)
from ._config import MODES, RUNNERS, RunnerConfig
from ._factory import make_runner
from ._k8s_manifest import job_manifest, job_name, label_value
from ._remote_config import KubernetesConfig, RayConfig
from ._template import RunnerBase
from ._worker import load_callable

if _typing.TYPE_CHECKING:
    from ._child import kill_live_groups
    from ._inprocess import InProcessRunner
    from ._pool import PoolRunner
    from ._process import ProcessRunner

#: Public names whose modules are imported on first use (they start processes).
_LAZY = {
    "InProcessRunner": "._inprocess",
    "PoolRunner": "._pool",
    "ProcessRunner": "._process",
    "kill_live_groups": "._child",
}

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
    "RunnerBase",
    "RunnerConfig",
    "RunnerConfigError",
    "RunnerError",
    "WorkerError",
    "agent_env",
    "job_manifest",
    "job_name",
    "kill_live_groups",
    "label_value",
    "load_callable",
    "make_runner",
    "rebase",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
