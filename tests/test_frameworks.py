"""Unchanged agents from popular frameworks (examples/frameworks) through the real gateway.

Each agent runs as its own process, started by the real process runner, against
a gateway on 127.0.0.1 with a real SQLite store; the grader attaches the reward.
A scripted engine makes the model's turns certain (a tool call, then the
answer), so the tests can check that the framework's tool calls were parsed
and that the stored completion ids are exactly the engine's output. One run
uses the starter model itself. All agents start at once: their imports are
the slow part.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from tether.chat import render_prompt
from tether.engine import TransformersEngine
from tether.engine.testing import ScriptedEngine
from tether.models import load_model
from tether.records import AttemptEnd, Call, RewardSource, Rollout, RolloutStatus
from tether.runner import AttemptResult, Launch, ProcessRunner, RunnerConfig
from tether.starter.calc import CALCULATOR_TOOL, grade

from .helpers import LiveGateway

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "frameworks"
TASK = {"id": "t-1", "question": "Ava has 12 apples and gets 30 more. How many?", "answer": 42}


def tool_call(expression: str) -> str:
    args = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'


ONE_CALL = tool_call("12 + 30")
TWO_CALLS = tool_call("12 + 30") + "\n" + tool_call("30 + 12")  # parallel tool calls
ANSWER = "The answer is 42."


@dataclass
class Framework:
    command: list[str]
    modules: tuple[str, ...]  # what must import for it to run
    script: list[str]  # the model's turns
    sent: dict[str, Any]  # request fields this framework sends (checked on every call)


PY = sys.executable
FRAMEWORKS = {
    "openai_stream": Framework(
        [PY, "examples/frameworks/openai_stream/agent.py"],
        ("openai",),
        [TWO_CALLS, ANSWER],
        {
            "stream": True,
            "stream_options": {"include_usage": True},
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "max_completion_tokens": 128,
        },
    ),
    "openai_agents": Framework(
        [PY, "examples/frameworks/openai_agents/agent.py"],
        ("agents",),
        [ONE_CALL, ANSWER],
        {"max_tokens": 128},
    ),
    "responses": Framework(
        [PY, "examples/frameworks/responses/agent.py"],
        ("agents",),
        [ONE_CALL, ANSWER],
        {"stream": False},  # the chat-shaped params of its Responses calls
    ),
    "langgraph": Framework(
        [PY, "examples/frameworks/langgraph/agent.py"],
        ("langchain_openai", "langgraph"),
        [ONE_CALL, ANSWER],
        {"stream": False, "max_completion_tokens": 128},
    ),
    "autogen": Framework(
        [PY, "examples/frameworks/autogen/agent.py"],
        ("autogen_agentchat", "autogen_ext.models.openai", "autogen_ext.tools.mcp", "mcp"),
        [ONE_CALL, ANSWER],
        {"stream": False, "max_tokens": 128, "tool_choice": "auto"},
    ),
    "anthropic": Framework(
        [PY, "examples/frameworks/anthropic/agent.py"],
        ("anthropic",),
        [ONE_CALL, ANSWER],
        {"max_completion_tokens": 128, "stream": False},  # the chat-shaped params of its calls
    ),
    "node": Framework(
        ["node", "examples/frameworks/node/agent.mjs"], (), [ONE_CALL, ANSWER], {"max_tokens": 128}
    ),
    "node_anthropic": Framework(
        ["node", "examples/frameworks/node_anthropic/agent.mjs"],
        (),
        [ONE_CALL, ANSWER],
        {"max_completion_tokens": 128, "stream": True},
    ),
}


def missing(name: str) -> str | None:
    """Why a framework cannot run here, or None."""
    for module in FRAMEWORKS[name].modules:
        try:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install -e '.[frameworks]')"
        except ImportError as exc:  # a parent package is missing or broken
            return f"{module} does not import: {exc}"
    if name in NODE_PACKAGES:
        return node_setup(EXAMPLES / name, NODE_PACKAGES[name])
    return None


NODE_PACKAGES = {"node": "openai", "node_anthropic": "@anthropic-ai/sdk"}  # what each needs


def node_setup(folder: Path, package: str) -> str | None:
    """``npm ci`` a node example once (set-up, not import); the reason if it cannot run."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm are not on PATH"
    if (folder / "node_modules" / package / "package.json").is_file():
        return None
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return None if done.returncode == 0 else f"npm ci failed: {done.stderr.strip()[-300:]}"


@dataclass
class Outcome:
    result: AttemptResult
    rollout: Rollout
    calls: list[Call] = field(default_factory=list)


async def run_agent(live: LiveGateway, command: list[str], rid: str) -> Outcome:
    """One rollout as the trainer runs it: open, run the process, grade, finish."""
    opened = live.gw.open_rollout(TASK, rollout_id=rid, task_id=TASK["id"])
    runner = ProcessRunner(RunnerConfig(command=command, cwd=str(ROOT), timeout_s=120))
    try:
        launch = Launch(rid, opened.attempt, opened.base_url, opened.token, TASK)
        result = await runner.run(launch)
    finally:
        await runner.close()
    reward = grade(TASK, result.final_answer) if result.ok else None
    rollout = live.gw.finish_rollout(
        AttemptEnd(rid, opened.attempt, result.status, error=result.error),
        reward=reward,
        final_answer=result.final_answer,
    )
    return Outcome(result, rollout, live.store.calls(rid))


@pytest.fixture(scope="module")
def outcomes(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every framework that can run here, all at once, each against its own gateway."""
    tmp = tmp_path_factory.mktemp("frameworks")
    reasons = {name: missing(name) for name in FRAMEWORKS}
    lives = {
        name: LiveGateway(
            ScriptedEngine(fw.script, tokenizer=tokenizer), tokenizer, tmp / f"{name}.db", TASK
        )
        for name, fw in FRAMEWORKS.items()
        if reasons[name] is None
    }

    async def all_agents() -> list[Outcome]:
        runs = [run_agent(live, FRAMEWORKS[n].command, f"r-{n}") for n, live in lives.items()]
        return await asyncio.gather(*runs)

    try:
        done = dict(zip(lives, asyncio.run(all_agents()), strict=True))
    finally:
        for live in lives.values():
            live.stop()
    return {name: done.get(name, reason) for name, reason in reasons.items()}


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_framework_agent_through_the_gateway(name: str, outcomes: dict, tokenizer: Any) -> None:
    out = outcomes[name]
    if isinstance(out, str):
        pytest.skip(f"{name}: {out}")
    fw = FRAMEWORKS[name]
    assert out.result.status is RolloutStatus.SUCCEEDED, out.result.output_tail
    assert out.result.final_answer == ANSWER
    # The grader's reward is attached to the finished rollout.
    assert out.rollout.status is RolloutStatus.SUCCEEDED
    assert out.rollout.reward == 1.0 and out.rollout.usable
    assert out.rollout.reward_source is RewardSource.GRADER
    first, second = out.calls
    assert [first.seq, second.seq] == [0, 1]
    # The model's tool calls were parsed into OpenAI form.
    expressions = [json.loads(c["function"]["arguments"]) for c in first.response["tool_calls"]]
    wanted = ["12 + 30", "30 + 12"] if fw.script[0] == TWO_CALLS else ["12 + 30"]
    assert expressions == [{"expression": e} for e in wanted]
    assert {c["function"]["name"] for c in first.response["tool_calls"]} == {"calculator"}
    assert first.finish_reason == "tool_calls" and second.finish_reason == "stop"
    assert second.response == {"role": "assistant", "content": ANSWER}
    # Token-exact: the stored completion ids are the engine's output, with a logprob each.
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for call, text in zip(out.calls, fw.script, strict=True):
        assert call.completion_ids == [*tokenizer.encode(text, add_special_tokens=False), end]
        assert call.logprobs == [-0.5] * len(call.completion_ids)
        # The prompt is the chat template's rendering of what the framework sent.
        sent = call.request
        assert call.prompt_ids == render_prompt(tokenizer, sent["messages"], sent["tools"])
        assert sent["params"].items() >= fw.sent.items(), sent["params"]
        if name == "responses":  # sent to /v1/responses: what it sent is recorded beside
            assert sent["api"] == "responses" and sent["responses"]["id"].startswith("resp_")
            assert "max_output_tokens" not in sent["responses"], sent["responses"]  # quickstart
        if name in ("anthropic", "node_anthropic"):  # to /v1/messages, ANTHROPIC_BASE_URL
            assert sent["api"] == "messages" and sent["anthropic"]["max_tokens"] == 128
    # The tool results went back to the model (one per tool call).
    prompt = tokenizer.decode(second.prompt_ids)
    assert prompt.count("<tool_response>\n42\n</tool_response>") == len(wanted)
    # The framework sent the history back so that the trainer can merge the two calls
    # into one sequence: call 2's prompt extends call 1's prompt + completion.
    extends = second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
    assert extends == first.prompt_ids + first.completion_ids


def test_openai_streaming_agent_with_the_starter_model(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """The streaming SDK agent against the starter model (no script): every call is
    stored with its ids and logprobs, what was streamed is what was stored, and the
    grader's reward is attached (the untrained model's answer is almost surely wrong)."""
    engine = TransformersEngine(load_model(starter_dir), tokenizer, max_batch_size=4)
    live = LiveGateway(engine, tokenizer, tmp_path / "traces.db", TASK)
    try:
        out = asyncio.run(run_agent(live, FRAMEWORKS["openai_stream"].command, "r-starter"))
    finally:
        live.stop()
    assert out.result.status is RolloutStatus.SUCCEEDED, out.result.output_tail
    assert out.rollout.reward in (0.0, 1.0) and out.rollout.usable
    assert 1 <= len(out.calls) <= 4 and [c.seq for c in out.calls] == list(range(len(out.calls)))
    for call in out.calls:
        assert call.request["params"]["stream"] is True
        assert 0 < len(call.completion_ids) == len(call.logprobs) <= 128
        assert all(math.isfinite(x) and x <= 0 for x in call.logprobs)
        assert call.prompt_ids == render_prompt(
            tokenizer, call.request["messages"], [CALCULATOR_TOOL]
        )
        if call.response.get("tool_calls"):
            assert call.finish_reason in ("tool_calls", "length")
        else:
            ids = call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids
            assert call.response["content"] == tokenizer.decode(ids, skip_special_tokens=False)
    last = out.calls[-1].response
    if not last.get("tool_calls"):  # the agent printed the streamed text of its last turn
        printed = last["content"].strip().replace("\n", " ")
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        assert out.result.final_answer == (lines[-1] if lines else None)


# --- request fields the frameworks send: honoured, recorded, or refused by name ----------

MESSAGES = [{"role": "user", "content": TASK["question"]}]


@pytest.fixture
def live(tokenizer: Any, tmp_path: Path):
    lv = LiveGateway(
        ScriptedEngine([TWO_CALLS], tokenizer=tokenizer, cycle=True),
        tokenizer,
        tmp_path / "f.db",
        TASK,
    )
    yield lv
    lv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_returns_the_first_call(live: LiveGateway, stream: bool) -> None:
    """LangChain's ``bind_tools(parallel_tool_calls=False)``: one tool call comes back
    (and is recorded as the response); the completion ids keep what the model wrote."""
    client = live.client("r-p")
    kw = {"model": "policy", "messages": MESSAGES, "tools": [CALCULATOR_TOOL]}
    if stream:
        chunks = list(client.chat.completions.create(**kw, parallel_tool_calls=False, stream=True))
        deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        returned = {d.index for d in deltas}
    else:
        reply = client.chat.completions.create(**kw, parallel_tool_calls=False)
        returned = set(range(len(reply.choices[0].message.tool_calls)))
    (call,) = live.store.calls("r-p")
    assert returned == {0} and len(call.response["tool_calls"]) == 1
    assert call.response["tool_calls"][0]["function"]["arguments"] == '{"expression": "12 + 30"}'
    assert live.gw.tokenizer.decode(call.completion_ids).count("<tool_call>") == 2
    both = client.chat.completions.create(**kw, parallel_tool_calls=True)
    assert len(both.choices[0].message.tool_calls) == 2


def test_fields_without_effect_are_accepted_and_recorded(live: LiveGateway) -> None:
    client = live.client("r-a")
    stream = client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        user="u-1",
        metadata={"run": "a"},
        store=False,
        service_tier="auto",
        seed=3,
        n=1,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        extra_headers={"OpenAI-Organization": "org-x", "X-Trace": "1"},
    )
    chunks = list(stream)  # read to the end: a stream closed early is a cancelled call
    assert chunks[-1].usage is not None
    (call,) = live.store.calls("r-a")
    assert (
        call.request["params"].items()
        >= {
            "user": "u-1",
            "metadata": {"run": "a"},
            "store": False,
            "service_tier": "auto",
            "seed": 3,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        }.items()
    )


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        # the scripted engine cannot constrain decoding (tests/test_structured.py: one that can)
        ({"tool_choice": "required"}, "tool_choice", "cannot do"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "calculator"}}},
            "tool_choice",
            "cannot do",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "constrained decoding",
        ),
        ({"stream_options": {"continuous_usage_stats": True}}, "stream_options", "unsupported"),
        ({"extra_body": {"reasoning_effort": "low"}}, "reasoning_effort", "unsupported field"),
        ({"extra_body": {"prediction": {"type": "content"}}}, "prediction", "unsupported field"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    live: LiveGateway, fields: dict, param: str, words: str
) -> None:
    client = live.client("r-x")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="policy", messages=MESSAGES, tools=[CALCULATOR_TOOL], **fields
        )
    assert err.value.status_code == 400 and err.value.param == param
    assert param in err.value.message and words in err.value.message
    assert live.store.calls("r-x") == []


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_training_config_names_the_framework_agent(name: str) -> None:
    from tether.configio import load_config
    from tether.run import TrainConfig

    cfg = load_config(TrainConfig, EXAMPLES / name / "config.yaml")
    target = cfg.agent.entry.rpartition(":")[0] if cfg.agent.entry else cfg.agent.command[-1]
    assert (ROOT / target).is_file() and f"frameworks/{name}/agent." in target
    assert cfg.rollout.grader == "tether.starter.calc:grade" and cfg.tasks.source == "calc"
