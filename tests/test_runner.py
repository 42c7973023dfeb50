"""The local runners with real agent processes (small scripts written to tmp_path)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import alive, launch, script
from tether.records import RolloutStatus
from tether.runner import (
    AgentLoadError,
    PoolRunner,
    RunnerConfig,
    RunnerConfigError,
    agent_env,
    make_runner,
)

PY = sys.executable
CONTRACT = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "TETHER_ROLLOUT_ID", "TETHER_TASK"}
CONTRACT |= {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"}


def expected_env_names() -> set[str]:
    """What an agent's environment holds: the contract and the safe base set in the parent."""
    base = {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"}
    return CONTRACT | {"TETHER_REWARD_URL"} | {k for k in base if os.environ.get(k)}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets in the parent that must never reach an agent; LANG set so Python adds nothing."""
    monkeypatch.setenv("TETHER_ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-secret")
    monkeypatch.setenv("LANG", "C.UTF-8")


# --- public face, config, env ------------------------------------------------------------


def test_configs_load_no_runner() -> None:
    """Importing the configs (as a run config does) loads no runner and registers no exit hook."""
    code = textwrap.dedent(
        """
        import atexit, logging, sys
        hooks = atexit._ncallbacks()
        from tether.runner import KubernetesConfig, RayConfig, RunnerConfig
        RunnerConfig(command=["true"])
        loaded = [m for m in ("ray", "kubernetes", "tether.runner._child", "tether.runner._pool",
                              "tether.runner._process", "tether.runner._inprocess") if m in sys.modules]
        assert not loaded, loaded
        assert atexit._ncallbacks() == hooks, "an exit hook was registered"
        from tether.runner import ProcessRunner, make_runner  # still there, on first use
        assert isinstance(make_runner(RunnerConfig(command=["true"])), ProcessRunner)
        """
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mode": "threads", "command": ["x"]}, ["'threads'", "process, pool, inprocess"]),
        ({"mode": "process"}, ["command (None)", "required"]),
        ({"mode": "pool"}, ["entry (None)", "required"]),
        ({"mode": "pool", "entry": "no_colon"}, ["'no_colon'", "module:function"]),
        ({"command": ["x"], "concurrency": 0}, ["concurrency (0)", ">= 1"]),
        ({"command": ["x"], "timeout_s": 0}, ["timeout_s (0)", "> 0"]),
        ({"command": ["x"], "extra_env": {"TETHER_ADMIN_KEY": "k"}}, ["TETHER_ADMIN_KEY"]),
        ({"command": ["x"], "extra_env": {"OPENAI_API_KEY": "k"}}, ["OPENAI_API_KEY"]),
        ({"command": ["x"], "cwd": "/no/such/dir"}, ["'/no/such/dir'", "existing directory"]),
    ],
)
def test_config_errors_name_value_and_rule(kwargs: dict, words: list[str]) -> None:
    with pytest.raises(RunnerConfigError) as info:
        RunnerConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_command_string_is_split() -> None:
    assert RunnerConfig(command="python 'my agent.py'").command == ["python", "my agent.py"]


def test_agent_env_is_exactly_the_contract() -> None:
    parent = {"PATH": "/bin", "HOME": "/h", "TETHER_ADMIN_KEY": "s", "AWS_SECRET_ACCESS_KEY": "s"}
    env = agent_env(launch(3, {"q": "é"}), {"MY_FLAG": "1"}, parent_env=parent)
    assert set(env) == CONTRACT | {"TETHER_REWARD_URL", "PATH", "HOME", "MY_FLAG"}
    assert env["OPENAI_BASE_URL"] == "http://gw/rollouts/r3/v1"
    assert env["OPENAI_API_KEY"] == "tok-3" and env["TETHER_ROLLOUT_ID"] == "r3"
    # the anthropic SDK and Claude Code add /v1 themselves; the same rollout token
    assert env["ANTHROPIC_BASE_URL"] == "http://gw/rollouts/r3"
    assert env["ANTHROPIC_API_KEY"] == "tok-3"
    assert json.loads(env["TETHER_TASK"]) == {"q": "é"}
    no_reward = agent_env(launch(1, reward_url=None), parent_env=parent)
    assert "TETHER_REWARD_URL" not in no_reward


# --- process mode ------------------------------------------------------------------------

ENV_AGENT = """
    import json, os, sys
    print(json.dumps(dict(os.environ)), file=sys.stderr)
    print("thinking...")
    print("answer:", json.loads(os.environ["TETHER_TASK"])["x"] * 2)
    print()
"""


async def test_process_env_and_final_answer(tmp_path: Path, clean_env: None) -> None:
    runner = make_runner(RunnerConfig(command=[PY, script(tmp_path, "a.py", ENV_AGENT)]))
    result = await runner.run(launch(21))
    await runner.close()
    assert result.status is RolloutStatus.SUCCEEDED and result.exit_code == 0
    assert result.final_answer == "answer: 42"
    env = json.loads(result.output_tail.splitlines()[0])
    assert set(env) == expected_env_names()
    assert "TETHER_ADMIN_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["OPENAI_API_KEY"] == "tok-21" and env["TETHER_ROLLOUT_ID"] == "r21"


async def test_process_nonzero_exit_fails(tmp_path: Path) -> None:
    agent = script(tmp_path, "a.py", "import sys\nprint('partial')\nsys.exit(3)\n")
    runner = make_runner(RunnerConfig(command=[PY, agent]))
    result = await runner.run(launch())
    assert result.status is RolloutStatus.FAILED and result.exit_code == 3
    assert "code 3" in (result.error or "") and result.final_answer == "partial"
    missing = make_runner(RunnerConfig(command=["/no/such/agent"]))
    result = await missing.run(launch())
    assert result.status is RolloutStatus.FAILED and "cannot start" in (result.error or "")


STUBBORN_AGENT = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
    print("started", flush=True)
    time.sleep(60)
"""


async def test_process_timeout_kills_whole_group(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    agent = script(tmp_path, "a.py", STUBBORN_AGENT)
    config = RunnerConfig(command=[PY, agent, str(pids_file)], timeout_s=1.5, grace_s=0.5)
    runner = make_runner(config)
    t0 = time.monotonic()
    result = await runner.run(launch())
    elapsed = time.monotonic() - t0
    assert result.status is RolloutStatus.TIMEOUT and "timeout of 1.5s" in (result.error or "")
    assert result.exit_code == -signal.SIGKILL  # it ignored SIGTERM
    assert "started" in result.output_tail
    assert elapsed < 1.5 + 0.5 + 1.5
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


async def test_process_output_flood_is_truncated(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        import sys
        for _ in range(128):
            sys.stdout.write("x" * 65535 + "\\n")
            sys.stderr.write("y" * 1000 + "\\n")
        print("done")
        """,
    )
    runner = make_runner(RunnerConfig(command=[PY, agent], max_output_bytes=4096))
    result = await runner.run(launch())
    assert result.status is RolloutStatus.SUCCEEDED and result.final_answer == "done"
    assert result.output_tail.startswith("[... ") and "bytes truncated" in result.output_tail
    assert len(result.output_tail.encode()) < 4096 + 64


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


async def test_process_concurrency_limit(tmp_path: Path) -> None:
    agent = script(
        tmp_path, "a.py", "import time\nt=time.time()\ntime.sleep(0.4)\nprint(t, time.time())\n"
    )
    runner = make_runner(RunnerConfig(command=[PY, agent], concurrency=2))
    results = await asyncio.gather(*(runner.run(launch(i)) for i in range(6)))
    spans = [tuple(map(float, (r.final_answer or "").split())) for r in results]
    assert max_overlap(spans) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["process", "pool"])
async def test_cancel_and_close_leave_nothing(tmp_path: Path, mode: str) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        import os, sys, time
        def main():
            open(os.environ["PID_DIR"] + "/" + os.environ["TETHER_ROLLOUT_ID"], "w").write(
                str(os.getpid()))
            time.sleep(60)
        if __name__ == "__main__":
            main()
        """,
    )
    extra = {"PID_DIR": str(tmp_path)}
    runner = make_runner(
        RunnerConfig(
            mode=mode, command=[PY, agent], entry=f"{agent}:main", grace_s=0.3, extra_env=extra
        )
    )
    cancelled = asyncio.ensure_future(runner.run(launch(1)))
    closed = asyncio.ensure_future(runner.run(launch(2)))
    while not ((tmp_path / "r1").exists() and (tmp_path / "r2").exists()):
        await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await runner.close()
    assert (await closed).status is RolloutStatus.CANCELLED
    assert (await runner.run(launch(3))).status is RolloutStatus.CANCELLED
    pids = [int((tmp_path / n).read_text()) for n in ("r1", "r2")]
    assert not any(alive(p) for p in pids)
    if isinstance(runner, PoolRunner):
        assert runner.worker_pids == []


@pytest.mark.parametrize("mode", ["process", "pool"])
async def test_children_left_running_are_killed(tmp_path: Path, mode: str) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        import subprocess, sys
        def main():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print(child.pid)
        if __name__ == "__main__":
            main()
        """,
    )
    config = RunnerConfig(mode=mode, command=[PY, agent], entry=f"{agent}:main", workers=1)
    runner = make_runner(config)
    t0 = time.monotonic()
    results = [await runner.run(launch(i)) for i in range(2)]
    await runner.close()
    assert all(r.status is RolloutStatus.SUCCEEDED for r in results)
    assert time.monotonic() - t0 < 4.0  # nobody waits for the orphan to close the pipe
    assert not any(alive(int(r.final_answer or 0)) for r in results)


async def test_process_escaped_child_does_not_hang_the_runner(tmp_path: Path) -> None:
    """A child that leaves the group (setsid) and keeps stdout open cannot stall the rollout."""
    agent = script(
        tmp_path,
        "a.py",
        """
        import os, subprocess, sys, time
        flag = sys.argv[1]
        code = f"import os, time; os.setsid(); open({flag!r}, 'w').close(); time.sleep(30)"
        child = subprocess.Popen([sys.executable, "-c", code])
        while not os.path.exists(flag):
            time.sleep(0.01)
        print(child.pid)
        """,
    )
    flag = str(tmp_path / "escaped")
    runner = make_runner(RunnerConfig(command=[PY, agent, flag], grace_s=0.2))
    t0 = time.monotonic()
    result = await runner.run(launch())
    elapsed = time.monotonic() - t0
    escaped = int(result.final_answer or 0)
    if sys.platform.startswith("linux"):  # followed out of the group (tether is a subreaper)
        assert not alive(escaped)
    else:  # out of the runner's reach elsewhere: documented in tether.runner._reap
        os.kill(escaped, signal.SIGKILL)
    assert result.status is RolloutStatus.SUCCEEDED and elapsed < 5.0


# --- pool mode ---------------------------------------------------------------------------

POOL_AGENT = """
    import json, os, sys, time
    def main():
        task = json.loads(os.environ["TETHER_TASK"])
        print(json.dumps({"pid": os.getpid(), "env": sorted(os.environ), "argv": sys.argv}))
        if task.get("sleep"):
            print("sleeping", flush=True)
            time.sleep(task["sleep"])
        if task.get("raise"):
            raise ValueError("boom")
        if task.get("exit"):
            sys.exit(task["exit"])
        print(task["x"] * 2)
"""


async def test_pool_reuses_few_workers(tmp_path: Path, clean_env: None) -> None:
    script(tmp_path, "pool_agent.py", POOL_AGENT)
    runner = make_runner(
        RunnerConfig(mode="pool", entry="pool_agent:main", workers=2, cwd=str(tmp_path))
    )
    results = await asyncio.gather(*(runner.run(launch(i)) for i in range(10)))
    await runner.close()
    assert [r.final_answer for r in results] == [str(2 * i) for i in range(10)]
    infos = [json.loads(r.output_tail.splitlines()[0]) for r in results]
    pids = {info["pid"] for info in infos}
    assert len(pids) <= 2 and not any(alive(p) for p in pids)
    assert all(set(info["env"]) == expected_env_names() for info in infos)
    assert infos[0]["argv"] == ["pool_agent"]


async def test_pool_timeout_replaces_worker_and_faults_keep_it(tmp_path: Path) -> None:
    agent = script(tmp_path, "pool_agent.py", POOL_AGENT)
    runner = PoolRunner(RunnerConfig(mode="pool", entry=f"{agent}:main", workers=1, grace_s=0.5))
    await runner.start()
    (first,) = runner.worker_pids
    result = await runner.run(launch(0, {"sleep": 30}, timeout_s=1.0))
    assert result.status is RolloutStatus.TIMEOUT and "sleeping" in result.output_tail
    assert not alive(first)
    ok = await runner.run(launch(1))
    assert ok.status is RolloutStatus.SUCCEEDED and ok.final_answer == "2"
    (second,) = runner.worker_pids
    assert second != first
    boom = await runner.run(launch(2, {"raise": True}))
    assert boom.status is RolloutStatus.FAILED and boom.exit_code == 1
    assert boom.error == "ValueError: boom" and "Traceback" in boom.output_tail
    code = await runner.run(launch(3, {"exit": 4}))
    assert code.status is RolloutStatus.FAILED and code.exit_code == 4
    assert runner.worker_pids == [second]  # agent faults do not cost the worker
    await runner.close()


async def test_pool_async_main_and_bad_agent(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "a.py",
        "import asyncio\nasync def main():\n    await asyncio.sleep(0)\n    print('async ok')\n",
    )
    runner = make_runner(RunnerConfig(mode="pool", entry=f"{agent}:main", workers=1))
    assert (await runner.run(launch())).final_answer == "async ok"
    await runner.close()
    broken = script(tmp_path, "broken.py", "raise RuntimeError('bad import')\ndef main(): pass\n")
    runner = make_runner(RunnerConfig(mode="pool", entry=f"{broken}:main", workers=1))
    result = await runner.run(launch())
    assert result.status is RolloutStatus.FAILED and "bad import" in (result.error or "")
    assert isinstance(runner, PoolRunner)
    with pytest.raises(AgentLoadError, match="bad import"):
        await runner.start()
    await runner.close()


INTERRUPTED = """
    import asyncio, os, signal, sys
    from tether.runner import Launch, RunnerConfig, make_runner
    agent, pid_dir = sys.argv[1], sys.argv[2]
    # Ctrl-C as in a terminal, even where a shell started the tests in the background
    # (which starts them with SIGINT ignored, and Python then keeps it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    async def main():
        extra = {"PID_DIR": pid_dir}
        runners = [
            make_runner(RunnerConfig(command=[sys.executable, agent], grace_s=0.2,
                                     extra_env=extra)),
            make_runner(RunnerConfig(mode="pool", entry=agent + ":main", workers=2,
                                     grace_s=0.2, extra_env=extra)),
        ]
        for i, r in enumerate(runners):
            asyncio.ensure_future(r.run(Launch(f"r{i}", 1, "http://gw/v1", "t", {})))
        while len(os.listdir(pid_dir)) < 2:
            await asyncio.sleep(0.05)
        await runners[1].start()  # an idle worker too: only atexit can reach it
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)
    asyncio.run(main())
"""


async def test_keyboard_interrupt_leaves_nothing(tmp_path: Path) -> None:
    agent = script(
        tmp_path,
        "a.py",
        """
        import os, time
        def main():
            path = os.path.join(os.environ["PID_DIR"], os.environ["TETHER_ROLLOUT_ID"])
            open(path, "w").write(str(os.getpid()))
            time.sleep(60)
        if __name__ == "__main__":
            main()
        """,
    )
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    trainer = script(tmp_path, "trainer.py", INTERRUPTED)
    proc = await asyncio.create_subprocess_exec(PY, trainer, agent, str(pid_dir))
    assert await asyncio.wait_for(proc.wait(), 20) != 0
    pids = [int(p.read_text()) for p in pid_dir.iterdir()]
    assert len(pids) == 2
    time.sleep(0.2)
    assert not any(alive(p) for p in pids)
    leftovers = [c for c in psutil.Process().children(recursive=True) if c.pid in pids]
    assert leftovers == []
