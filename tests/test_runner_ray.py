"""The Ray runner against a real local Ray instance (CPU only, one per module)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ADMIN_KEY
from tether.configio import build
from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.gateway import Gateway, GatewayConfig, LoopServer, create_app
from tether.records import Phase, RolloutStatus, Task
from tether.run import collect_groups
from tether.runner import Launch, RunnerConfig, RunnerConfigError, make_runner

ray = pytest.importorskip("ray")

PY = sys.executable

AGENT = """
    import os, time
    from pathlib import Path

    async def agent(task, client):
        marker = Path(task["marker_dir"]) / os.environ.get("TETHER_ROLLOUT_ID", task["id"])
        if task.get("die_once") and not marker.exists():
            marker.write_text(str(os.getpid()))  # the Ray worker's pid: the test kills it
            time.sleep(60)
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["q"]}], max_tokens=4
        )
        return {"answer": reply.choices[0].message.content, "reward": 1.0}
"""

COMMAND = """
    import json, os
    from openai import OpenAI
    task = json.loads(os.environ["TETHER_TASK"])
    reply = OpenAI().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["q"]}], max_tokens=4)
    print(os.getppid(), reply.choices[0].message.content)
"""


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
async def served(tokenizer: Any, store: Any) -> AsyncIterator[Gateway]:
    engine = NullEngine(token_ids=tokenizer.encode("4", add_special_tokens=False))
    gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY, port=0))
    server = await LoopServer(create_app(gw)).start()
    gw.config.public_url = server.url
    yield gw
    await server.stop()


def write(tmp_path: Path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def test_config_errors() -> None:
    with pytest.raises(RunnerConfigError, match=r"mode \('pool'\) does not apply"):
        RunnerConfig(runner="ray", mode="pool", entry="m:f")
    with pytest.raises(UserError, match=r"ray: num_cpus \(0.0\) must be a number > 0"):
        build(RunnerConfig, {"runner": "ray", "command": "x", "ray": {"num_cpus": 0}})
    cfg = build(RunnerConfig, {"runner": "ray", "command": "a", "ray": {"resources": {"tpu": 1}}})
    assert cfg.ray.resources == {"tpu": 1}


async def test_async_agent_and_command_run_as_ray_tasks(
    local_ray: None, served: Gateway, tmp_path: Path
) -> None:
    gw = served
    run = gw.store.create_run({}, run_id="ray1")
    agent = write(tmp_path, "agent.py", AGENT)
    runner = make_runner(
        RunnerConfig(runner="ray", mode="inprocess", entry=f"{agent}:agent", max_attempts=2)
    )
    task = Task("t0", {"id": "t0", "q": "2+2", "marker_dir": str(tmp_path)})
    collected = await collect_groups(
        gw, runner, [task], 2, grader=None, run_id=run.id, phase=Phase.TRAIN, step=0
    )
    assert [o.status for o in collected.outcomes] == [RolloutStatus.SUCCEEDED] * 2
    assert all(o.reward == 1.0 and o.attempt == 1 and len(o.calls) == 1 for o in collected.outcomes)
    await runner.close()

    command = write(tmp_path, "command.py", COMMAND)
    runner = make_runner(RunnerConfig(runner="ray", command=[PY, command]))
    rid = "ray-command-0"
    opened = gw.open_rollout({"q": "1+3"}, rollout_id=rid, run_id=run.id)
    result = await runner.run(
        Launch(rid, opened.attempt, opened.base_url, opened.token, {"q": "1+3"})
    )
    await runner.close()
    assert result.status is RolloutStatus.SUCCEEDED, result.output_tail
    parent_pid, answer = (result.final_answer or "").split(" ", 1)
    assert int(parent_pid) != os.getpid() and answer == "4"  # a Ray worker's child, not ours
    assert len(gw.store.calls(rid)) == 1


async def test_killed_ray_worker_is_retried_not_lost_or_doubled(
    local_ray: None, served: Gateway, tmp_path: Path
) -> None:
    gw = served
    run = gw.store.create_run({}, run_id="ray2")
    agent = write(tmp_path, "agent.py", AGENT)
    runner = make_runner(
        RunnerConfig(runner="ray", mode="inprocess", entry=f"{agent}:agent", max_attempts=2)
    )
    task = Task("t1", {"id": "t1", "q": "3+1", "marker_dir": str(tmp_path), "die_once": True})
    collecting = asyncio.ensure_future(
        collect_groups(gw, runner, [task], 1, grader=None, run_id=run.id, phase=Phase.TRAIN, step=1)
    )
    marker = tmp_path / "t1"
    while not (marker.exists() and marker.read_text()):
        assert not collecting.done()
        await asyncio.sleep(0.1)
    worker_pid = int(marker.read_text())
    assert worker_pid != os.getpid()
    os.kill(worker_pid, signal.SIGKILL)
    collected = await asyncio.wait_for(collecting, 60)
    await runner.close()
    (outcome,) = collected.outcomes
    assert outcome.status is RolloutStatus.SUCCEEDED and outcome.attempt == 2
    assert [c.attempt for c in outcome.calls] == [2] and outcome.reward == 1.0
    rollout = gw.store.get_rollout(outcome.rollout_id)
    assert rollout is not None and rollout.attempt == 2
    assert gw.store.calls(outcome.rollout_id, attempt=1) == []


def test_one_training_step_with_rollouts_as_ray_tasks(
    local_ray: None, starter_dir: Path, tmp_path: Path
) -> None:
    """A short training run whose rollouts are Ray tasks: the packaged calc agent, the
    starter model behind the real gateway, one GRPO update on what the Ray workers did."""
    from tests.helpers import alternating_grader  # noqa: F401 (the grader spec below)
    from tether.run import (
        CheckpointConfig,
        EvalConfig,
        RolloutConfig,
        TasksConfig,
        TrainConfig,
        TrainerConfig,
        TrainingRun,
    )

    agent = build(
        RunnerConfig,
        {
            "runner": "ray",
            "mode": "inprocess",
            "entry": "tether.starter.calc:agent",
            "concurrency": 4,
            "timeout_s": 120,
            "ray": {"num_cpus": 0.25},
        },
    )
    cfg = TrainConfig(
        name="ray-train",
        dir=str(tmp_path),
        tasks=TasksConfig(source="calc", train_size=20, val_size=2),
        agent=agent,
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=1, lr=1e-3),
        eval=EvalConfig(every=0, tasks=1, samples=2, greedy=False),
        checkpoint=CheckpointConfig(every=0),
    )
    cfg.gateway.default_max_tokens = 24

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    run = asyncio.run(go())
    [step] = run.history
    assert step.metrics["rollouts"] == 4 and step.metrics["groups_dropped"] == 0
    assert run.engine.policy_version == 1  # the update ran on the Ray workers' rollouts
    from tether.store import Store

    rid = run.run_record.id
    with Store(tmp_path / "ray-train" / "traces.sqlite") as store:
        rollouts = [r for g in (0, 1) for r in store.list_rollouts(group_id=f"{rid}-s1-g{g}")]
        assert len(rollouts) == 4
        assert all(r.status is RolloutStatus.SUCCEEDED and r.attempt == 1 for r in rollouts)
        calls = [c for r in rollouts for c in store.calls(r.id)]
    assert calls and all(len(c.logprobs) == len(c.completion_ids) > 0 for c in calls)
