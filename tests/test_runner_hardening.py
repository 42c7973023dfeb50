"""Runaway agents, infrastructure faults, attempts and retries (local runner, real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.helpers import ADMIN_KEY, alive, launch, script
from tether.engine.testing import NullEngine
from tether.gateway import Gateway, GatewayConfig, LoopServer, create_app
from tether.records import Phase, RolloutStatus, Task
from tether.run import RetryPolicy, collect_groups
from tether.runner import (
    Attempt,
    AttemptResult,
    Launch,
    RunnerConfig,
    RunnerConfigError,
    make_runner,
)

PY = sys.executable

RUNAWAY = """
    import json, os, signal, sys, time
    kind = json.loads(os.environ["TETHER_TASK"])["kind"]
    marks = os.path.join(os.environ["PID_DIR"], os.environ["TETHER_ROLLOUT_ID"])
    def mark():
        open(f"{marks}-{os.getpid()}", "w").close()
    mark()
    if kind == "stubborn":  # ignores SIGTERM; a double-forked grandchild stays in the group
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            if os.fork() == 0:
                mark()
                time.sleep(60)
            os._exit(0)
        while len([n for n in os.listdir(os.path.dirname(marks))
                   if n.startswith(os.path.basename(marks) + "-")]) < 2:
            time.sleep(0.01)
        print("started", flush=True)
        time.sleep(60)
    elif kind == "flood":
        while True:
            sys.stdout.write("x" * 65536)
    elif kind == "memory":
        blocks = []
        while True:
            blocks.append(bytearray(32 << 20))
    elif kind == "files":
        handles = []
        try:
            while True:
                handles.append(open(os.devnull))
        except OSError:
            print(len(handles))
    elif kind == "crash":
        import no_such_module_anywhere
    elif kind == "self_kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "abort":
        os.abort()
"""

KINDS = ["stubborn", "flood", "memory", "files", "crash", "self_kill", "abort"]


def survivors(pids: set[int], pgids: set[int]) -> list[int]:
    """Live (non-zombie) processes among ``pids`` or in one of the process groups ``pgids``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            in_group = os.getpgid(proc.pid) in pgids
        except ProcessLookupError:
            continue
        if proc.pid in pids or in_group:
            found.append(proc.pid)
    return found


async def test_runaway_agents_end_with_the_right_status_and_leave_nothing(tmp_path: Path) -> None:
    agent = script(tmp_path, "runaway.py", RUNAWAY)
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    config = RunnerConfig(
        command=[PY, agent],
        timeout_s=4.0,  # the agents that end by themselves need ~0.5 s, up to ~3 s on a busy CI
        grace_s=0.3,
        max_output_bytes=4096,
        max_memory_mb=400,
        max_open_files=64,
        concurrency=len(KINDS),
        extra_env={"PID_DIR": str(marks_dir)},
    )
    runner = make_runner(config)
    t0 = time.monotonic()
    results = await asyncio.gather(
        *(runner.run(launch(i, {"kind": kind})) for i, kind in enumerate(KINDS))
    )
    elapsed = time.monotonic() - t0
    by = dict(zip(KINDS, results, strict=True))
    await runner.close()

    assert by["stubborn"].status is RolloutStatus.TIMEOUT and by["stubborn"].infra is None
    assert by["stubborn"].exit_code == -signal.SIGKILL and "started" in by["stubborn"].output_tail
    assert by["flood"].status is RolloutStatus.TIMEOUT
    assert len(by["flood"].output_tail.encode()) < 4096 + 64
    assert by["memory"].status is RolloutStatus.FAILED and by["memory"].infra is None
    assert "MemoryError" in by["memory"].output_tail
    assert by["files"].status is RolloutStatus.SUCCEEDED
    assert int(by["files"].final_answer or 99) < 64
    assert by["crash"].status is RolloutStatus.FAILED and by["crash"].exit_code == 1
    assert "ModuleNotFoundError" in by["crash"].output_tail and by["crash"].infra is None
    assert by["self_kill"].status is RolloutStatus.FAILED and by["self_kill"].infra == "killed"
    assert by["abort"].exit_code == -signal.SIGABRT and by["abort"].infra is None
    assert elapsed < 4.0 + 0.3 + 3.0  # deadline + grace + slack for a shared machine

    marks = [p.name for p in marks_dir.iterdir()]
    pids = {int(name.rsplit("-", 1)[1]) for name in marks}
    assert len([m for m in marks if m.startswith("r0-")]) == 2  # the grandchild was seen
    assert survivors(pids, pids) == []


async def test_missing_command_fails_at_start() -> None:
    runner = make_runner(RunnerConfig(command=["/no/such/agent"]))
    result = await runner.run(launch())
    assert result.status is RolloutStatus.FAILED and "cannot start" in (result.error or "")
    assert result.infra is None


async def test_attempt_handle_cancels_and_kills(tmp_path: Path) -> None:
    agent = script(tmp_path, "a.py", "import os, time\nprint(os.getpid(), flush=True)\n"
                   "time.sleep(60)\n")  # fmt: skip
    runner = make_runner(RunnerConfig(command=[PY, agent], grace_s=0.2))
    attempt = Attempt(runner, launch())
    await asyncio.sleep(0.5)
    assert not attempt.done()
    result = await attempt.cancel()
    assert result.status is RolloutStatus.CANCELLED and attempt.done()
    assert (await attempt.wait()).status is RolloutStatus.CANCELLED
    await runner.close()


async def test_pool_worker_killed_from_outside_is_an_infra_fault(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        import os, time
        def main():
            open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
            time.sleep(60)
        """,
    )
    pid_file = tmp_path / "pid"
    runner = make_runner(
        RunnerConfig(
            mode="pool", entry=f"{agent}:main", workers=1, extra_env={"PID_FILE": str(pid_file)}
        )
    )
    running = asyncio.ensure_future(runner.run(launch()))
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.02)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    result = await asyncio.wait_for(running, 10)
    await runner.close()
    assert result.status is RolloutStatus.FAILED and result.infra == "worker_lost"


async def test_unreachable_gateway_is_an_infra_fault(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        from openai import OpenAI
        OpenAI(max_retries=0).chat.completions.create(model="m", messages=[])
        """,
    )
    runner = make_runner(RunnerConfig(command=[PY, agent]))
    closed = Launch("r0", 1, "http://127.0.0.1:9/rollouts/r0/v1", "tok", {})  # port 9: closed
    result = await runner.run(closed)
    assert result.status is RolloutStatus.FAILED and result.infra == "gateway_unreachable"


def test_retry_policy() -> None:
    def res(status: RolloutStatus, infra: str | None = None, attempt: int = 1) -> AttemptResult:
        return AttemptResult("r", attempt, status, infra=infra)

    policy = RetryPolicy(max_attempts=3)
    assert policy.retries(res(RolloutStatus.FAILED, "killed"))
    assert policy.retries(res(RolloutStatus.FAILED, "evicted", attempt=2))
    assert not policy.retries(res(RolloutStatus.FAILED, "evicted", attempt=3))
    assert not policy.retries(res(RolloutStatus.FAILED))
    assert not policy.retries(res(RolloutStatus.TIMEOUT))
    assert not policy.retries(res(RolloutStatus.CANCELLED, "killed"))
    assert not policy.retries(res(RolloutStatus.SUCCEEDED))
    lenient = RetryPolicy(max_attempts=2, retry_agent_failures=True)
    assert lenient.retries(res(RolloutStatus.TIMEOUT)) and lenient.retries(
        res(RolloutStatus.FAILED)
    )
    assert not lenient.retries(res(RolloutStatus.SUCCEEDED))
    with pytest.raises(ValueError, match="infra"):
        res(RolloutStatus.FAILED, "gremlins")
    with pytest.raises(RunnerConfigError, match="max_attempts"):
        RunnerConfig(command=["x"], max_attempts=0)
    with pytest.raises(RunnerConfigError, match="runner"):
        RunnerConfig(command=["x"], runner="slurm")


SIGTERMED = """
    import asyncio, os, signal, sys
    from tether.runner import Launch, RunnerConfig, make_runner
    agent, pid_file = sys.argv[1], sys.argv[2]
    async def main():
        runner = make_runner(RunnerConfig(command=[sys.executable, agent, pid_file]))
        await runner.run(Launch("r0", 1, "http://gw/v1", "t", {}))
    asyncio.run(main())
"""


async def test_sigterm_to_tether_kills_its_agents(tmp_path: Path) -> None:
    agent = script(tmp_path, "a.py", "import os, sys, time\n"
                   "open(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n")  # fmt: skip
    pid_file = tmp_path / "pid"
    tether_proc = script(tmp_path, "trainer.py", SIGTERMED)
    proc = await asyncio.create_subprocess_exec(PY, tether_proc, agent, str(pid_file))
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGTERM
    pid = int(pid_file.read_text())
    time.sleep(0.2)
    assert not alive(pid)


# --- retries through the real gateway ----------------------------------------------------

KILLED_ONCE = """
    import os, signal
    from pathlib import Path
    from openai import OpenAI
    marker = Path(os.environ["MARKER_DIR"]) / os.environ["TETHER_ROLLOUT_ID"]
    reply = OpenAI().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "2+2"}], max_tokens=4)
    if not marker.exists():  # attempt 1: one call recorded, then the process is killed
        marker.write_text(os.environ["OPENAI_API_KEY"])
        os.kill(os.getpid(), signal.SIGKILL)
    print(reply.choices[0].message.content)
"""


@pytest.fixture
async def served(tokenizer: Any, store: Any) -> AsyncIterator[Gateway]:
    """The real gateway (scripted engine) on a loopback port."""
    engine = NullEngine(token_ids=tokenizer.encode("4", add_special_tokens=False))
    gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY, port=0))
    server = await LoopServer(create_app(gw)).start()
    gw.config.public_url = server.url
    yield gw
    await server.stop()


async def test_killed_attempt_is_retried_and_its_late_write_refused(
    tmp_path: Path, served: Gateway
) -> None:
    gw = served
    agent = script(tmp_path, "agent.py", KILLED_ONCE)
    runner = make_runner(
        RunnerConfig(command=[PY, agent], max_attempts=3, extra_env={"MARKER_DIR": str(tmp_path)})
    )
    run = gw.store.create_run({}, run_id="run1")
    collected = await collect_groups(
        gw,
        runner,
        [Task("t0", {"q": "2+2"})],
        2,
        grader=lambda t, a: 1.0,
        run_id=run.id,
        phase=Phase.TRAIN,
        step=0,
    )
    await runner.close()
    assert len(collected.outcomes) == 2  # one outcome per rollout, none lost or doubled
    for outcome in collected.outcomes:
        assert outcome.status is RolloutStatus.SUCCEEDED and outcome.attempt == 2
        assert [c.attempt for c in outcome.calls] == [2]  # only the final attempt's calls
        assert len(gw.store.calls(outcome.rollout_id, attempt=1)) == 1  # kept, not trained on
        rollout = gw.store.get_rollout(outcome.rollout_id)
        assert rollout is not None and rollout.attempt == 2 and rollout.reward == 1.0

    rid = collected.outcomes[0].rollout_id
    old_token = (tmp_path / rid).read_text()
    async with httpx.AsyncClient(base_url=gw.config.base_url) as http:
        late = await http.post(
            f"/rollouts/{rid}/v1/chat/completions",
            headers={"Authorization": f"Bearer {old_token}"},
            json={"model": "policy", "messages": [{"role": "user", "content": "late"}]},
        )
        wrong = await http.post(
            f"/rollouts/{rid}/v1/chat/completions",
            headers={"Authorization": "Bearer tr-not-a-token"},
            json={"model": "policy", "messages": [{"role": "user", "content": "x"}]},
        )
    assert late.status_code == 409 and "earlier attempt" in late.text
    assert wrong.status_code == 401
    assert len(gw.store.calls(rid, attempt=1)) == 1 and len(gw.store.calls(rid, attempt=2)) == 1


async def test_agent_failures_are_not_retried_unless_configured(
    tmp_path: Path, served: Gateway
) -> None:
    gw = served
    agent = script(
        tmp_path, "agent.py", "import sys\nsys.stderr.write('no luck\\n')\nsys.exit(3)\n"
    )
    run = gw.store.create_run({}, run_id="run2")
    for retry_agent_failures, attempts in ((False, 1), (True, 2)):
        runner = make_runner(
            RunnerConfig(
                command=[PY, agent], max_attempts=2, retry_agent_failures=retry_agent_failures
            )
        )
        collected = await collect_groups(
            gw,
            runner,
            [Task("t0", {})],
            2,
            grader=None,
            run_id=run.id,
            phase=Phase.TRAIN,
            step=attempts,
        )
        assert [o.attempt for o in collected.outcomes] == [attempts, attempts]
        assert all(o.status is RolloutStatus.FAILED for o in collected.outcomes)
        ends = gw.store.attempts(collected.outcomes[0].rollout_id)  # every attempt, kept
        assert [(a.attempt, a.status, a.exit_code) for a in ends] == [
            (i, RolloutStatus.FAILED, 3) for i in range(1, attempts + 1)
        ]
        assert all(a.output_tail == "no luck\n" for a in ends)
        assert ("; retried" in (ends[0].error or "")) == (attempts == 2)
