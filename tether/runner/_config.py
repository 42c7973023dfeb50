"""The runner's config (``runner:`` in a run's YAML) and the factory that picks a mode.

Three modes run the same :class:`~tether.runner.Runner` contract:

============  =====================================================  =====================
mode          what runs per rollout                                  needs
============  =====================================================  =====================
process       a fresh OS process (any language), own process group   ``command``
pool          ``main()`` inside one of ``workers`` warm processes    ``entry`` (Python)
inprocess     ``await agent(task, client)`` in the trainer's loop    ``entry`` (Python)
============  =====================================================  =====================

The ``runner`` field says where those modes run: ``local`` (this machine,
the default), ``ray`` (each attempt a Ray task; ``process`` or ``inprocess``
inside it) or ``kubernetes`` (each attempt a Job running ``command`` or the
template's container). Retries of infrastructure faults (``max_attempts``)
are the trainer's, and work the same for all three.

A fresh Python process that imports the OpenAI SDK and makes one call costs
about 1 s of CPU; a warm pool worker does the same rollout for about 0.05 s and
an in-process agent for about 0.003 s (``benchmarks/runner_modes.py``, 2 CPUs).
So Python agents belong in ``pool`` (isolated, unchanged scripts) or
``inprocess`` (cheapest); ``process`` is for agents in other languages.

This module is a leaf: it imports no runner, so a run config that holds a
``RunnerConfig`` loads no runner, starts nothing and registers no exit hook.
:func:`~tether.runner.make_runner` (:mod:`._factory`) picks and imports the runner.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ._base import CONTRACT_VARS, FORBIDDEN_VARS, RunnerConfigError
from ._pool_worker import parse_agent_spec
from ._remote_config import KubernetesConfig, RayConfig

__all__ = ["MODES", "RUNNERS", "RunnerConfig"]

MODES = ("process", "pool", "inprocess")
RUNNERS = ("local", "ray", "kubernetes")


@dataclass
class RunnerConfig:
    """How to start the agent. Validated when built; errors name the value, rule and fix.

    Each field's help is the ``#:`` comment above it (also in docs/config.md, under
    ``agent``).
    """

    #: "process" (a fresh OS process per rollout, any language), "pool" (main() in one of
    #: the warm worker processes) or "inprocess" (await agent(task, client) in the run's loop).
    mode: str = "process"
    #: Process mode's command line (a list, or a string split like a shell would), e.g.
    #: [python, agent.py].
    command: list[str] | None = None
    # `agent: x.py:main` inside the section (the old name) loads as entry, with a notice
    renamed: ClassVar[dict[str, str]] = {"agent": "entry"}

    #: Pool and in-process modes' Python entry point, "module:function" or
    #: "path/to/file.py:function" (relative to cwd): a main() that reads its env (pool; may
    #: be async), or an async def agent(task, client) (in-process). Was ``agent``.
    entry: str | None = None
    #: Rollouts running at once.
    concurrency: int = 8
    #: Pool size (None: concurrency); a pool runs at most min(concurrency, workers) at once.
    workers: int | None = None
    #: An attempt's deadline in seconds, unless its launch sets one.
    timeout_s: float = 300.0
    #: Seconds between SIGTERM and SIGKILL (in-process: between cancelling the agent's task
    #: and abandoning it).
    grace_s: float = 5.0
    #: Bytes of stdout + stderr kept per attempt (the tail).
    max_output_bytes: int = 16 * 1024
    #: Variables added to every agent's environment, on purpose.
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The agents' working directory (None: the current one).
    cwd: str | None = None
    #: Where the modes run: "local" (this machine), "ray" (each attempt a Ray task) or
    #: "kubernetes" (each attempt a Job); ray and kubernetes hold their own settings.
    runner: str = "local"
    #: Attempts per rollout when attempts end by an infrastructure fault (a foreign kill, a
    #: lost worker or node, an evicted pod, an unreachable gateway).
    max_attempts: int = 3
    #: Also retry the agent's own failures and timeouts (up to max_attempts).
    retry_agent_failures: bool = False
    #: RLIMIT_AS of each agent process in MiB (local and Ray command agents; Kubernetes uses
    #: the pod's limits); None leaves the parent's.
    max_memory_mb: int | None = None
    #: RLIMIT_NOFILE of each agent process; None leaves the parent's.
    max_open_files: int | None = None
    #: The gateway's address as agents on other machines must use it (Ray workers, pods),
    #: replacing the gateway's own public_url in their base URL; None keeps it.
    gateway_url: str | None = None
    #: Ray settings (runner: ray): the cluster and what each attempt reserves.
    ray: RayConfig = field(default_factory=RayConfig)
    #: Kubernetes settings (runner: kubernetes): how each attempt becomes a Job.
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RunnerConfigError(
                f"mode ({self.mode!r}) must be one of {', '.join(MODES)}; "
                "use 'pool' for a Python agent, 'process' for any other program"
            )
        self._check_runner()
        self._check_command()
        self._check_entry()
        _check_int("concurrency", self.concurrency, 1, "the number of rollouts to run at once")
        if self.workers is not None:
            _check_int("workers", self.workers, 1, "the number of warm worker processes")
        _check_seconds("timeout_s", self.timeout_s, positive=True)
        _check_seconds("grace_s", self.grace_s, positive=False)
        _check_int("max_output_bytes", self.max_output_bytes, 256, "e.g. 16384")
        self._check_env()
        if self.cwd is not None and not Path(self.cwd).is_dir():
            raise RunnerConfigError(
                f"cwd ({self.cwd!r}) must be an existing directory; create it or fix the path"
            )

    def _check_command(self) -> None:
        if isinstance(self.command, str):
            self.command = shlex.split(self.command)
        if self.command is not None:
            if not self.command or not all(isinstance(a, str) for a in self.command):
                raise RunnerConfigError(
                    f"command ({self.command!r}) must be a non-empty list of strings, "
                    "e.g. ['python', 'agent.py']"
                )
            self.command = list(self.command)
        elif self.mode == "process" and self.runner != "kubernetes":
            raise RunnerConfigError(
                "command (None) is required in process mode; set it to the agent's "
                "command line, e.g. ['python', 'agent.py'], or use mode 'pool' with entry"
            )

    def _check_entry(self) -> None:
        if self.entry is None:
            if self.mode != "process":
                raise RunnerConfigError(
                    f"entry (None) is required in {self.mode} mode; set it to "
                    "'module:function' or 'path/to/file.py:function'"
                )
            return
        try:
            parse_agent_spec(self.entry)
        except ValueError as exc:
            raise RunnerConfigError(str(exc)) from None

    def _check_env(self) -> None:
        if not isinstance(self.extra_env, dict):
            raise RunnerConfigError(
                f"extra_env ({self.extra_env!r}) must be a mapping of names to strings"
            )
        for name, value in self.extra_env.items():
            if name in CONTRACT_VARS or name in FORBIDDEN_VARS:
                raise RunnerConfigError(
                    f"extra_env sets {name!r}, which tether controls (and never hands "
                    "an admin key to agents); remove it from extra_env"
                )
            if not isinstance(value, str) or not isinstance(name, str) or not name:
                raise RunnerConfigError(
                    f"extra_env[{name!r}] ({value!r}) must be a string; quote it in YAML"
                )

    def _check_runner(self) -> None:
        if self.runner not in RUNNERS:
            raise RunnerConfigError(
                f"runner ({self.runner!r}) must be one of {', '.join(RUNNERS)}; "
                "'local' runs agents on this machine"
            )
        if self.runner == "ray" and self.mode == "pool":
            raise RunnerConfigError(
                "mode ('pool') does not apply to runner 'ray' (Ray keeps its own warm "
                "workers); use mode 'inprocess' for an async agent or 'process' for a command"
            )
        if self.runner == "kubernetes" and self.mode != "process":
            raise RunnerConfigError(
                f"mode ({self.mode!r}) does not apply to runner 'kubernetes': each attempt "
                "is a Job running a container; use mode 'process' (the default)"
            )
        if self.runner == "kubernetes" and not self.command and not self.kubernetes.template:
            raise RunnerConfigError(
                "runner 'kubernetes' needs the agent's container: set kubernetes.template "
                "to a Job template, or kubernetes.image and command"
            )
        _check_int("max_attempts", self.max_attempts, 1, "1 (no retries) or more, e.g. 3")
        for name in ("max_memory_mb", "max_open_files"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 16, "a limit per agent, or null for none")
        if self.gateway_url is not None and not self.gateway_url.startswith(
            ("http://", "https://")
        ):
            raise RunnerConfigError(
                f"gateway_url ({self.gateway_url!r}) must be an http(s) URL that agents can "
                "reach, e.g. http://tether-gateway.tether.svc:8321"
            )

    @property
    def pool_size(self) -> int:
        """Worker processes in pool mode."""
        return self.workers if self.workers is not None else self.concurrency


def _check_int(name: str, value: object, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RunnerConfigError(
            f"{name} ({value!r}) must be an integer >= {minimum}; set it to {hint}"
        )


def _check_seconds(name: str, value: object, *, positive: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        rule = "> 0" if positive else ">= 0"
        raise RunnerConfigError(f"{name} ({value!r}) must be a number of seconds {rule}")
