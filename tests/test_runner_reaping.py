"""Nothing an attempt started outlives it (even processes that left its group), and a
cancelled caller sees its cancellation. Real agent processes, written to tmp_path."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tether.records import RolloutStatus
from tether.runner import Attempt, Launch, RunnerConfig, make_runner

PY = sys.executable
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="a process that calls setsid() can only be followed where tether can be a subreaper",
)

# The agent (a command, or a pool main()) marks every process it starts in PID_DIR.
# escape: a child calls setsid() (leaving the agent's process group and session) and
#   forks a grandchild that sleeps; the child exits at once (the grandchild is orphaned)
#   or stays ("orphan": false); the agent exits 0 once both are up, or sleeps ("hang").
# stubborn: the agent ignores SIGTERM and forks a child that also ignores it and calls setsid().
AGENT = """
import json, os, signal, sys, time
pid_dir = os.environ["PID_DIR"]

def mark():
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()

def wait_marks(n):
    while len(os.listdir(pid_dir)) < n:
        time.sleep(0.01)

def main():
    task = json.loads(os.environ["TETHER_TASK"])
    kind = task["kind"]
    mark()
    if kind == "escape":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                mark()
                time.sleep(60)
                os._exit(0)
            mark()
            if task.get("orphan", True):
                os._exit(0)
            time.sleep(60)
            os._exit(0)
        wait_marks(3)
    elif kind == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.setsid()
            mark()
            time.sleep(60)
            os._exit(0)
        wait_marks(2)
    if task.get("hang"):
        time.sleep(60)
    print("done", flush=True)

if __name__ == "__main__":
    main()
"""


def launch(i: int, kind: str, timeout_s: float | None = None, **task: bool) -> Launch:
    url = f"http://gw/rollouts/r{i}/v1"
    return Launch(f"r{i}", 1, url, f"tok-{i}", {"kind": kind, **task}, timeout_s=timeout_s)


def runner_for(tmp_path: Path, mode: str, name: str = "pids") -> tuple[Any, Path]:
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(AGENT))
    pid_dir = tmp_path / name
    pid_dir.mkdir()
    config = RunnerConfig(
        mode=mode,
        command=[PY, str(agent)],
        entry=f"{agent}:main",
        grace_s=0.3,
        timeout_s=20,
        extra_env={"PID_DIR": str(pid_dir)},
    )
    return make_runner(config), pid_dir


def marked(pid_dir: Path) -> list[int]:
    return [int(p.name) for p in pid_dir.iterdir()]


def first_marked(pid_dir: Path) -> int:
    """The agent itself (or its pool worker): the oldest marked process."""
    return min(marked(pid_dir), key=lambda pid: psutil.Process(pid).create_time())


def running(pids: list[int]) -> list[int]:
    """The pids still running (zombies count as ended)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def our_zombies() -> list[int]:
    """Zombie children of this process: what a subreaper must still wait for."""
    return [p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]


@linux_only
@pytest.mark.parametrize(
    ("mode", "task", "status"),
    [
        ("process", {"kind": "escape"}, RolloutStatus.SUCCEEDED),
        ("process", {"kind": "escape", "orphan": False}, RolloutStatus.SUCCEEDED),
        ("process", {"kind": "escape", "orphan": False, "hang": True}, RolloutStatus.TIMEOUT),
        ("process", {"kind": "stubborn", "hang": True}, RolloutStatus.TIMEOUT),
        ("pool", {"kind": "escape"}, RolloutStatus.SUCCEEDED),
        ("pool", {"kind": "escape", "orphan": False}, RolloutStatus.SUCCEEDED),
        ("pool", {"kind": "stubborn", "hang": True}, RolloutStatus.TIMEOUT),
    ],
)
async def test_processes_that_left_the_group_end_with_the_attempt(
    tmp_path: Path, mode: str, task: dict[str, Any], status: RolloutStatus
) -> None:
    runner, pid_dir = runner_for(tmp_path, mode)
    timeout = 1.5 if status is RolloutStatus.TIMEOUT else None
    try:
        result = await runner.run(launch(0, timeout_s=timeout, **task))
        assert result.status is status, result
        pids = marked(pid_dir)
        assert len(pids) == (3 if task["kind"] == "escape" else 2)
        warm = set(runner.worker_pids) if mode == "pool" else set()  # a pool worker stays
        assert running([p for p in pids if p not in warm]) == [], (
            "the attempt's processes outlived it"
        )
        assert len(warm & set(pids)) == (status is RolloutStatus.SUCCEEDED and mode == "pool")
        assert not set(pids) & set(our_zombies()), "killed processes were not reaped"
    finally:
        await runner.close()
    assert running(marked(pid_dir)) == []


@linux_only
async def test_ending_attempt_leaves_another_attempts_processes_alone(tmp_path: Path) -> None:
    """Ending one attempt kills its own escaped processes, not those of one still running."""
    runner, pid_dir = runner_for(tmp_path, "process")
    other_runner, other_dir = runner_for(tmp_path, "process", "other")
    other = asyncio.ensure_future(other_runner.run(launch(1, "escape", hang=True)))
    try:
        while len(os.listdir(other_dir)) < 3:
            await asyncio.sleep(0.02)
        result = await runner.run(launch(0, "escape", timeout_s=1.0, hang=True))
        assert result.status is RolloutStatus.TIMEOUT
        assert running(marked(pid_dir)) == []
        # the other agent and its grandchild (orphaned, so adopted by tether) run on
        assert len(running(marked(other_dir))) == 2
    finally:
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        await other_runner.close()
        await runner.close()
    assert running(marked(other_dir)) == []


@pytest.mark.parametrize("mode", ["process", "pool"])
async def test_cancelled_run_raises_after_its_agent_is_gone(tmp_path: Path, mode: str) -> None:
    """Cancelled twice (the second during the SIGTERM grace), run() still raises CancelledError,
    once the agent that ignores SIGTERM has been killed; the runner stays usable."""
    runner, pid_dir = runner_for(tmp_path, mode)
    task = asyncio.ensure_future(runner.run(launch(0, "stubborn", hang=True)))
    try:
        while len(os.listdir(pid_dir)) < 2:
            await asyncio.sleep(0.02)
        agent = first_marked(pid_dir)
        task.cancel()
        await asyncio.sleep(0.1)  # in the grace period: the agent ignores SIGTERM
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert running([agent]) == []
        assert (await runner.run(launch(1, "plain"))).status is RolloutStatus.SUCCEEDED
    finally:
        await runner.close()


async def test_cancelled_caller_of_attempt_cancel_sees_cancelled_error(tmp_path: Path) -> None:
    """A task awaiting ``Attempt.cancel()`` that is cancelled itself raises CancelledError,
    after the cleanup has ended (it used to get the attempt's result instead)."""
    runner, pid_dir = runner_for(tmp_path, "process")
    attempt = Attempt(runner, launch(0, "stubborn", hang=True))
    try:
        while len(os.listdir(pid_dir)) < 2:
            await asyncio.sleep(0.02)
        agent = first_marked(pid_dir)
        canceller = asyncio.ensure_future(attempt.cancel())
        await asyncio.sleep(0.1)  # the agent ignores SIGTERM: the cleanup is in its grace period
        canceller.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await canceller
        assert running([agent]) == [], "CancelledError came before the cleanup ended"
        assert time.monotonic() - started < 5
        assert (await attempt.wait()).status is RolloutStatus.CANCELLED
    finally:
        await runner.close()
