"""The Responses API (``POST /rollouts/{id}/v1/responses``) with real clients.

The official ``openai`` client and the OpenAI Agents SDK (its default Responses
provider) against a gateway on 127.0.0.1 with a real SQLite store: the starter
model where any output will do, a scripted engine where the model must call a
tool. Each call must be recorded as the equivalent chat completion is: the
stored prompt ids are the chat template applied to what was sent, the stored
completion ids decode to what the client received, and a resent conversation
extends the previous call's prompt + completion token for token.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args

import httpx
import openai
import pytest
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from tether.chat import render_prompt
from tether.engine import TransformersEngine
from tether.engine.testing import ScriptedEngine
from tether.gateway._api.responses.render import (
    ResponseMeta,
    echo,
    events,
    final_status,
    output_items,
    response_body,
)
from tether.gateway._api.responses.schema import ResponsesRequest
from tether.gateway._core.choices import Choice
from tether.gateway._core.deltas import Done, TextDelta, ToolCallDelta
from tether.models import load_tokenizer
from tether.records import RolloutStatus
from tether.store import Store

from .conftest import ADMIN_KEY
from .helpers import LiveGateway

ROOT = Path(__file__).resolve().parents[1]
RECORD_KEY = "test-record-key-0123456789"
SYSTEM = "You are a careful calculator agent."
QUESTION = "Ava has 12 apples and gets 30 more. How many?"
TOOL = {  # a Responses function tool: name and parameters at the top level
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    "strict": True,
}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


def tool_call(expression: str) -> str:
    args = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'


ONE_CALL = tool_call("12 + 30")
TEXT_AND_CALL = "Let me use the calculator.\n" + ONE_CALL
TWO_CALLS = ONE_CALL + "\n" + tool_call("30 + 12")
ANSWER = "The answer is 42."
GW = {"task": {"question": QUESTION}, "record_keys": (RECORD_KEY,)}  # every LiveGateway here


@pytest.fixture
def starter(model: Any, tokenizer: Any, tmp_path: Path):
    lv = LiveGateway(
        TransformersEngine(model, tokenizer, max_batch_size=4), tokenizer, tmp_path / "s.db", **GW
    )
    yield lv
    lv.stop()


@pytest.fixture
def scripted(tokenizer: Any, tmp_path: Path):
    lives = []

    def make(*script: str) -> LiveGateway:
        engine = ScriptedEngine(list(script), tokenizer=tokenizer, cycle=True)
        lives.append(LiveGateway(engine, tokenizer, tmp_path / f"r{len(lives)}.db", **GW))
        return lives[-1]

    yield make
    for lv in lives:
        lv.stop()


def visible(call: Any) -> list[int]:
    return call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids


# --- the openai client ----------------------------------------------------------------------


def test_text_response_is_recorded_token_exactly(starter: LiveGateway, tokenizer: Any) -> None:
    client = starter.client("r-text")
    raw = client.responses.with_raw_response.create(
        model="policy",
        instructions=SYSTEM,
        input=QUESTION,
        max_output_tokens=16,
        temperature=1.0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    resp = raw.parse()
    # the body is a valid Responses object, field for field (the client does not validate)
    Response.model_validate(json.loads(raw.text))
    (call,) = starter.store.calls("r-text")
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert [item.type for item in resp.output] == ["message"]
    # what was sent, rendered with the chat template, is the stored prompt
    sent = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    assert call.prompt_ids == render_prompt(tokenizer, sent, None)
    assert call.request["messages"] == sent and call.request["api"] == "responses"
    # the stored completion decodes to what the client received
    assert tokenizer.decode(visible(call), skip_special_tokens=False) == resp.output_text
    assert resp.usage.input_tokens == len(call.prompt_ids)
    assert resp.usage.output_tokens == len(call.completion_ids) > 0
    assert resp.status == ("incomplete" if call.finish_reason == "length" else "completed")
    lps = [t.logprob for t in resp.output[0].content[0].logprobs]
    assert lps == pytest.approx(call.logprobs, abs=1e-6)
    assert all(math.isfinite(x) and x <= 0 for x in lps)
    assert all(len(t.top_logprobs) == 2 for t in resp.output[0].content[0].logprobs)


@pytest.mark.parametrize("script", [ONE_CALL, TEXT_AND_CALL, TWO_CALLS])
def test_tool_round_trip_extends_the_previous_call(scripted, tokenizer: Any, script: str) -> None:
    """function_call → function_call_output → answer: call 2's stored prompt extends call
    1's prompt + completion token for token, and is what a chat client sending the same
    conversation gets (the same template, the same recorded call)."""
    live = scripted(script, ANSWER)
    client = live.client("r-tools")
    first = client.responses.create(
        model="policy",
        instructions=SYSTEM,
        input=[{"role": "user", "content": QUESTION}],
        tools=[TOOL],
    )
    calls = [item for item in first.output if item.type == "function_call"]
    (stored1,) = live.store.calls("r-tools")
    ids = [c["id"] for c in stored1.response["tool_calls"]]
    assert [c.call_id for c in calls] == ids and {c.name for c in calls} == {"calculator"}
    assert json.loads(calls[0].arguments) == {"expression": "12 + 30"}
    kinds = [item.type for item in first.output]
    assert kinds == ["message"] * (script == TEXT_AND_CALL) + ["function_call"] * len(ids)
    assert first.output_text == ("Let me use the calculator." if script == TEXT_AND_CALL else "")

    history = [
        {"role": "user", "content": QUESTION},
        *[item.model_dump(exclude_none=True) for item in first.output],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls],
    ]
    second = client.responses.create(
        model="policy", instructions=SYSTEM, input=history, tools=[TOOL]
    )
    assert second.output_text == ANSWER and second.status == "completed"
    stored1, stored2 = live.store.calls("r-tools")
    n = len(stored1.prompt_ids) + len(stored1.completion_ids)
    assert stored2.prompt_ids[:n] == stored1.prompt_ids + stored1.completion_ids
    # the same conversation sent as chat messages renders to the same prompt
    chat = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        stored1.response,
        *[{"role": "tool", "tool_call_id": i, "content": "42"} for i in ids],
    ]
    assert stored2.prompt_ids == render_prompt(tokenizer, chat, [CHAT_TOOL])
    assert stored2.request["tools"] == [CHAT_TOOL]


def test_streamed_tool_calls_follow_the_event_sequence(scripted) -> None:
    live = scripted(TEXT_AND_CALL + "\n" + tool_call("30 + 12"))
    client = live.client("r-sse")
    events = list(
        client.responses.create(model="policy", input=QUESTION, tools=[TOOL], stream=True)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type.removeprefix("response.") for e in events]
    text = kinds.count("output_text.delta")
    args = ["output_item.added", "function_call_arguments.delta"]
    args += ["function_call_arguments.done", "output_item.done"]
    assert kinds == [
        "created",
        "in_progress",
        "output_item.added",
        "content_part.added",
        *["output_text.delta"] * text,
        "output_text.done",
        "content_part.done",
        "output_item.done",
        *args,
        *args,
        "completed",
    ]
    final = events[-1].response
    (call,) = live.store.calls("r-sse")
    assert [i.call_id for i in final.output[1:]] == [c["id"] for c in call.response["tool_calls"]]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == call.response["content"]
    # every item is announced, filled and finished under one id
    for item in final.output:
        mine = [e for e in events if getattr(e, "item_id", None) == item.id]
        assert mine and all(e.output_index == final.output.index(item) for e in mine)
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == [i.arguments for i in final.output[1:]]


def test_stream_helper_and_the_starter_model(
    scripted, starter: LiveGateway, tokenizer: Any
) -> None:
    """``client.responses.stream`` accumulates the answer; an answer cut by
    max_output_tokens ends with ``response.incomplete``, as OpenAI's does."""
    client = scripted(ANSWER).client("r-helper")
    with client.responses.stream(model="policy", input=QUESTION) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == ANSWER and len(deltas) >= 2  # token by token

    client = starter.client("r-cut")
    events = list(
        client.responses.create(model="policy", input=QUESTION, max_output_tokens=8, stream=True)
    )
    (call,) = starter.store.calls("r-cut")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == tokenizer.decode(visible(call), skip_special_tokens=False)
    last = events[-1]
    if call.finish_reason == "length":
        assert last.type == "response.incomplete" and last.response.status == "incomplete"
        assert last.response.incomplete_details.reason == "max_output_tokens"
    else:
        assert last.type == "response.completed"
    assert last.response.output_text == text and last.response.usage.output_tokens <= 8


def test_fields_agents_send_are_accepted_and_recorded(scripted) -> None:
    """The Agents SDK's defaults for its default model (reasoning effort, verbosity),
    ``store: false`` and the other fields without effect."""
    live = scripted(ONE_CALL)
    client = live.client("r-acc")
    resp = client.responses.create(
        model="gpt-5.6-luna",
        input=QUESTION,
        tools=[TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        reasoning={"effort": "none"},
        text={"verbosity": "low", "format": {"type": "text"}},
        include=[],
        store=False,
        truncation="disabled",
        metadata={"run": "a"},
        user="u-1",
        prompt_cache_key="k",
        top_p=0.9,
    )
    assert resp.model == "gpt-5.6-luna" and resp.parallel_tool_calls is False
    assert resp.store is False and resp.reasoning.effort == "none"
    (call,) = live.store.calls("r-acc")
    kept = call.request["responses"]
    assert kept["reasoning"] == {"effort": "none"} and kept["metadata"] == {"run": "a"}
    assert kept["store"] is False and kept["text"]["verbosity"] == "low"
    assert call.request["params"]["top_p"] == 0.9
    assert call.request["params"]["response_format"] == {"type": "text"}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "whole conversation"),
        ({"extra_body": {"conversation": "conv_1"}}, "conversation", "whole conversation"),
        ({"truncation": "auto"}, "truncation", "never drops input"),
        ({"background": True}, "background", "background responses"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "function tools"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", "remove it"),
        ({"include": ["file_search_call.results"]}, "include", "not supported"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type", "json_schema"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "'required'"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "function_call"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
            "text parts only",
        ),
        ({"input": []}, "input", "must not be empty"),
        ({"extra_body": {"max_tool_calls": 2}}, "max_tool_calls", "unsupported field"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    scripted, fields: dict, param: str, words: str
) -> None:
    live = scripted(ANSWER)
    client = live.client("r-x")
    kw = {"model": "policy", "input": QUESTION, **fields}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**kw)
    assert err.value.status_code == 400 and err.value.param == param
    assert param in err.value.message and words in err.value.message, err.value.message
    assert live.store.calls("r-x") == []


def test_record_mode_and_auth(scripted) -> None:
    live = scripted(ANSWER)
    base = f"{live.server.url}/v1"
    resp = openai.OpenAI(base_url=base, api_key=RECORD_KEY).responses.create(
        model="policy", input=QUESTION
    )
    assert resp.output_text == ANSWER
    (rollout,) = live.store.list_rollouts()
    assert [c.request["api"] for c in live.store.calls(rollout.id)] == ["responses"]
    assert rollout.status is RolloutStatus.SUCCEEDED
    # streamed: the rollout is finished before the agent sees response.completed, even
    # when finishing is slow and the client stops reading there
    finish = live.gw.finish_rollout

    def slow_finish(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return finish(*args, **kwargs)

    live.gw.finish_rollout = slow_finish
    body = {"model": "policy", "input": QUESTION, "stream": True}
    headers = {"Authorization": f"Bearer {RECORD_KEY}"}
    with httpx.stream("POST", f"{base}/responses", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if line == "event: response.completed":
                break
        ended = [x.status for x in live.store.list_rollouts() if x.id != rollout.id]
    assert ended == [RolloutStatus.SUCCEEDED]
    for key in ("wrong-key", ADMIN_KEY):
        r = httpx.post(
            f"{base}/responses", json={"input": "x"}, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == 401 and "record" in r.json()["error"]["message"]
    rid_base, _ = live.open("r-auth")
    r = httpx.post(f"{rid_base}/responses", json={"input": "x"})
    assert r.status_code == 401


# --- the OpenAI Agents SDK, default Responses provider ---------------------------------------


def _run_config(base_url: str, token: str) -> Any:
    from agents import RunConfig
    from agents.models.openai_provider import OpenAIProvider

    # a client of its own: the SDK's default shares one HTTP client per process, bound to
    # the first test's (closed) event loop
    client = openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0)
    provider = OpenAIProvider(openai_client=client, use_responses=True)
    return RunConfig(model_provider=provider, tracing_disabled=True)


def test_agents_sdk_streaming_runner(scripted, tokenizer: Any) -> None:
    pytest.importorskip("agents")
    from agents import Agent, Runner, function_tool

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return "42"

    live = scripted(ONE_CALL, ANSWER)
    base, token = live.open("r-agent")

    async def run() -> tuple[Any, list[str]]:
        agent = Agent(name="Calculator agent", instructions=SYSTEM, tools=[calculator])
        result = Runner.run_streamed(agent, QUESTION, run_config=_run_config(base, token))
        kinds = [
            e.data.type async for e in result.stream_events() if e.type == "raw_response_event"
        ]
        return result, kinds

    result, kinds = asyncio.run(run())
    assert result.final_output == ANSWER
    assert (
        kinds.count("response.completed") == 2 and "response.function_call_arguments.delta" in kinds
    )
    first, second = live.store.calls("r-agent")
    assert first.request["responses"]["stream"] is first.request["params"]["stream"] is True
    assert first.response["tool_calls"][0]["function"]["name"] == "calculator"
    n = len(first.prompt_ids) + len(first.completion_ids)
    assert second.prompt_ids[:n] == first.prompt_ids + first.completion_ids
    assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(second.prompt_ids)


def test_agents_sdk_output_type_with_the_starter_model(starter: LiveGateway) -> None:
    """``Agent(output_type=...)`` sends ``text.format`` json_schema; even the untrained
    starter model must produce JSON the Pydantic model parses. The integer is bounded:
    an unbounded one lets an untrained model write digits until ``max_tokens``."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        value: int = Field(ge=0, le=1000)

    base, token = starter.open("r-typed")
    agent = Agent(
        name="Answerer",
        instructions="Answer with the number.",
        output_type=Answer,
        model_settings=ModelSettings(max_tokens=64),
    )
    result = asyncio.run(Runner.run(agent, QUESTION, run_config=_run_config(base, token)))
    assert isinstance(result.final_output, Answer)
    (call,) = starter.store.calls("r-typed")
    assert call.request["params"]["response_format"]["type"] == "json_schema"


# --- the example: one training step ------------------------------------------------------------


@pytest.mark.slow
def test_the_responses_example_trains_one_step(starter_dir: Path, tmp_path: Path) -> None:
    """``tether train examples/frameworks/responses/config.yaml``: the Agents-SDK agent on
    its default Responses provider, in warm worker processes; one GRPO update."""
    pytest.importorskip("agents")
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "tasks.train_size=4",
        "tasks.val_size=1",
        "agent.concurrency=2",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "rollout.grader=tests.helpers:alternating_grader",  # rewards 0, 1: an update happens
        "trainer.steps=1",
        "eval.tasks=1",
        "eval.samples=1",
        "eval.greedy=false",
        "checkpoint.every=0",
        "gateway.default_max_tokens=24",
    ]
    config = ROOT / "examples/frameworks/responses/config.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "tether.cli", "train", str(config), *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert " v1 " in out.stdout and "no update happened" not in out.stdout, out.stdout[-2000:]
    # every call of every rollout went through /v1/responses and was recorded token-exactly
    store = Store(tmp_path / "calc-responses" / "traces.sqlite")
    try:
        calls = [c for r in store.list_rollouts() for c in store.calls(r.id)]
    finally:
        store.close()
    assert len(calls) >= 4 and {c.request["api"] for c in calls} == {"responses"}
    tokenizer = load_tokenizer(starter_dir)
    for c in calls:
        assert c.prompt_ids == render_prompt(tokenizer, c.request["messages"], c.request["tools"])
        assert len(c.completion_ids) == len(c.logprobs) > 0


# --- the event emitter, fed as a token stream feeds it ----------------------------------------


def _emitted(pieces: list[Any], choice: Any, *, prompt_tokens: int = 7) -> list[dict]:
    """The events for ``pieces`` (TextDelta / ToolCallDelta) then Done(choice), as dicts."""
    meta = ResponseMeta(echo=echo(ResponsesRequest(input="x", tools=[TOOL])))

    async def deltas():
        for piece in pieces:
            yield piece
        yield Done([choice], prompt_tokens)

    def final(done: Any) -> dict:
        usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
        output = output_items(meta, done.choices[0], None)
        return response_body(meta, output, status=final_status(done.choices[0]), usage=usage)

    async def collect() -> list[dict]:
        return [e async for e in events(meta, deltas(), final)]

    return asyncio.run(collect())


def _accumulated(emitted: list[dict]) -> Any:
    """What the openai client makes of the events: each validated against its type, then
    accumulated by the client's own stream state (which checks ids and order)."""
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for e in emitted:
        state.handle_event(_validated(e))
    return state._completed_response


def _validated(event: dict) -> Any:
    """``event`` validated against the openai package's model of its type."""
    classes = get_args(get_args(ResponseStreamEvent)[0])
    by_type = {get_args(c.model_fields["type"].annotation)[0]: c for c in classes}
    return by_type[event["type"]].model_validate(event)


@pytest.mark.parametrize("before", ["Sure.", "", "  \n"])
def test_events_of_a_token_stream_before_a_tool_call(before: str) -> None:
    """Pieces as an incremental parser yields them: text (the whitespace before the call
    is held back and dropped, as the parser drops it), then the call in pieces."""
    arguments = '{"expression": "1 + 2"}'
    content = before.rstrip() or None
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "calculator", "arguments": arguments}
    message = {"role": "assistant", "content": content, "tool_calls": [call]}
    choice = Choice(before, message, "tool_calls", [1, 2, 3], [-0.5] * 3)
    pieces = [TextDelta(0, c) for c in before + "\n"]
    pieces += [ToolCallDelta(0, 0, "call_1", "calculator", "")]
    pieces += [ToolCallDelta(0, 0, None, None, arguments[i : i + 5]) for i in range(0, 23, 5)]
    emitted = _emitted(pieces, choice)
    kinds = [e["type"].removeprefix("response.") for e in emitted]
    message_events = ["output_item.added", "content_part.added"]
    message_events += ["output_text.delta"] * len(before.rstrip())
    message_events += ["output_text.done", "content_part.done", "output_item.done"]
    assert kinds == [
        "created",
        "in_progress",
        *(message_events if content else []),
        "output_item.added",
        *["function_call_arguments.delta"] * 5,
        "function_call_arguments.done",
        "output_item.done",
        "completed",
    ]
    assert [e["sequence_number"] for e in emitted] == list(range(len(emitted)))
    response = _accumulated(emitted)
    assert response.output_text == (content or "")
    assert [i.type for i in response.output] == ["message"] * bool(content) + ["function_call"]
    assert response.output[-1].arguments == arguments and response.output[-1].call_id == "call_1"


def test_events_complete_what_the_deltas_left_unsaid() -> None:
    """The finished call is the truth: text the deltas did not carry (held-back
    whitespace, a tail) is sent before the item is done; a cut answer is incomplete."""
    message = {"role": "assistant", "content": "The answer is 42.\n"}
    choice = Choice(message["content"], message, "length", [1, 2], [-0.1, -0.2])
    emitted = _emitted(
        [TextDelta(0, "The answer"), TextDelta(0, " is "), TextDelta(1, "x")], choice
    )
    deltas = [e["delta"] for e in emitted if e["type"] == "response.output_text.delta"]
    assert deltas == ["The answer", " is", " 42.\n"]
    assert emitted[-1]["type"] == "response.incomplete"
    response = emitted[-1]["response"]
    assert response["status"] == "incomplete" and response["output"][0]["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    for e in emitted:
        _validated(e)
