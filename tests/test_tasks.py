"""The example tasks wordmath, search and coding through the real gateway.

Two kinds of run per task:

- the agent program's ``main()`` against a gateway on a loopback port whose
  engine plays a script (tool calls that solve the task, then the answer), so
  the agent's tool loop, the gateway's tool-call parsing and the grader are
  checked end to end with a reward of 1.0;
- a 1-step training run from the task's own ``config.yaml`` (made small by
  overrides) with the starter model and the agent in warm pool workers. The
  untrained starter model fails these tasks, so the test grader adds 0 or 1
  in turn to the real grade: every group then has reward variance and the
  update happens; the real part of each reward is checked separately.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tether.configio import load_config
from tether.engine.testing import ScriptedEngine
from tether.gateway import BackgroundServer, create_app
from tether.records import AttemptEnd, RewardSource, RolloutStatus
from tether.run import TrainConfig, TrainingRun
from tether.store import Store

from .test_tasks_units import EXAMPLES, load, read_jsonl

TASKS = ("wordmath", "search", "coding")


def tool_call(name: str, **arguments: Any) -> str:
    """A model turn calling ``name``, as the Hermes/Qwen template writes it."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{call}\n</tool_call>"


def first(task: str, split: str = "train", **match: Any) -> dict[str, Any]:
    for t in read_jsonl(EXAMPLES / task / "tasks.jsonl"):
        if t["split"] == split and all(t.get(k) == v for k, v in match.items()):
            return t
    raise LookupError(match)


def wordmath_script() -> tuple[dict[str, Any], list[str], str]:
    task = first("wordmath", id="wordmath-train-change-0")  # 50 - 5 * 8
    turns = [
        tool_call("calculator", expression="5 * 8"),
        tool_call("calculator", expression="50 - 40"),
        "The answer is 10.",
    ]
    return task, turns, "<tool_response>\n10\n</tool_response>"


def search_script() -> tuple[dict[str, Any], list[str], str]:
    """A two-hop question: who was born where, then that town's festival month."""
    tasks = read_jsonl(EXAMPLES / "search" / "tasks.jsonl")
    task = next(t for t in tasks if len(t["docs"]) == 2 and "month" in t["question"])
    docs = {d["id"]: d for d in read_jsonl(EXAMPLES / "search" / "docs.jsonl")}
    person, town = (docs[d]["title"] for d in task["docs"])
    turns = [
        tool_call("search", query=person),
        tool_call("search", query=f"{town} festival"),
        f"The answer is {task['answers'][0]}.",
    ]
    return task, turns, f"[{task['docs'][1]}] {town}: "


def coding_script() -> tuple[dict[str, Any], list[str], str]:
    task = first("coding", repo="intervals")
    fix = (EXAMPLES / "coding" / "repos" / "intervals" / "solution" / "intervals.py").read_text()
    turns = [
        tool_call("read_file", path="intervals.py"),
        tool_call("write_file", path="intervals.py", content=fix),
        tool_call("run_tests"),
        "merge() now sorts the intervals first.",
    ]
    return task, turns, "2 of 2 tests passed"


SCRIPTS = {"wordmath": wordmath_script, "search": search_script, "coding": coding_script}


@pytest.mark.parametrize("task_name", TASKS)
def test_agent_solves_a_task_through_the_gateway(
    task_name: str,
    make_gateway: Any,
    tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task, turns, last_tool_result = SCRIPTS[task_name]()
    engine = ScriptedEngine(turns, tokenizer=tokenizer)
    gw = make_gateway(engine)
    server = BackgroundServer(create_app(gw)).start()
    try:
        gw.config.public_url = server.url
        opened = gw.open_rollout(task, rollout_id=f"r-{task_name}", task_id=task["id"])
        monkeypatch.setenv("OPENAI_BASE_URL", opened.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", opened.token)
        monkeypatch.setenv("TETHER_TASK", json.dumps(task))
        monkeypatch.setenv("AGENT_MAX_TOKENS", "300")  # the starter model's context is 2048
        load(task_name, "agent").main()  # what a pool worker runs per rollout
    finally:
        server.stop()
    answer = capsys.readouterr().out.strip().splitlines()[-1]
    reward = real_reward(task_name, task, answer)
    assert reward == 1.0, answer
    rollout = gw.finish_rollout(
        AttemptEnd(opened.rollout_id, opened.attempt, RolloutStatus.SUCCEEDED),
        reward=reward,
        source=RewardSource.GRADER,
        final_answer=answer,
    )
    assert rollout.reward == 1.0 and rollout.usable
    calls = gw.store.calls(opened.rollout_id)
    assert len(calls) == len(turns)
    engine.assert_exhausted()  # the agent made every scripted call
    for call, turn in zip(calls[:-1], turns, strict=False):
        (parsed,) = call.response["tool_calls"]  # the model's text, parsed into OpenAI form
        wanted = json.loads(turn.split("\n")[1])
        assert parsed["function"]["name"] == wanted["name"]
        assert json.loads(parsed["function"]["arguments"]) == wanted["arguments"]
        assert call.finish_reason == "tool_calls"
        assert len(call.logprobs) == len(call.completion_ids) > 0
    assert calls[-1].finish_reason == "stop"
    assert last_tool_result in tokenizer.decode(calls[-1].prompt_ids)  # the tool's output
    if task_name == "coding":
        assert json.loads(answer)["files"].keys() == {"intervals.py"}


# --------------------------------------------------------- 1-step training runs

GRADED: list[dict[str, Any]] = []


def real_reward(task_name: str, task: dict[str, Any], answer: str | None) -> float:
    """The example grader's reward (coding's grader returns {"reward", "success"})."""
    graded = load(task_name, "grader").grade(task, answer)
    return graded["reward"] if isinstance(graded, dict) else graded


def _spread(task_name: str, task: dict[str, Any], answer: str | None) -> float:
    """The task's real grade plus 0 or 1 in turn (so each group of 2 has variance)."""
    real = real_reward(task_name, task, answer)
    GRADED.append({"task": task["id"], "answer": answer, "real": real})
    return real + (len(GRADED) % 2)


def wordmath_grader(task: dict[str, Any], answer: str | None) -> float:
    return _spread("wordmath", task, answer)


def search_grader(task: dict[str, Any], answer: str | None) -> float:
    return _spread("search", task, answer)


def coding_grader(task: dict[str, Any], answer: str | None) -> float:
    return _spread("coding", task, answer)


@pytest.mark.parametrize("task", TASKS)
def test_one_training_step(task: str, starter_dir: Path, tmp_path: Path) -> None:
    folder = EXAMPLES / task
    cfg = load_config(
        TrainConfig,
        folder / "config.yaml",
        [
            f"dir={tmp_path}",
            f"tasks.source={folder / 'tasks.jsonl'}",
            f"agent.entry={folder / 'agent.py'}:main",
            "agent.concurrency=2",
            "agent.workers=2",
            f"rollout.grader=tests.test_tasks:{task}_grader",
            "rollout.n=2",
            "rollout.batch_groups=1",
            "trainer.steps=1",
            "eval.tasks=1",
            "eval.samples=2",
            "eval.greedy=false",
            "checkpoint.every=0",
        ],
    )
    cfg.agent.extra_env = {"AGENT_MAX_TOKENS": "24"}  # the untrained model rambles to the cap
    GRADED.clear()

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    run = asyncio.run(go())
    (step,) = run.history
    assert step.metrics["rollouts"] == 2 and math.isfinite(step.metrics["loss"])
    assert run.engine.policy_version == 1  # one update reached the engine
    assert len(GRADED) == 6  # eval 2 + train 2 + eval 2, every one graded
    agent = load(task, "agent")
    tools = [t["function"]["name"] for t in agent_tools(agent)]
    with Store(tmp_path / cfg.name / "traces.sqlite") as store:
        rollouts = store.list_rollouts(group_id=f"{run.run_record.id}-s1-g0")
        assert len(rollouts) == 2
        for rollout in rollouts:
            assert rollout.status.value == "succeeded" and rollout.reward is not None
            assert rollout.reward_source.value == "grader"
            row = store.get_task(rollout.task_id, run_id=run.run_record.id).data  # the grader's
            assert set(rollout.task) == set(row) - set(cfg.tasks.private_fields)  # the agent's
            real = real_reward(task, row, rollout.final_answer)
            spread = rollout.reward - real  # the real grade, plus 0 or 1
            assert math.isclose(spread, 0.0, abs_tol=1e-9) or math.isclose(spread, 1.0)
            if task == "coding":
                assert set(json.loads(rollout.final_answer)) == {"files", "summary"}
            calls = store.calls(rollout.id)
            assert calls and calls[0].request["messages"][0]["content"] == agent.SYSTEM_PROMPT
            for call in calls:
                assert call.completion_ids and len(call.logprobs) == len(call.completion_ids)
                assert [t["function"]["name"] for t in call.request["tools"]] == tools
                assert call.policy_version == 0


def agent_tools(agent: Any) -> list[dict[str, Any]]:
    if hasattr(agent, "TOOLS"):
        return agent.TOOLS
    return [getattr(agent, "SEARCH_TOOL", None) or agent.CALCULATOR_TOOL]
