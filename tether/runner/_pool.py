"""Pool mode: warm worker processes that import the agent once and run many rollouts.

Each worker is ``python -u tether/runner/_pool_worker.py AGENT`` in its own process
group, started with the agent environment minus the rollout variables (so no
secret of the trainer ever reaches it). Per rollout the worker sets
``os.environ`` to the rollout's :func:`agent_env`, points fds 1 and 2 at a
capture pipe, and calls ``main()``; the protocol is in :mod:`._pool_worker`.

A worker whose rollout times out is stopped like a process-mode agent (SIGTERM
to its group, ``grace_s``, SIGKILL) and a fresh one takes its place on the next
rollout. A worker that dies mid-rollout is replaced the same way. Module state
of the agent survives between the rollouts of one worker; an agent that keeps
global state per task should reset it in ``main()``. In particular the agent
module is imported before any rollout exists, without ``OPENAI_BASE_URL`` or
``OPENAI_API_KEY``: its OpenAI client must be created inside ``main()`` (which
is where ``OpenAI()`` reads the rollout's variables), not at import time.

Workers are tracked by the process-group registry of :mod:`._child` (killed
at interpreter exit) and by a finalizer on the runner, so a runner dropped
without :meth:`PoolRunner.close` does not leave them behind.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.records import RolloutStatus

from ._base import (
    AgentLoadError,
    AttemptResult,
    Launch,
    RunnerConfigError,
    RunnerError,
    WorkerError,
    agent_env,
    base_env,
    exit_error,
    finish_despite_cancel,
    infra_of_exit,
    result_for,
    timeout_of,
    unreachable_gateway,
)
from ._child import Child, Limits, signal_group
from ._runner_base import RunnerBase

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["PoolRunner"]

WORKER_SCRIPT = str(Path(__file__).with_name("_pool_worker.py"))


class _WorkerHandle:
    """The parent's handle on one worker process; its replies arrive one JSON object a line."""

    def __init__(self, limit: int) -> None:
        self.child: Child | None = None
        self._replies: asyncio.Queue[bytes | WorkerError] = asyncio.Queue()
        self._partial = bytearray()
        self._limit = limit

    @classmethod
    async def start(cls, argv: list[str], limit: int, **kwargs: Any) -> _WorkerHandle:
        worker = cls(limit)
        worker.child = await Child.start(
            argv, on_stdout=worker._on_stdout, stdin_pipe=True, **kwargs
        )
        return worker

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    @property
    def returncode(self) -> int | None:
        assert self.child is not None
        return self.child.returncode

    @property
    def _name(self) -> str:  # output can arrive before start() has returned
        return str(self.child.pid) if self.child is not None else "(starting)"

    def _on_stdout(self, data: bytes) -> None:
        if not data:  # end of stream: the worker is gone
            self._replies.put_nowait(WorkerError(f"pool worker {self._name} exited"))
            return
        self._partial += data
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        for line in lines:
            if line.strip():
                self._replies.put_nowait(bytes(line))
        if len(self._partial) > self._limit:
            self._partial.clear()
            self._replies.put_nowait(
                WorkerError(f"pool worker {self._name} sent an oversized line")
            )

    def send(self, message: dict[str, Any]) -> None:
        assert self.child is not None
        self.child.write(json.dumps(message).encode() + b"\n")

    async def receive(self) -> dict[str, Any]:
        line = await self._replies.get()
        if isinstance(line, WorkerError):
            self._replies.put_nowait(line)  # every later read fails the same way
            raise line
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkerError(f"pool worker {self.pid} sent {line[:80]!r}, not JSON") from exc
        if not isinstance(message, dict):
            raise WorkerError(f"pool worker {self.pid} sent {message!r}, not an object")
        return message


def _kill_groups(pgids: set[int]) -> None:
    for pgid in list(pgids):
        signal_group(pgid, signal.SIGKILL)


class PoolRunner(RunnerBase):
    """Runs ``config.entry``'s ``main()`` in ``config.pool_size`` warm workers.

    At most ``min(concurrency, workers)`` rollouts run at once, one per worker.
    Workers start lazily (an idle one is reused before a new one is started),
    or all at once with :meth:`start`; each must be ready within ``timeout_s``.
    """

    def __init__(self, config: RunnerConfig) -> None:
        if not config.entry:
            raise RunnerConfigError("entry (None) is required in pool mode")
        super().__init__(config, limit=min(config.concurrency, config.pool_size))
        # A worker, or None for a free slot where one may be started. LIFO: reuse first.
        self._tokens: asyncio.LifoQueue[_WorkerHandle | None] = asyncio.LifoQueue()
        for _ in range(config.pool_size):
            self._tokens.put_nowait(None)
        self._busy: set[_WorkerHandle] = set()
        self._pgids: set[int] = set()
        self._load_error: str | None = None
        self._finalizer = weakref.finalize(self, _kill_groups, self._pgids)
        # One reply line holds the tail and the answer, JSON-escaped (up to 6 chars a byte).
        self._line_limit = 16 * config.max_output_bytes + 2**16
        self._env = base_env(config.extra_env)

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the live workers (idle or busy)."""
        return sorted(self._pgids)

    async def start(self) -> None:
        """Start every worker now; raises :class:`AgentLoadError` if the agent cannot import."""
        tokens = [self._tokens.get_nowait() for _ in range(self._tokens.qsize())]
        spawned = await asyncio.gather(
            *(self._spawn() for t in tokens if t is None), return_exceptions=True
        )
        for token in [t for t in tokens if t is not None] + list(spawned):
            await self._give_back(token if isinstance(token, _WorkerHandle) else None)
        for outcome in spawned:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _spawn(self) -> _WorkerHandle:
        if self._load_error is not None:
            raise AgentLoadError(self._load_error)
        argv = [sys.executable, "-u", WORKER_SCRIPT, str(self.config.entry)]
        try:
            worker = await _WorkerHandle.start(
                argv,
                self._line_limit,
                env=self._env,
                cwd=self.config.cwd,
                limits=Limits(self.config.max_memory_mb, self.config.max_open_files),
            )
        except OSError as exc:
            raise WorkerError(f"cannot start a pool worker ({sys.executable}): {exc}") from exc
        self._pgids.add(worker.pid)
        try:
            hello = await asyncio.wait_for(worker.receive(), self.config.timeout_s)
        except (asyncio.TimeoutError, WorkerError) as exc:
            await self._discard(worker)
            raise WorkerError(f"pool worker did not start: {exc or 'timed out'}") from None
        except asyncio.CancelledError:
            await finish_despite_cancel(self._discard(worker))
            raise
        if not hello.get("ready"):
            self._load_error = (
                f"{hello.get('error') or 'unknown error'} (pool workers import the agent once, "
                "before any rollout: create the OpenAI client inside main(), not at import)"
            )
            await self._discard(worker)
            raise AgentLoadError(self._load_error)
        return worker

    async def _discard(self, worker: _WorkerHandle) -> None:
        """Stop a worker and its whole group; it is gone from the pool afterwards."""
        assert worker.child is not None
        await worker.child.stop(self.config.grace_s)
        self._pgids.discard(worker.pid)

    async def _give_back(self, worker: _WorkerHandle | None) -> None:
        if worker is not None and self._closed:
            await self._discard(worker)
            worker = None
        self._tokens.put_nowait(worker)

    async def _run(self, launch: Launch) -> AttemptResult:
        """One attempt on a worker (an idle one, or a new one in a free slot)."""
        env = agent_env(launch, self.config.extra_env)
        token = await self._tokens.get()  # never waits: the semaphore is at most the pool size
        started = time.monotonic()
        if token is not None and token.returncode is not None:  # died while idle
            await self._discard(token)
            token = None
        try:
            worker = token if token is not None else await self._spawn()
        except RunnerError as exc:  # AgentLoadError, WorkerError: this attempt fails
            self._tokens.put_nowait(None)
            duration = time.monotonic() - started
            return result_for(launch, RolloutStatus.FAILED, error=str(exc), duration_s=duration)
        except BaseException:
            self._tokens.put_nowait(None)
            raise
        self._busy.add(worker)
        assert worker.child is not None
        worker.child.rollout_id = launch.rollout_id  # what its processes carry; see _reap
        try:
            result, healthy = await self._run_on(worker, launch, env)
        except BaseException:  # cancelled (or a bug): the worker's state is unknown
            try:
                await finish_despite_cancel(self._discard(worker))
            finally:
                self._tokens.put_nowait(None)
            raise
        finally:
            self._busy.discard(worker)
            worker.child.rollout_id = None
        await self._give_back(worker if healthy else None)  # _run_on discarded a bad one
        return result

    async def _run_on(
        self, worker: _WorkerHandle, launch: Launch, env: dict[str, str]
    ) -> tuple[AttemptResult, bool]:
        """One rollout on ``worker``; the flag says whether the worker can be reused."""
        cfg = self.config
        timeout = timeout_of(launch, cfg.timeout_s)
        started = time.monotonic()
        try:
            worker.send({"env": env, "max_output_bytes": cfg.max_output_bytes})
            reply = await asyncio.wait_for(worker.receive(), timeout)
        except asyncio.TimeoutError:
            duration = time.monotonic() - started
            last = await self._stop_timed_out(worker)
            return result_for(
                launch,
                RolloutStatus.TIMEOUT,
                exit_code=worker.returncode,
                final_answer=last.get("final_answer"),
                output_tail=str(last.get("output_tail", "")),
                error=f"agent ran past its timeout of {timeout:g}s; pool worker "
                f"{worker.pid} and its process group were killed",
                duration_s=duration,
            ), False
        except (WorkerError, ConnectionError) as exc:
            duration = time.monotonic() - started
            await self._discard(worker)
            infra = None
            if self._closed:
                status, error = RolloutStatus.CANCELLED, "runner closed while the agent ran"
            else:
                status = RolloutStatus.FAILED
                error = f"{exc} during the rollout (code {worker.returncode}); replaced"
                if infra_of_exit(worker.returncode, signalled_by_us=False):
                    infra = "worker_lost"
            return result_for(
                launch,
                status,
                exit_code=worker.returncode,
                error=error,
                duration_s=duration,
                infra=infra,
            ), False
        if reply.get("killed"):  # stopped from outside (close(), or a signal) mid-rollout
            await self._discard(worker)
            status = RolloutStatus.CANCELLED if self._closed else RolloutStatus.FAILED
            return result_for(
                launch,
                status,
                exit_code=worker.returncode,
                final_answer=reply.get("final_answer"),
                output_tail=str(reply.get("output_tail", "")),
                error=f"pool worker {worker.pid} was stopped during the rollout",
                duration_s=time.monotonic() - started,
                infra=None if self._closed else "killed",
            ), False
        code = int(reply.get("exit_code", 1))
        error = reply.get("error") or exit_error(code)
        tail = str(reply.get("output_tail", ""))
        unreachable = code != 0 and unreachable_gateway(tail)
        return result_for(
            launch,
            RolloutStatus.SUCCEEDED if code == 0 else RolloutStatus.FAILED,
            exit_code=code,
            final_answer=reply.get("final_answer"),
            output_tail=tail,
            error=error,
            duration_s=float(reply.get("duration_s", time.monotonic() - started)),
            infra="gateway_unreachable" if unreachable else None,
        ), True

    async def _stop_timed_out(self, worker: _WorkerHandle) -> dict[str, Any]:
        """Stop a worker past its deadline; return what it reported on SIGTERM, if anything."""
        await self._discard(worker)
        try:
            last = await asyncio.wait_for(worker.receive(), 1.0)
        except (asyncio.TimeoutError, WorkerError):
            return {}
        return last if last.get("killed") else {}

    async def close(self) -> None:
        """Stop every worker, idle or busy (busy attempts return CANCELLED); idempotent."""
        self._closed = True
        idle = []
        while not self._tokens.empty():
            token = self._tokens.get_nowait()
            if token is not None:
                idle.append(token)
        await asyncio.gather(*(self._discard(w) for w in idle + list(self._busy)))
        for _ in range(self.config.pool_size):  # wake anyone waiting for a worker
            self._tokens.put_nowait(None)
        self._finalizer()
