"""Ray runner: each rollout attempt is one Ray task, on an existing cluster or a local one.

Inside the task a local runner does the work, so the agent contract is the
same as on one machine: ``mode: process`` runs ``command`` as a child of the
Ray worker (own process group, timeout, output tail, limits, and a
parent-death signal so it dies with the worker); ``mode: inprocess`` awaits
``agent`` (an ``async def agent(task, client)``, importable on the workers)
inside the worker. Tasks are submitted with ``max_retries=0``: tether's own
attempts do the retrying, with a new token each time.

How an attempt can end on the driver's side:

==========================================  ===============================
Ray says                                    attempt
==========================================  ===============================
the task's result                           whatever the local runner said
``WorkerCrashedError`` (worker killed)      FAILED, ``infra="worker_lost"``
``NodeDiedError``, ``LocalRayletDiedError``  FAILED, ``infra="node_lost"``
``TaskUnschedulableError``,                 FAILED, ``infra="unschedulable"``
``RuntimeEnvSetupError``
no answer within timeout + grace + slack    TIMEOUT (task cancelled, forced)
==========================================  ===============================

Workers reach the gateway at ``RunnerConfig.gateway_url`` when set (e.g. the
gateway host's cluster address), else at the gateway's ``public_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from tether.records import RolloutStatus

from ._base import (
    AttemptResult,
    Launch,
    RunnerConfigError,
    finish_despite_cancel,
    rebase,
    result_for,
    timeout_of,
)
from ._runner_base import RunnerBase

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["RayRunner", "run_attempt_task"]

log = logging.getLogger(__name__)

#: Extra seconds the driver waits past deadline + grace: scheduling and result transfer.
SCHEDULE_SLACK_S = 30.0


def run_attempt_task(config: RunnerConfig, launch: Launch) -> AttemptResult:
    """The body of the Ray task: one attempt with a local runner, in the Ray worker."""
    from ._child import kill_live_groups
    from ._inprocess import InProcessRunner
    from ._process import ProcessRunner

    local = dataclasses.replace(config, runner="local", concurrency=1)

    async def one() -> AttemptResult:
        runner: Any
        if local.mode == "process":
            runner = ProcessRunner(local, die_with_parent=True)
        else:
            runner = InProcessRunner(local)
        try:
            return await runner.run(launch)
        finally:
            await runner.close()

    try:
        return asyncio.run(one())
    finally:
        kill_live_groups()  # cancelled mid-attempt (KeyboardInterrupt): nothing stays behind


class RayRunner(RunnerBase):
    """Runs each attempt as a Ray task; at most ``config.concurrency`` in flight."""

    def __init__(self, config: RunnerConfig) -> None:
        try:
            import ray
            import ray.exceptions
        except ImportError:
            raise RunnerConfigError(
                "runner 'ray' needs Ray; install it with: pip install 'tether[ray]'"
            ) from None
        if config.mode == "pool":
            raise RunnerConfigError("runner 'ray' runs mode 'process' or 'inprocess', not 'pool'")
        super().__init__(config)
        self._ray = ray
        self._lock = asyncio.Lock()
        self._remote: Any = None
        self._inflight: set[Any] = set()
        self.started_ray = False  # whether this runner called ray.init (and shuts it down)

    async def start(self) -> None:
        """Connect to Ray (``ray.address``) or start a local instance; idempotent."""
        async with self._lock:
            if self._remote is not None:
                return
            ray, rc = self._ray, self.config.ray
            if not ray.is_initialized():
                kwargs: dict[str, Any] = {"address": rc.address, "log_to_driver": False}
                if rc.runtime_env:
                    kwargs["runtime_env"] = rc.runtime_env
                if rc.address is None:
                    kwargs.update(num_cpus=rc.local_num_cpus, include_dashboard=False)
                log.info("connecting to Ray at %s", rc.address or "a new local instance")
                ray.init(**kwargs)
                self.started_ray = True
            options: dict[str, Any] = {
                "num_cpus": rc.num_cpus,
                "num_gpus": rc.num_gpus,
                "max_retries": 0,
                "retry_exceptions": False,
            }
            if rc.resources:
                options["resources"] = dict(rc.resources)
            if rc.memory_mb:
                options["memory"] = rc.memory_mb * 1024 * 1024
            self._remote = ray.remote(run_attempt_task).options(**options)

    async def _run(self, launch: Launch) -> AttemptResult:
        await self.start()
        launch = rebase(launch, self.config.gateway_url)
        cfg, exc_types = self.config, self._ray.exceptions
        started = time.monotonic()
        ref = self._remote.remote(cfg, launch)
        self._inflight.add(ref)
        limit = timeout_of(launch, cfg.timeout_s) + cfg.grace_s + SCHEDULE_SLACK_S

        def failed(infra: str | None, error: str) -> AttemptResult:
            return result_for(
                launch,
                RolloutStatus.FAILED,
                error=error,
                infra=infra,
                duration_s=time.monotonic() - started,
            )

        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), limit)
        except asyncio.TimeoutError:
            await self._cancel(ref)
            return result_for(
                launch,
                RolloutStatus.TIMEOUT,
                error=f"Ray task gave no result within {limit:g}s; it was cancelled",
                duration_s=time.monotonic() - started,
            )
        except asyncio.CancelledError:
            await finish_despite_cancel(self._cancel(ref))
            raise
        except exc_types.TaskCancelledError:
            return result_for(launch, RolloutStatus.CANCELLED, error="Ray task was cancelled")
        except exc_types.WorkerCrashedError as exc:
            return failed("worker_lost", f"the Ray worker died during the attempt: {_line(exc)}")
        except (exc_types.NodeDiedError, exc_types.LocalRayletDiedError) as exc:
            return failed("node_lost", f"the Ray node was lost: {_line(exc)}")
        except (exc_types.TaskUnschedulableError, exc_types.RuntimeEnvSetupError) as exc:
            return failed("unschedulable", f"Ray could not place the attempt: {_line(exc)}")
        except exc_types.RayTaskError as exc:  # the task itself raised: tether or its import
            return failed(None, f"the Ray task raised: {_line(exc)}")
        except exc_types.RayError as exc:  # object or owner lost, system errors
            return failed("worker_lost", f"Ray lost the attempt: {_line(exc)}")
        finally:
            self._inflight.discard(ref)

    async def _cancel(self, ref: Any) -> None:
        """Interrupt the task (its agent is stopped), then force-kill its worker after grace."""
        ray = self._ray
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
        done, _ = await asyncio.wait(
            {asyncio.wrap_future(ref.future())}, timeout=self.config.grace_s + 1.0
        )
        if not done:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)

    async def close(self) -> None:
        """Cancel attempts in flight (they return CANCELLED); shut down a Ray this runner started."""
        self._closed = True
        await asyncio.gather(*(self._cancel(ref) for ref in list(self._inflight)))
        if self.started_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self.started_ray = False


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__
