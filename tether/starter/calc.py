"""The calc task: arithmetic word problems solved with a ``calculator`` tool.

This is the task of the CPU demo and the tests. It holds the agent's system
prompt and tool (``examples/calc/agent.py`` keeps its own copies, checked
equal by a test), the task generator with disjoint ``train``/``val`` splits,
the grader, a safe calculator, and the synthetic transcripts the starter
model is warmed up on.

    >>> tasks = make_tasks(2, "val", seed=0)
    >>> sorted(tasks[0])
    ['grader', 'id', 'question']
    >>> grade(tasks[0], f"The answer is {tasks[0]['grader']['answer']}.")
    1.0

A task's answer is in its ``grader`` object: the grader gets it, the agent
never does (it receives ``{"id", "question"}``; see the agent contract, docs/quickstart-agent.md).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import operator
import random
import re
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tether.starter._errors import CalcError

__all__ = [
    "CALCULATOR_TOOL",
    "MAX_CALLS",
    "MODEL",
    "SYSTEM_PROMPT",
    "TRANSCRIPT_KINDS",
    "CalcError",
    "Problem",
    "agent",
    "calculator",
    "fingerprint",
    "format_number",
    "grade",
    "iter_problems",
    "last_number",
    "make_problems",
    "make_tasks",
    "safe_eval",
    "transcript",
]

SYSTEM_PROMPT = "You are a math assistant. Use the calculator, then reply: The answer is N."

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "e.g. 12 * (3 + 4)",
                }
            },
            "required": ["expression"],
        },
    },
}

SPLITS = ("train", "val")
KINDS = ("add", "sub", "mul", "div", "muladd", "addsub", "summul")
_VAL_BUCKETS = 5  # one question in five (by hash) belongs to val


# ---------------------------------------------------------------- calculator

_MAX_EXPRESSION_CHARS = 200
_MAX_NODES = 64
_MAX_MAGNITUDE = 1e15
_MAX_EXPONENT = 10
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def safe_eval(expression: str) -> int | float:
    """Evaluate ``+ - * /`` (and small ``**``) over numbers, without ``eval``.

    Raises :class:`CalcError` for anything else (names, attributes, calls),
    division by zero, exponents above 10, or results above 1e15.
    """
    if not isinstance(expression, str):
        raise CalcError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        with warnings.catch_warnings():  # e.g. "invalid decimal literal" for 3x: not ours to print
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an arithmetic expression: {expression!r}") from exc
    if sum(1 for _ in ast.walk(tree)) > _MAX_NODES:
        raise CalcError(f"expression has more than {_MAX_NODES} parts")
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError(f"only numbers are allowed, got {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        if isinstance(node.op, ast.Pow) and (abs(right) > _MAX_EXPONENT or left == 0 > right):
            raise CalcError(f"exponent {right} is out of range (|exponent| <= {_MAX_EXPONENT})")
        return _checked(_BINARY[type(node.op)](left, right))
    raise CalcError(f"{type(node).__name__} is not allowed; use numbers, + - * / and parentheses")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex) or not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
        raise CalcError(f"result is out of range (|x| <= {_MAX_MAGNITUDE:.0e})")
    return value


def format_number(value: int | float) -> str:
    """How the calculator prints a number: integers without ``.0``, else up to 6 decimals."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}".rstrip("0").rstrip(".")


def calculator(expression: str) -> str:
    """The tool as the agent runs it: the formatted result, or ``error: …``."""
    try:
        return format_number(safe_eval(expression))
    except CalcError as exc:
        return f"error: {exc}"


# -------------------------------------------------------------------- grader

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def last_number(text: str | None) -> float | None:
    """The last number in ``text`` (thousands separators allowed), or None."""
    if not text:
        return None
    found = _NUMBER.findall(_THOUSANDS.sub("", text))
    return float(found[-1]) if found else None


def grade(task: dict[str, Any], answer_text: str | None) -> float:
    """1.0 if the last number in ``answer_text`` equals the task's answer, else 0.0.

    The answer is ``task["grader"]["answer"]`` (grader-only data, never given to the
    agent), or ``task["answer"]`` in a task file written before tether kept it apart."""
    got = last_number(answer_text)
    if got is None:
        return 0.0
    expected = task["grader"]["answer"] if "grader" in task else task["answer"]
    return 1.0 if math.isclose(got, float(expected), rel_tol=1e-9, abs_tol=1e-6) else 0.0


# ------------------------------------------------------------------ problems


@dataclass(frozen=True)
class Problem:
    """One word problem with the expression that solves it."""

    question: str
    expression: str
    answer: int
    kind: str = ""  # the template's kind: add, sub, mul, div, muladd, addsub, summul

    def task(self, task_id: str) -> dict[str, Any]:
        return {"id": task_id, "question": self.question, "grader": {"answer": self.answer}}


_NAMES = (
    "Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lena",
    "Max", "Nina", "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wen", "Yara", "Zoe",
)  # fmt: skip
_ITEMS = (
    "apples", "books", "coins", "pencils", "stamps", "marbles", "cards", "shells", "stickers",
    "cookies", "beads", "eggs", "tickets", "flowers", "nails", "boxes", "cups", "rocks",
)  # fmt: skip
_GROUPS = ("bags", "boxes", "crates", "jars", "packs", "baskets", "shelves", "trays")

# (template, expression, kind). Kinds pick the numbers; {a} {b} {c} fill both.
# Numbers appear in the expression in the order the question states them.
_TEMPLATES: tuple[tuple[str, str, str], ...] = (
    ("{n} has {a} {i}. {n} gets {b} more {i}. How many {i} does {n} have now?", "{a} + {b}", "add"),
    ("There are {a} {i} in one room and {b} {i} in another. How many {i} are there in all?",
     "{a} + {b}", "add"),
    ("{n} had {a} {i} and gave away {b}. How many {i} are left?", "{a} - {b}", "sub"),
    ("A shop had {a} {i}. It sold {b} of them. How many {i} does the shop have left?",
     "{a} - {b}", "sub"),
    ("{n} has {a} {g} with {b} {i} in each. How many {i} does {n} have?", "{a} * {b}", "mul"),
    ("Each of {a} {g} holds {b} {i}. How many {i} are there in total?", "{a} * {b}", "mul"),
    ("{n} shares {a} {i} equally among {b} friends. How many {i} does each friend get?",
     "{a} / {b}", "div"),
    ("{a} {i} are packed into {b} {g} equally. How many {i} go in each?", "{a} / {b}", "div"),
    ("{n} buys {a} {g} of {b} {i} and finds {c} more {i}. How many {i} does {n} have?",
     "{a} * {b} + {c}", "muladd"),
    ("{n} has {a} {i} and gets {b} more, then gives away {c}. How many {i} are left?",
     "{a} + {b} - {c}", "addsub"),
    ("Each of {c} {g} has {a} red {i} and {b} blue {i}. How many {i} are there in total?",
     "{c} * ({a} + {b})", "summul"),
)  # fmt: skip


def _numbers(kind: str, rng: random.Random) -> dict[str, int]:
    if kind == "add":
        return {"a": rng.randint(10, 999), "b": rng.randint(10, 999)}
    if kind == "sub":
        a = rng.randint(20, 999)
        return {"a": a, "b": rng.randint(1, a - 1)}
    if kind == "mul":
        return {"a": rng.randint(2, 40), "b": rng.randint(3, 99)}
    if kind == "div":
        b, q = rng.randint(2, 19), rng.randint(2, 60)
        return {"a": b * q, "b": b}
    if kind == "muladd":
        return {"a": rng.randint(2, 20), "b": rng.randint(3, 40), "c": rng.randint(1, 99)}
    if kind == "addsub":
        a, b = rng.randint(10, 500), rng.randint(10, 500)
        return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}
    if kind == "summul":
        return {"a": rng.randint(2, 50), "b": rng.randint(2, 50), "c": rng.randint(2, 12)}
    raise ValueError(f"unknown problem kind {kind!r}")


def _random_problem(rng: random.Random) -> Problem:
    template, expr_template, kind = rng.choice(_TEMPLATES)
    nums = _numbers(kind, rng)
    fill = {"n": rng.choice(_NAMES), "i": rng.choice(_ITEMS), "g": rng.choice(_GROUPS), **nums}
    expression = expr_template.format(**nums)
    return Problem(template.format(**fill), expression, int(safe_eval(expression)), kind)


def split_of(question: str) -> str:
    """The split a question belongs to, fixed by its hash (so splits never overlap)."""
    digest = hashlib.sha256(question.encode()).digest()
    return "val" if digest[0] % _VAL_BUCKETS == 0 else "train"


def iter_problems(split: str, seed: int = 0) -> Iterator[Problem]:
    """An endless stream of problems of ``split`` (repeats possible), fixed by ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"split ({split!r}) must be one of {SPLITS}")
    rng = random.Random(f"tether-calc:{split}:{seed}")
    while True:
        problem = _random_problem(rng)
        if split_of(problem.question) == split:
            yield problem


def make_problems(n: int, split: str, seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split``, the same for the same ``seed``."""
    if n < 0:
        raise ValueError(f"n ({n}) must be >= 0")
    seen: set[str] = set()
    out: list[Problem] = []
    for problem in iter_problems(split, seed):
        if len(out) >= n:
            break
        if problem.question not in seen:
            seen.add(problem.question)
            out.append(problem)
    return out


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks (``{"id", "question", "grader": {"answer"}}``, JSON-ready) of ``split``.

    Train and val never share a question, whatever the seeds.
    """
    return [
        p.task(f"calc-{split}-{seed}-{i:05d}") for i, p in enumerate(make_problems(n, split, seed))
    ]


# --------------------------------------------------------------- transcripts

TRANSCRIPT_KINDS = ("clean", "skip_tool", "wrong_expression", "miscopy")


def answer_text(value: int | float | str) -> str:
    return f"The answer is {value if isinstance(value, str) else format_number(value)}."


def tool_call_message(expression: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant message that calls ``calculator`` (arguments as a dict)."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": expression}},
            }
        ],
    }


def _perturb(value: int, rng: random.Random) -> int:
    """A nearby wrong integer: one digit changed, or off by a little."""
    digits = list(str(abs(value)))
    if rng.random() < 0.5 and len(digits) > 1:
        pos = rng.randrange(len(digits))
        choices = [d for d in "0123456789" if d != digits[pos] and not (pos == 0 and d == "0")]
        digits[pos] = rng.choice(choices)
        wrong = int("".join(digits))
    else:
        wrong = abs(value) + rng.choice([-1, 1]) * rng.randint(1, 12)
    wrong = wrong if wrong != abs(value) else abs(value) + 1
    return -wrong if value < 0 else wrong


def _wrong_expression(expression: str, rng: random.Random) -> str:
    """Swap one operator, or change one operand."""
    tokens = re.findall(r"\d+|[-+*/()]", expression)
    ops = [i for i, t in enumerate(tokens) if t in "+-*/"]
    nums = [i for i, t in enumerate(tokens) if t.isdigit()]
    for _ in range(10):
        out = list(tokens)
        if rng.random() < 0.5:
            i = rng.choice(ops)
            out[i] = rng.choice([o for o in "+-*" if o != out[i]])
        else:
            i = rng.choice(nums)
            out[i] = str(max(1, _perturb(int(out[i]), rng)))
        candidate = " ".join(out).replace("( ", "(").replace(" )", ")")
        if calculator(candidate) != calculator(expression) and not calculator(candidate).startswith(
            "error"
        ):
            return candidate
    return expression


def transcript(problem: Problem, kind: str, rng: random.Random) -> list[dict[str, Any]]:
    """The messages of one synthetic agent run, ``kind`` one of :data:`TRANSCRIPT_KINDS`.

    ``clean`` calls the calculator with the right expression and copies its
    result; the others make the mistakes RL should remove.
    """
    head = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": problem.question},
    ]
    if kind == "skip_tool":
        return [*head, {"role": "assistant", "content": answer_text(_perturb(problem.answer, rng))}]
    expression = problem.expression
    if kind == "wrong_expression":
        expression = _wrong_expression(expression, rng)
    elif kind not in ("clean", "miscopy"):
        raise ValueError(f"kind ({kind!r}) must be one of {TRANSCRIPT_KINDS}")
    result = calculator(expression)
    final = answer_text(result)
    if kind == "miscopy":
        final = answer_text(_perturb(int(float(result)), rng))
    return [
        *head,
        tool_call_message(expression),
        {"role": "tool", "tool_call_id": "call_0", "content": result},
        {"role": "assistant", "content": final},
    ]


def fingerprint() -> str:
    """A digest of what the generators produce (problems and each transcript kind).

    Part of the starter's cache key, so a change to the problem templates, the
    number ranges or the transcript mistakes never reuses a stale build.
    """
    rng = random.Random("tether-calc-fingerprint")
    sample: list[Any] = []
    for problem in make_problems(40, "train", seed=0) + make_problems(10, "val", seed=0):
        sample.append([problem.question, problem.expression, problem.answer, problem.kind])
        sample.append([transcript(problem, kind, rng) for kind in TRANSCRIPT_KINDS])
    blob = json.dumps([SYSTEM_PROMPT, CALCULATOR_TOOL, sample], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tool_arguments_json(expression: str) -> str:
    """The ``arguments`` string of a canonical calculator call (as the model writes it)."""
    return json.dumps({"expression": expression})


# --------------------------------------------------------------------- agent

MODEL = "policy"
MAX_CALLS = 4


def run_tool_call(name: str, arguments: str) -> str:
    """Run one OpenAI tool call (``arguments`` a JSON string); errors come back as text."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        return calculator(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


async def agent(
    task: dict[str, Any],
    client: Any,
    run_tool: Callable[[str, str], str | Awaitable[str]] = run_tool_call,
) -> str:
    """The calc agent as an in-process callable (``examples/calc/agent_async.py``).

    ``client`` is an ``openai.AsyncOpenAI`` pointed at the rollout. At most
    :data:`MAX_CALLS` model calls; tool calls go to ``run_tool(name, arguments)``
    (the local calculator; a coroutine function stands in for a remote tool);
    returns the final answer text (the grader turns it into the reward).
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=128
        )
        message = response.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            if inspect.isawaitable(result):
                result = await result
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer.strip()
