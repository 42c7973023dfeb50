"""Ctrl-C and SIGTERM stop ``tether train`` cleanly: a real CLI process, real agents, real signals.

Each case waits for the INFO line a phase logs when it begins (eval, rollouts,
the policy update), sends the signal, and checks the exit status, the time it
took, the one-line message, and that every process the run started (pool
workers, process agents and their children, recorded while it ran) is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tether.store import Store

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calc/config.yaml"
EXIT_WITHIN_S = 10.0

STUBBORN_AGENT = """\
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it (and its child)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
time.sleep(120)
"""

VARIED_GRADER = """\
import random
def grade(task, answer):
    return random.random()  # rewards that differ within a group: every step updates
"""


class TrainProcess:
    """``tether train`` in a subprocess; its stderr lines and its process tree, as they come."""

    def __init__(self, tmp_path: Path, starter_dir: Path, *overrides: str) -> None:
        argv = [
            sys.executable,
            "-m",
            "tether.cli",
            "train",
            str(CONFIG),
            f"dir={tmp_path}",
            f"model.path={starter_dir}",
            "gateway.port=0",
            "tasks.train_size=20",
            "tasks.val_size=4",
            "rollout.n=2",
            "rollout.batch_groups=2",
            "trainer.steps=3",
            "eval.tasks=2",
            "eval.samples=2",
            "eval.greedy=false",
            "checkpoint.every=1",
            "gateway.default_max_tokens=24",
            "agent.concurrency=2",
            *overrides,
            "--log-level",
            "info",
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.ps = psutil.Process(self.proc.pid)
        self.seen: dict[int, psutil.Process] = {}
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def record_children(self) -> int:
        """Remember every descendant running now; return how many run now."""
        try:
            children = self.ps.children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        for child in children:
            self.seen.setdefault(child.pid, child)
        return len(children)

    def wait_for(self, needle: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.record_children()
            try:
                if needle in self.lines.get(timeout=0.05):
                    return
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.stderr)[-3000:]
        raise AssertionError(f"no {needle!r} in time:\n" + "".join(self.stderr)[-3000:])

    def wait_for_children(self, n: int = 1, timeout: float = 30) -> None:
        """Wait until ``n`` descendants (agents, workers, their children) run at once."""
        deadline = time.monotonic() + timeout
        while self.record_children() < n:
            assert time.monotonic() < deadline, "the run started no agent process"
            time.sleep(0.05)

    def send(self, sig: int = signal.SIGINT) -> float:
        """Send ``sig``; return the seconds until the process exited."""
        self.record_children()
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=EXIT_WITHIN_S + 20)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError("still running 30 s after the signal") from None
        elapsed = time.monotonic() - t0
        self._reader.join(timeout=5)
        return elapsed

    def leftovers(self) -> list[psutil.Process]:
        """Recorded descendants still alive (zombies count as gone: nothing runs)."""
        deadline = time.monotonic() + 2  # SIGKILL is not instantaneous
        while True:
            alive = []
            for p in self.seen.values():
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p)
                except psutil.NoSuchProcess:
                    pass
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.05)

    def kill_all(self) -> None:
        for p in [*self.seen.values(), self.ps]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

    @property
    def text(self) -> str:
        return "".join(self.stderr)


@pytest.fixture
def train(tmp_path: Path, starter_dir: Path):
    started: list[TrainProcess] = []

    def start(*overrides: str) -> TrainProcess:
        run = TrainProcess(tmp_path, starter_dir, *overrides)
        started.append(run)
        return run

    yield start
    for run in started:  # a failed assertion must not leave a run behind
        run.kill_all()


def _process_mode(agent: str = "examples/calc/agent.py") -> list[str]:
    return ["agent.mode=process", f"agent.command={sys.executable} {agent}"]


def _assert_stopped_cleanly(run: TrainProcess, elapsed: float, code: int, line: str) -> None:
    out = run.text
    assert run.proc.returncode == code, out[-3000:]
    assert elapsed < EXIT_WITHIN_S, f"took {elapsed:.1f} s"
    assert line in out, out[-3000:]
    assert out.count("interrupted at step") == 1
    assert "retrying" not in out and "Traceback" not in out, out[-3000:]
    assert run.leftovers() == [], "processes left behind"


def _report(phase: str, elapsed: float) -> None:
    print(f"{phase}: exited {elapsed:.2f} s after the signal")


def test_ctrl_c_during_eval_in_pool_mode(train) -> None:
    """Stopped before its first checkpoint: nothing to resume, so the message offers the same
    command again, not ``--resume``; ``--resume`` says so, and the same command starts the run
    afresh (the name is not held)."""
    run = train()
    run.wait_for("eval @ step 0")
    run.wait_for_children()  # the pool's workers
    elapsed = run.send(signal.SIGINT)
    _report("eval (pool)", elapsed)
    _assert_stopped_cleanly(
        run,
        elapsed,
        130,
        f"interrupted at step 0; last checkpoint: none; start it again with: tether train {CONFIG} ",
    )
    assert "--resume" not in run.text, run.text[-2000:]

    resumed = train("--resume")
    resumed.proc.wait(timeout=120)
    out = resumed.text
    assert resumed.proc.returncode == 2, out[-3000:]
    assert (
        "cannot resume run 'calc': no checkpoint in " in out and "drop --resume to start it" in out
    )
    assert "name=calc-2" not in out

    again = train()  # the same command: not refused as "already exists"
    again.wait_for("eval @ step 0")
    again.send(signal.SIGINT)
    assert again.proc.returncode == 130, again.text[-3000:]
    assert "already exists" not in again.text


@pytest.mark.slow
def test_ctrl_c_during_rollouts_in_process_mode(train, tmp_path: Path) -> None:
    run = train(*_process_mode())
    run.wait_for("step 2: rollouts")
    run.wait_for_children()  # this step's agents (the eval's have exited)
    elapsed = run.send(signal.SIGINT)
    _report("rollouts (process)", elapsed)
    ckpt = tmp_path / "calc" / "checkpoints" / "step-000001"
    # step 2 was running; the checkpoint is step 1's
    _assert_stopped_cleanly(run, elapsed, 130, f"interrupted at step 2; last checkpoint: {ckpt};")
    assert (ckpt / "model").is_dir()
    store = Store(tmp_path / "calc" / "traces.sqlite")
    try:  # the interrupted step's rollouts are ended as cancelled, none is left "running"
        assert store.list_rollouts(status="running") == []
        assert store.list_rollouts(status="cancelled")
    finally:
        store.close()


@pytest.mark.slow
def test_ctrl_c_during_the_update_in_pool_mode(train, tmp_path: Path) -> None:
    grader = tmp_path / "varied_grader.py"
    grader.write_text(VARIED_GRADER)
    # Many optimizer steps: the update runs for many seconds on its thread unless stopped.
    run = train(f"rollout.grader={grader}:grade", "trainer.updates_per_batch=200")
    run.wait_for("updating the policy")
    time.sleep(0.3)
    elapsed = run.send(signal.SIGINT)
    _report("update (pool)", elapsed)
    _assert_stopped_cleanly(run, elapsed, 130, "interrupted at step 1; last checkpoint: none;")
    assert run.seen, "the pool's workers were never seen"


@pytest.mark.slow
def test_sigterm_during_eval_in_process_mode_exits_143(train) -> None:
    run = train(*_process_mode())
    run.wait_for("eval @ step 0")
    run.wait_for_children()
    elapsed = run.send(signal.SIGTERM)
    _report("eval (process, SIGTERM)", elapsed)
    _assert_stopped_cleanly(run, elapsed, 143, "interrupted at step 0; last checkpoint: none;")


@pytest.mark.slow
def test_second_ctrl_c_exits_at_once_and_kills_agents_that_ignore_sigterm(
    train, tmp_path: Path
) -> None:
    agent = tmp_path / "stubborn.py"
    agent.write_text(STUBBORN_AGENT)
    run = train(*_process_mode(str(agent)), "agent.grace_s=60")
    run.wait_for("eval @ step 0")
    run.wait_for_children(4)  # two agents, each with its child
    run.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert run.proc.poll() is None  # the clean stop waits for the agents' grace_s
    elapsed = run.send(signal.SIGINT)
    _report("second Ctrl-C", elapsed)
    _assert_stopped_cleanly(run, elapsed, 130, "interrupted at step 0; last checkpoint: none;")
    assert elapsed < 3.0


@pytest.mark.slow
def test_one_ctrl_c_is_bounded_even_when_agents_ignore_sigterm(train, tmp_path: Path) -> None:
    from tether.cli._interrupt import SHUTDOWN_GRACE_S

    agent = tmp_path / "stubborn.py"
    agent.write_text(STUBBORN_AGENT)
    run = train(*_process_mode(str(agent)), "agent.grace_s=60")
    run.wait_for("eval @ step 0")
    run.wait_for_children(4)
    elapsed = run.send(signal.SIGINT)
    _report("agents ignoring SIGTERM", elapsed)
    _assert_stopped_cleanly(run, elapsed, 130, "interrupted at step 0; last checkpoint: none;")
    assert elapsed >= SHUTDOWN_GRACE_S - 0.5  # it did wait for a clean stop first


def test_the_training_gateway_leaves_signal_handlers_alone() -> None:
    """uvicorn's ``serve()`` installs its own SIGINT/SIGTERM handlers; LoopServer's must not."""
    from fastapi import FastAPI

    from tether.gateway import LoopServer

    def mine(signum: int, frame: object) -> None:
        pass

    async def serve() -> list[object]:
        server = await LoopServer(FastAPI()).start()
        try:
            await asyncio.sleep(0.05)
            return [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
        finally:
            await server.stop()

    before = [signal.signal(s, mine) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        assert asyncio.run(serve()) == [mine, mine]
    finally:
        for s, handler in zip((signal.SIGINT, signal.SIGTERM), before, strict=True):
            signal.signal(s, handler)
