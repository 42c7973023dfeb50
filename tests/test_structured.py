"""Structured outputs and forced tool calls: real clients, a real gateway, the starter model.

The starter model has random weights, so nothing but the grammar makes its
output parse: every structured reply parsing, at several seeds and
temperatures, is the constraint working. Each call is also checked token-exactly
(the prompt is the template applied to what was sent; the completion decodes to
what the client got) and its logprobs against the model's own unconstrained
forward pass: what the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import openai
import pytest
import torch
from pydantic import BaseModel, Field

from tether.chat import render_prompt
from tether.engine import TransformersEngine
from tether.gateway import constraint_for
from tether.starter.calc import CALCULATOR_TOOL

from .helpers import LiveGateway

MESSAGES = [
    {"role": "system", "content": "Reply in JSON."},
    {"role": "user", "content": "Ava has 12 apples and gets 30 more. How many?"},
]
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a fruit up.",
        "parameters": {
            "type": "object",
            "properties": {
                "fruit": {"type": "string", "enum": ["apple", "pear"]},
                "count": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["fruit", "count"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
# The calc tool with a bounded expression: an untrained model rarely closes an unbounded string.
CALC_TOOL = {
    "type": "function",
    "function": {
        **CALCULATOR_TOOL["function"],
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 24}},
            "required": ["expression"],
        },
    },
}
SETTINGS = [(0.0, 0), (0.7, 1), (1.0, 2), (1.0, 3), (1.5, 4)]  # (temperature, seed)


class Answer(BaseModel):
    reasoning: str = Field(max_length=24)
    answer: int = Field(ge=0, le=1000)
    unit: Literal["apples", "pears"]
    sure: bool


@pytest.fixture(scope="module")
def live(model: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory):
    engine = TransformersEngine(model, tokenizer, max_batch_size=16)
    lv = LiveGateway(engine, tokenizer, tmp_path_factory.mktemp("structured") / "traces.sqlite")
    yield lv
    lv.stop()


def unconstrained_logprobs(model: Any, prompt: list[int], completion: list[int], t: float):
    """log_softmax(logits / T) of each completion token: what the trainer recomputes."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (t if t > 0 else 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def check_recorded(live: LiveGateway, model: Any, rid: str, sent: dict, text: str) -> Any:
    """The call's prompt is the template of what was sent; its completion decodes to
    ``text`` + end of turn; its logprobs are the unconstrained model's."""
    tok = live.tokenizer
    (call,) = live.store.calls(rid)
    assert call.prompt_ids == render_prompt(tok, sent["messages"], sent.get("tools"))
    assert call.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(call.completion_ids[:-1], skip_special_tokens=False) == text
    want = unconstrained_logprobs(model, call.prompt_ids, call.completion_ids, call.temperature)
    assert torch.allclose(torch.tensor(call.logprobs), want, atol=2e-4)
    return call


@pytest.mark.parametrize(("temperature", "seed"), SETTINGS)
def test_parse_pydantic_model_every_time(live: LiveGateway, model: Any, temperature, seed) -> None:
    rid = f"r-parse-{seed}"
    client = live.client(rid)
    reply = client.chat.completions.parse(
        model="policy",
        messages=MESSAGES,
        response_format=Answer,
        temperature=temperature,
        seed=seed,
        max_completion_tokens=96,
    )
    choice = reply.choices[0]
    assert isinstance(choice.message.parsed, Answer), choice.message.content
    assert choice.finish_reason == "stop"
    call = check_recorded(live, model, rid, {"messages": MESSAGES}, choice.message.content)
    assert call.constraint == "json_schema:Answer"
    assert call.request["params"]["response_format"]["json_schema"]["strict"] is True


@pytest.mark.parametrize(("temperature", "seed"), SETTINGS[:3])
def test_json_object_is_json_unless_cut_by_max_tokens(
    live: LiveGateway, model: Any, temperature: float, seed: int
) -> None:
    """Any JSON object: its keys and strings are unbounded, so an untrained model may
    not close one before max_tokens (finish_reason "length", as with OpenAI); what it
    wrote is then still a prefix the grammar accepts."""
    rid = f"r-object-{seed}"
    reply = live.client(rid).chat.completions.create(
        model="policy",
        messages=MESSAGES,
        response_format={"type": "json_object"},
        temperature=temperature,
        seed=seed,
        max_completion_tokens=64,
    )
    out = reply.choices[0]
    (call,) = live.store.calls(rid)
    assert call.constraint == "json_object"
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.message.content), dict)
        check_recorded(live, model, rid, {"messages": MESSAGES}, out.message.content)
        return
    assert out.finish_reason == "length"
    matcher = live.gw.engine.grammars().matcher(constraint_for(
        response_format={"type": "json_object"}, tools=None, tool_choice=None
    ))  # fmt: skip
    assert all(matcher.accept_token(t) for t in call.completion_ids)
    assert out.message.content.startswith("{")


@pytest.mark.parametrize(("temperature", "seed"), SETTINGS)
@pytest.mark.parametrize("choice", ["required", "lookup", "calculator"])
def test_forced_tool_call_is_a_parseable_call(
    live: LiveGateway, model: Any, choice: str, temperature: float, seed: int
) -> None:
    rid = f"r-force-{choice}-{seed}"
    tools = [CALC_TOOL, LOOKUP_TOOL]
    tool_choice = (
        choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    )
    reply = live.client(rid).chat.completions.create(
        model="policy",
        messages=MESSAGES,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=temperature,
        seed=seed,
        max_completion_tokens=96,
    )
    out = reply.choices[0]
    assert out.finish_reason == "tool_calls", out.message.content
    (call,) = out.message.tool_calls
    args = json.loads(call.function.arguments)
    if choice != "required":
        assert call.function.name == choice
    if call.function.name == "lookup":
        assert args["fruit"] in ("apple", "pear") and 0 <= args["count"] <= 99
        assert set(args) == {"fruit", "count"}
    else:
        assert call.function.name == "calculator" and isinstance(args["expression"], str)
    text = f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}\n</tool_call>'
    stored = check_recorded(live, model, rid, {"messages": MESSAGES, "tools": tools}, text)
    assert stored.constraint == f"tool_choice:{choice}"


def test_langchain_with_structured_output(live: LiveGateway) -> None:
    from langchain_openai import ChatOpenAI

    base, token = live.open("r-langchain")
    llm = ChatOpenAI(model="policy", base_url=base, api_key=token, max_retries=0, max_tokens=96)
    for temperature in (0.0, 1.0, 1.3):
        got = llm.with_structured_output(Answer).invoke(
            "How many apples?", config={"temperature": temperature}
        )
        assert isinstance(got, Answer)
    calls = live.store.calls("r-langchain")
    assert len(calls) == 3 and {c.constraint for c in calls} == {"json_schema:Answer"}
    assert calls[0].request["params"]["response_format"]["type"] == "json_schema"


def test_langgraph_agent_with_a_forced_tool(live: LiveGateway) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def calculator(expression: Annotated[str, Field(max_length=24)]) -> str:
        """Evaluate an arithmetic expression."""
        return f"evaluated {expression!r}"

    for i, temperature in enumerate((0.0, 0.8, 1.2)):
        base, token = live.open(f"r-graph-{i}")
        llm = ChatOpenAI(
            model="policy", base_url=base, api_key=token, max_retries=0, max_tokens=96,
            temperature=temperature,
        )  # fmt: skip
        forced = llm.bind_tools([calculator], tool_choice="calculator")

        def agent(state: MessagesState, forced=forced) -> dict:
            return {"messages": [forced.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode([calculator]))
        graph.add_edge(START, "agent")
        graph.add_edge("agent", "tools")
        graph.add_edge("tools", END)
        state = graph.compile().invoke({"messages": [HumanMessage("What is 12 + 30?")]})
        (stored,) = live.store.calls(f"r-graph-{i}")
        assert len(state["messages"]) == 3, (stored.response, stored.finish_reason, state)
        ai, result = state["messages"][1:]
        assert isinstance(ai, AIMessage) and isinstance(result, ToolMessage)
        (call,) = ai.tool_calls
        assert call["name"] == "calculator" and isinstance(call["args"]["expression"], str)
        assert result.content == f"evaluated {call['args']['expression']!r}"
        assert stored.constraint == "tool_choice:calculator"
        assert stored.request["params"]["tool_choice"] == {
            "type": "function",
            "function": {"name": "calculator"},
        }


BAD = [
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "keyword 'not'"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    (
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                }
            },
            "$ref": "#/$defs/Node",
        },
        "recursive schemas are not supported",
    ),
    (
        {"type": "object", "description": "x" * 40_000, "properties": {}},
        "the limit is 32768",
    ),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "points to nothing"),
    ({"type": "string", "format": "credit-card"}, "format 'credit-card'"),
]


@pytest.mark.parametrize(("schema", "words"), BAD)
def test_bad_schema_is_refused_by_name_and_nothing_is_stored(
    live: LiveGateway, schema: dict, words: str
) -> None:
    rid = f"r-bad-{abs(hash(words))}"
    with pytest.raises(openai.BadRequestError) as err:
        live.client(rid).chat.completions.create(
            model="policy",
            messages=MESSAGES,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": True},
            },
        )
    assert err.value.status_code == 400 and words in err.value.message, err.value.message
    assert err.value.param == "response_format.json_schema"
    assert live.store.calls(rid) == []


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "function 'nope', which is not in tools",
        ),
        ({"tool_choice": "required", "tools": None}, "tool_choice", "needs tools"),
        (
            {
                "tools": [
                    {
                        **LOOKUP_TOOL,
                        "function": {
                            **LOOKUP_TOOL["function"],
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"if": {"type": "string"}}},
                            },
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
            "keyword 'if'",
        ),
    ],
)
def test_bad_tool_constraints_are_refused(
    live: LiveGateway, fields: dict, param: str, words: str
) -> None:
    rid = f"r-badtool-{abs(hash(words))}"
    kw = {"tools": [CALC_TOOL, LOOKUP_TOOL], **fields}
    kw = {k: v for k, v in kw.items() if v is not None}
    with pytest.raises(openai.BadRequestError) as err:
        live.client(rid).chat.completions.create(model="policy", messages=MESSAGES, **kw)
    assert err.value.param == param and words in err.value.message, err.value.message
    assert live.store.calls(rid) == []


def test_openai_agents_sdk_output_type(live: LiveGateway) -> None:
    """``Agent(output_type=Answer)`` over ``OpenAIChatCompletionsModel``: a json_schema
    response format; the SDK validates the final output into the model."""
    agents = pytest.importorskip("agents")
    base, token = live.open("r-agents")
    client = openai.AsyncOpenAI(base_url=base, api_key=token, max_retries=0)
    agent = agents.Agent(
        name="answerer",
        instructions="Answer in JSON.",
        output_type=Answer,
        model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=agents.ModelSettings(max_tokens=96, temperature=1.0),
    )
    result = asyncio.run(agents.Runner.run(agent, "How many apples?"))
    assert isinstance(result.final_output, Answer)
    (call,) = live.store.calls("r-agents")
    assert call.constraint.startswith("json_schema:")


def test_streamed_structured_output_parses(live: LiveGateway, model: Any) -> None:
    """``client.chat.completions.stream(response_format=Model)``: the SDK assembles the
    streamed deltas and parses them; the stored completion is what was streamed."""
    client = live.client("r-stream")
    with client.chat.completions.stream(
        model="policy",
        messages=MESSAGES,
        response_format=Answer,
        temperature=1.0,
        seed=7,
        max_completion_tokens=96,
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert isinstance(message.parsed, Answer), message.content
    call = check_recorded(live, model, "r-stream", {"messages": MESSAGES}, message.content)
    assert call.constraint == "json_schema:Answer" and call.request["params"]["stream"] is True


@pytest.fixture(scope="module")
def eager_caller(starter_dir: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory):
    """A gateway over the starter with its LM head biased towards ``<tool_call>``: the
    model opens a tool call at once, then writes whatever its random weights say."""
    from tether.models import load_model

    model = load_model(starter_dir)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.convert_tokens_to_ids("<tool_call>")] = 40.0
    model.lm_head = head
    engine = TransformersEngine(model, tokenizer, max_batch_size=4)
    lv = LiveGateway(engine, tokenizer, tmp_path_factory.mktemp("eager") / "traces.sqlite")
    yield lv, model
    lv.stop()


@pytest.mark.parametrize(("temperature", "seed"), SETTINGS[1:4])
def test_strict_tool_under_auto_is_enforced_once_a_call_opens(
    eager_caller: Any, temperature: float, seed: int
) -> None:
    """``tool_choice: "auto"`` leaves the model free to answer in text or to call; a
    ``strict: true`` tool's call, once opened, follows the tool's schema. The same model
    without ``strict`` writes no parseable call."""
    live, model = eager_caller
    loose_tool = {"type": "function", "function": {**LOOKUP_TOOL["function"], "strict": False}}
    got = {}
    for name, tool in (("strict", LOOKUP_TOOL), ("loose", loose_tool)):
        rid = f"r-auto-{name}-{seed}"
        reply = live.client(rid).chat.completions.create(
            model="policy",
            messages=MESSAGES,
            tools=[tool],
            tool_choice="auto",
            parallel_tool_calls=False,
            temperature=temperature,
            seed=seed,
            max_completion_tokens=96,
        )
        got[name] = (rid, reply.choices[0])
    rid, strict = got["strict"]
    assert strict.finish_reason == "tool_calls", strict.message.content
    (call,) = strict.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "lookup" and set(args) == {"fruit", "count"}
    assert args["fruit"] in ("apple", "pear") and 0 <= args["count"] <= 99
    text = (
        f'<tool_call>\n{{"name": "lookup", "arguments": {call.function.arguments}}}\n</tool_call>'
    )
    sent = {"messages": MESSAGES, "tools": [LOOKUP_TOOL]}
    assert check_recorded(live, model, rid, sent, text).constraint == "strict_tools"
    rid, loose = got["loose"]
    assert not loose.message.tool_calls and loose.finish_reason == "length"
    assert live.store.calls(rid)[0].constraint is None
