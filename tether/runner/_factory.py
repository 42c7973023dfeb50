"""``make_runner``: the runner class for a :class:`RunnerConfig`, imported only when chosen.

Runner modules are imported here, on demand, never by the config: the local
runners register the process-group exit hook (:mod:`._child`) when they first
start a group, and the Ray and Kubernetes runners import their optional
clients (the ``tether[ray]`` / ``tether[kubernetes]`` extras) in their
constructors, so a config naming them can be built and checked anywhere.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._base import Runner
    from ._config import RunnerConfig

__all__ = ["RUNNER_CLASSES", "make_runner"]

#: (runner, mode) → "module:class" under tether.runner; mode None: any mode.
RUNNER_CLASSES: dict[tuple[str, str | None], str] = {
    ("local", "process"): "._process:ProcessRunner",
    ("local", "pool"): "._pool:PoolRunner",
    ("local", "inprocess"): "._inprocess:InProcessRunner",
    ("ray", None): "._ray:RayRunner",
    ("kubernetes", None): "._kubernetes:KubernetesRunner",
}


def runner_class(runner: str, mode: str) -> type:
    """The class that runs ``mode`` on ``runner``, its module imported now."""
    entry = RUNNER_CLASSES.get((runner, mode)) or RUNNER_CLASSES[(runner, None)]
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module, __package__), name)  # type: ignore[no-any-return]


def make_runner(config: RunnerConfig) -> Runner:
    """The runner for ``config.runner`` and ``config.mode``. Starts nothing: pools start on first use.

    In-process mode imports the agent here, so a wrong ``RunnerConfig.agent`` fails
    now (:class:`~tether.runner.AgentLoadError`); pool workers import it in
    their own processes (call ``await runner.start()`` to fail early). The Ray
    and Kubernetes runners import their optional client here and say which
    extra to install when it is missing.
    """
    return runner_class(config.runner, config.mode)(config)  # type: ignore[no-any-return]
