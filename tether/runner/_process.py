"""Process mode: one fresh OS process per rollout attempt, in its own process group.

The command can be any program (any language). It gets exactly
:func:`~tether.runner.agent_env` as its environment, /dev/null as stdin and
``config.cwd`` as working directory; stdout and stderr are read as they come
into bounded tails. How a process group is started and stopped (and why
nothing outlives a rollout) is in :mod:`._child`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from tether.records import RolloutStatus

from ._base import (
    AttemptResult,
    Launch,
    RunnerConfigError,
    agent_env,
    exit_error,
    finish_despite_cancel,
    infra_of_exit,
    result_for,
    timeout_of,
    unreachable_gateway,
)
from ._child import Child, Limits
from ._runner_base import RunnerBase
from ._tail import Tail

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["ProcessRunner"]


class ProcessRunner(RunnerBase):
    """Runs ``config.command`` once per attempt, at most ``config.concurrency`` at a time.

    The command gets exactly :func:`agent_env` as its environment, /dev/null as
    stdin, and ``config.cwd`` as working directory. Its final answer is the
    last non-empty line of its stdout.
    """

    def __init__(self, config: RunnerConfig, *, die_with_parent: bool = False) -> None:
        if not config.command:
            raise RunnerConfigError(
                "command (None) is required in process mode; set it to the agent's "
                "command line, e.g. ['python', 'agent.py']"
            )
        super().__init__(config)
        self._running: set[Child] = set()
        self._limits = Limits(config.max_memory_mb, config.max_open_files, die_with_parent)

    async def _run(self, launch: Launch) -> AttemptResult:
        cfg = self.config
        assert cfg.command is not None
        stdout, both = Tail(cfg.max_output_bytes), Tail(cfg.max_output_bytes)

        def on_stdout(data: bytes) -> None:
            stdout.add(data)
            both.add(data)

        started = time.monotonic()
        try:
            child = await Child.start(
                cfg.command,
                env=agent_env(launch, cfg.extra_env),
                cwd=cfg.cwd,
                on_stdout=on_stdout,
                on_stderr=both.add,
                limits=self._limits,
                rollout_id=launch.rollout_id,
            )
        except OSError as exc:
            return result_for(
                launch,
                RolloutStatus.FAILED,
                error=f"cannot start agent command {cfg.command[0]!r}: {exc}",
                duration_s=time.monotonic() - started,
            )
        self._running.add(child)
        try:
            timed_out = not await child.wait(timeout_of(launch, cfg.timeout_s))
            duration = time.monotonic() - started
            await child.stop(cfg.grace_s)  # the rest of the group, even after a clean exit
        except asyncio.CancelledError:
            await finish_despite_cancel(child.stop(cfg.grace_s))
            raise
        finally:
            self._running.discard(child)
        return self._result(launch, child, timed_out, duration, stdout, both)

    def _result(
        self,
        launch: Launch,
        child: Child,
        timed_out: bool,
        duration: float,
        stdout: Tail,
        both: Tail,
    ) -> AttemptResult:
        timeout = timeout_of(launch, self.config.timeout_s)
        infra = None
        if self._closed and not timed_out and child.returncode != 0:
            status, error = RolloutStatus.CANCELLED, "runner closed while the agent ran"
        elif timed_out:
            status = RolloutStatus.TIMEOUT
            error = f"agent ran past its timeout of {timeout:g}s; its process group was killed"
        else:
            error = exit_error(child.returncode)
            status = RolloutStatus.SUCCEEDED if error is None else RolloutStatus.FAILED
            infra = infra_of_exit(child.returncode, signalled_by_us=child.signalled)
            if status is RolloutStatus.FAILED and not infra and unreachable_gateway(both.text()):
                infra, error = "gateway_unreachable", f"{error}; it could not reach the gateway"
        return result_for(
            launch,
            status,
            exit_code=child.returncode,
            final_answer=stdout.last_line(),
            output_tail=both.text(),
            error=error,
            duration_s=duration,
            infra=infra,
        )

    async def close(self) -> None:
        """Stop every running agent (their attempts return CANCELLED); idempotent."""
        self._closed = True
        grace = self.config.grace_s
        await asyncio.gather(*(child.stop(grace) for child in list(self._running)))
