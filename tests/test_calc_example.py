"""The calc task (tether.starter.calc) and the agents in examples/calc."""

from __future__ import annotations

import importlib.util
import json
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tether.starter import calc
from tether.starter.calc import CalcError, grade, make_tasks, safe_eval

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "calc"


def load_example(name: str) -> ModuleType:
    """Import examples/calc/<name>.py by path, as a runner would."""
    spec = importlib.util.spec_from_file_location(f"calc_example_{name}", EXAMPLE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -------------------------------------------------------------------- grader


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("The answer is 19.", 1.0),
        ("19", 1.0),
        ("12 + 7 = 19", 1.0),
        ("The answer is 19.0", 1.0),
        ("I think 19, no wait, 20.", 0.0),
        ("The answer is 18.", 0.0),
        ("nineteen", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_grade(answer: str | None, expected: float) -> None:
    assert grade({"question": "q", "answer": 19}, answer) == expected


def test_grade_handles_signs_decimals_and_thousands() -> None:
    assert grade({"answer": -4}, "The answer is -4.") == 1.0
    assert grade({"answer": 2.5}, "It is 2.5") == 1.0
    assert grade({"answer": 12345}, "The answer is 12,345.") == 1.0
    assert grade({"answer": "19"}, "19") == 1.0  # answers stored as text also work


def test_example_grader_is_the_task_grader() -> None:
    assert load_example("grader").grade is grade


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 + 7", 19),
        ("3 * (4 + 5)", 27),
        ("84 / 4", 21),
        ("7 / 2", 3.5),
        ("-3 + 10", 7),
        ("2 ** 10", 1024),
        ("  (1 + 2) * 3 - 4 / 2 ", 7),
    ],
)
def test_safe_eval(expression: str, value: float) -> None:
    assert safe_eval(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "(1).real",
        "abs(-1)",
        "2 ** 1000",
        "9 ** 9 ** 9",
        "10 ** 20",
        "1 / 0",
        "True + 1",
        "'a' * 3",
        "[1, 2]",
        "1 if 1 else 2",
        "1 +",
        "1" + "+1" * 150,
        "lambda: 1",
        "1else 2",  # Python warns "invalid decimal literal" while parsing this
    ],
)
def test_safe_eval_refuses(expression: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CalcError):
            safe_eval(expression)
    # nothing printed into the user's demo output (other warnings, e.g. a ResourceWarning
    # from garbage collection of an earlier test, may land here too: not ours)
    assert not [w for w in caught if issubclass(w.category, SyntaxWarning)]
    assert calc.calculator(expression).startswith("error: ")


def test_calculator_formats_numbers() -> None:
    assert calc.calculator("84 / 4") == "21"
    assert calc.calculator("7 / 3") == "2.333333"
    assert calc.calculator("1 / 8") == "0.125"
    assert calc.calculator("5 - 9") == "-4"


# --------------------------------------------------------------------- tasks


def test_splits_never_overlap_and_are_deterministic() -> None:
    train = make_tasks(3000, "train", seed=0) + make_tasks(1000, "train", seed=7)
    val = make_tasks(500, "val", seed=0) + make_tasks(500, "val", seed=7)
    assert not {t["question"] for t in train} & {t["question"] for t in val}
    assert make_tasks(50, "val", seed=0) == make_tasks(50, "val", seed=0)
    assert make_tasks(50, "val", seed=0) != make_tasks(50, "val", seed=1)
    assert all(calc.split_of(t["question"]) == "val" for t in val)


def test_tasks_are_json_with_question_and_integer_answer() -> None:
    for task in make_tasks(200, "train", seed=1):
        assert json.loads(json.dumps(task)) == task
        assert set(task) == {"id", "question", "grader"}  # the answer is for the grader only
        assert isinstance(task["grader"]["answer"], int) and task["grader"]["answer"] >= 0
    problems = calc.make_problems(200, "train", seed=1)
    assert all(safe_eval(p.expression) == p.answer for p in problems)
    assert len({p.question for p in problems}) == 200
    with pytest.raises(ValueError, match="split"):
        make_tasks(1, "test")


@pytest.mark.parametrize("kind", calc.TRANSCRIPT_KINDS)
def test_transcripts(kind: str) -> None:
    import random

    rng = random.Random(0)
    for problem in calc.make_problems(30, "train", seed=2):
        messages = calc.transcript(problem, kind, rng)
        final = messages[-1]["content"]
        assert messages[0]["content"] == calc.SYSTEM_PROMPT
        assert final.startswith("The answer is ")
        if kind == "clean":
            assert grade(problem.task("t"), final) == 1.0
            assert messages[3]["content"] == str(problem.answer)
        elif kind == "skip_tool":
            assert len(messages) == 3 and grade(problem.task("t"), final) == 0.0
        elif kind == "miscopy":
            assert grade(problem.task("t"), final) == 0.0
        else:
            args = messages[2]["tool_calls"][0]["function"]["arguments"]
            assert calc.calculator(args["expression"]) != str(problem.answer)


def test_write_tasks(tmp_path: Path) -> None:
    files = load_example("tasks").write_tasks(tmp_path, 20, 5)
    train = [json.loads(x) for x in files["train"].read_text().splitlines()]
    val = [json.loads(x) for x in files["val"].read_text().splitlines()]
    assert len(train) == 20 and len(val) == 5 and train == make_tasks(20, "train")


# -------------------------------------------------------------------- agents


def test_agent_keeps_its_own_copies_equal_to_the_task() -> None:
    agent = load_example("agent")
    assert agent.SYSTEM_PROMPT == calc.SYSTEM_PROMPT
    assert agent.CALCULATOR_TOOL == calc.CALCULATOR_TOOL
    assert json.dumps(agent.CALCULATOR_TOOL) == json.dumps(calc.CALCULATOR_TOOL)  # key order too
    assert agent.MODEL == "policy" and agent.MAX_CALLS == 4
    for expression in ["12 + 7", "84 / 4", "7 / 3", "(3 + 4) * 5", "-2 - 3", "2 ** 3", "1 / 8"]:
        assert agent.calculator(expression) == calc.calculator(expression)
    for bad in ["x", "1 / 0", "2 ** 99", "(1).real", "1 +"]:
        assert agent.calculator(bad).startswith("error: ")


class StubOpenAI:
    """A loopback OpenAI-compatible server: first a calculator call, then the answer."""

    def __init__(self, expression: str = "12 + 7") -> None:
        self.expression = expression
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["_auth"] = self.headers.get("Authorization")
                body["_path"] = self.path
                stub.requests.append(body)
                payload = json.dumps(stub.reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/rollouts/r1/v1"

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "tool":
            message = {"role": "assistant", "content": f"The answer is {last['content']}."}
            finish = "stop"
        else:
            args = json.dumps({"expression": self.expression})
            call = {"id": "call_1", "type": "function"}
            call["function"] = {"name": "calculator", "arguments": args}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def __enter__(self) -> StubOpenAI:
        serve = lambda: self.server.serve_forever(poll_interval=0.05)  # noqa: E731
        threading.Thread(target=serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[StubOpenAI]:
    with StubOpenAI() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "rollout-token")
        monkeypatch.setenv("TETHER_TASK", json.dumps({"question": "Ava has 12 and gets 7."}))
        yield server


def check_requests(stub: StubOpenAI) -> None:
    first, second = stub.requests
    assert first["_path"] == "/rollouts/r1/v1/chat/completions"
    assert first["_auth"] == "Bearer rollout-token"
    assert first["model"] == "policy"
    assert first["tools"] == [calc.CALCULATOR_TOOL]
    assert first["messages"] == [
        {"role": "system", "content": calc.SYSTEM_PROMPT},
        {"role": "user", "content": "Ava has 12 and gets 7."},
    ]
    assistant, tool = second["messages"][2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "calculator"
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "19"}


def test_agent_main_against_a_stub_server(stub: StubOpenAI, capsys) -> None:
    agent = load_example("agent")
    agent.main()
    agent.main()  # a warm pool calls main() again: env is read each time
    assert capsys.readouterr().out.splitlines()[-1] == "The answer is 19."
    assert len(stub.requests) == 4
    stub.requests = stub.requests[:2]
    check_requests(stub)


def test_agent_requests_render_prefix_stable(stub: StubOpenAI, tokenizer: Any) -> None:
    """The SDK's second request, rendered by the starter template, extends the first
    prompt plus the canonical completion token for token."""
    load_example("agent").main()
    tok = tokenizer
    first, second = stub.requests

    def ids(body: dict[str, Any], gen: bool) -> list[int]:
        text = tok.apply_chat_template(
            body["messages"], tools=body["tools"], add_generation_prompt=gen, tokenize=False
        )
        return tok.encode(text, add_special_tokens=False)

    args = json.dumps({"expression": "12 + 7"})
    completion = f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'
    c1 = [
        *tok.encode(completion, add_special_tokens=False),
        tok.convert_tokens_to_ids("<|im_end|>"),
    ]
    p1, p2 = ids(first, True), ids(second, True)
    assert p2[: len(p1) + len(c1)] == p1 + c1


@pytest.mark.parametrize("where", ["example", "task"])
async def test_async_agent_against_a_stub_server(stub: StubOpenAI, where: str) -> None:
    from openai import AsyncOpenAI

    agent = load_example("agent_async").agent if where == "example" else calc.agent
    client = AsyncOpenAI(base_url=stub.base_url, api_key="rollout-token")
    answer = await agent({"question": "Ava has 12 and gets 7."}, client)
    assert answer == "The answer is 19."
    check_requests(stub)


async def test_mcp_server_tool_matches_the_task_tool() -> None:
    mcp_agent = load_example("mcp_agent")
    async with mcp_agent.connect() as session:
        tools = (await session.list_tools()).tools
        assert [json.dumps(mcp_agent.openai_tool(t)) for t in tools] == [
            json.dumps(calc.CALCULATOR_TOOL)
        ]
        assert await mcp_agent.call_tool(session, "calculator", '{"expression": "3 * 7"}') == "21"
        bad = await mcp_agent.call_tool(session, "calculator", '{"expression": "x"}')
        assert bad.startswith("error: ")
        assert (await mcp_agent.call_tool(session, "calculator", "not json")).startswith("error")


async def test_mcp_agent_against_a_stub_server(stub: StubOpenAI) -> None:
    from openai import AsyncOpenAI

    mcp_agent = load_example("mcp_agent")
    client = AsyncOpenAI(base_url=stub.base_url, api_key="rollout-token")
    answer = await mcp_agent.solve(client, "Ava has 12 and gets 7.")
    assert answer == "The answer is 19."
    check_requests(stub)


def test_examples_import_nothing_private() -> None:
    for path in EXAMPLE.glob("*.py"):
        text = path.read_text()
        assert "tether." not in text.replace("tether.starter.calc", ""), path.name
