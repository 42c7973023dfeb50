"""Runners start the unchanged agent for each rollout attempt and report how it ended.

::

    from tether.runner import Launch, RunnerConfig, make_runner

    runner = make_runner(RunnerConfig(mode="pool", entry="examples/calc_agent.py:main"))
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

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (a runner class starts processes and registers exit hooks: not on import).
if TYPE_CHECKING:
    from ._base import AgentLoadError as AgentLoadError
    from ._base import Attempt as Attempt
    from ._base import AttemptResult as AttemptResult
    from ._base import Launch as Launch
    from ._base import Runner as Runner
    from ._base import RunnerConfigError as RunnerConfigError
    from ._base import RunnerError as RunnerError
    from ._base import WorkerError as WorkerError
    from ._base import agent_env as agent_env
    from ._child import kill_live_groups as kill_live_groups
    from ._config import MODES as MODES
    from ._config import RunnerConfig as RunnerConfig
    from ._factory import make_runner as make_runner
    from ._inprocess import InProcessRunner as InProcessRunner
    from ._pool import PoolRunner as PoolRunner
    from ._pool_worker import load_callable as load_callable
    from ._process import ProcessRunner as ProcessRunner
    from ._remote_config import KubernetesConfig as KubernetesConfig
    from ._remote_config import RayConfig as RayConfig
    from ._runner_base import RunnerBase as RunnerBase

__getattr__, __dir__, __all__ = lazy_face(__name__)
