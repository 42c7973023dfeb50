"""Grammar constraints, piece by piece: masked sampling against a slow reference, the
grammars :func:`constraint_for` builds (run through xgrammar's matcher on the starter
tokenizer), the compile cache, and the refusals (fake engines, no xgrammar)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
import torch

from tether.engine import Constraint, SamplingParams, UnsupportedConstraint
from tether.engine._constraint import GrammarBook, masked_logits
from tether.engine._sampling import sample_rows
from tether.engine.testing import NullEngine, ScriptedEngine
from tether.gateway import InvalidRequest, constraint_for

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
STRICT = {
    "type": "function",
    "function": {
        "name": "lookup",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"fruit": {"enum": ["apple", "pear"]}},
            "required": ["fruit"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "Answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}


def reference_sample(logits, allowed, t, top_p, u):
    """One row, plain loops: draw from softmax(masked / T) truncated to top-p."""
    v = len(logits)
    scale = t if t > 0 else 1.0
    masked = [logits[i] / scale if allowed[i] else float("-inf") for i in range(v)]
    m = max(masked)
    weights = [torch.tensor(x - m).exp().item() for x in masked]
    z = sum(weights)
    probs = [w / z for w in weights]
    if t <= 0:
        return max(range(v), key=lambda i: masked[i])
    order = sorted(range(v), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.add(i)
        mass += probs[i]
    cdf, total = [], 0.0
    for i in range(v):
        total += probs[i] if i in kept else 0.0
        cdf.append(total)
    draw = u * cdf[-1]
    return next(i for i in range(v) if cdf[i] > draw)


def test_masked_sampling_matches_reference_and_records_unmasked_logprobs() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, vocab = 64, 12
    logits = torch.randn(rows, vocab, generator=gen) * 3
    allowed = torch.rand(rows, vocab, generator=gen) < 0.4
    allowed[:, 0] = True  # at least one allowed token per row
    temps = torch.tensor([[0.0, 0.7, 1.0, 1.5][b % 4] for b in range(rows)])
    top_p = torch.tensor([[1.0, 0.9, 0.5][b % 3] for b in range(rows)])
    uniforms = torch.rand(rows, generator=gen)
    out = sample_rows(
        logits, temps, top_p, uniforms, sample_logits=logits.masked_fill(~allowed, float("-inf"))
    )
    for b in range(rows):
        want = reference_sample(
            logits[b].tolist(), allowed[b].tolist(), temps[b].item(), top_p[b].item(),
            uniforms[b].item(),
        )  # fmt: skip
        assert out.tokens[b] == want and allowed[b, want]
        scale = temps[b].item() or 1.0
        unmasked = torch.log_softmax(logits[b] / scale, -1)[want].item()
        assert out.logprobs[b] == pytest.approx(unmasked, abs=1e-5)


@pytest.fixture(scope="module")
def book(tokenizer: Any) -> GrammarBook:
    return GrammarBook(tokenizer, len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"))


def accepts(book: GrammarBook, tokenizer: Any, constraint: Constraint, text: str) -> bool:
    """Whether ``text`` + end of turn is a complete output of the grammar."""
    matcher = book.matcher(constraint)
    ids = tokenizer.encode(text, add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return all(matcher.accept_token(t) for t in [*ids, end]) and matcher.is_terminated()


def call(name: str, args: dict, parser: str = "hermes") -> str:
    if parser == "llama3_json":
        return json.dumps({"name": name, "parameters": args})
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def test_forced_tool_grammars(book: GrammarBook, tokenizer: Any) -> None:
    named = constraint_for(
        response_format=None,
        tools=[CALC, STRICT],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    )
    assert named.label == "tool_choice:lookup"
    assert accepts(book, tokenizer, named, call("lookup", {"fruit": "pear"}))
    assert not accepts(book, tokenizer, named, call("lookup", {"fruit": "kiwi"}))
    assert not accepts(book, tokenizer, named, call("calculator", {"expression": "1"}))
    assert not accepts(book, tokenizer, named, "Sure! " + call("lookup", {"fruit": "pear"}))
    two = call("lookup", {"fruit": "pear"}) + "\n" + call("lookup", {"fruit": "apple"})
    assert not accepts(book, tokenizer, named, two)  # one call unless parallel is asked for
    required = constraint_for(
        response_format=None, tools=[CALC, STRICT], tool_choice="required", parallel_tool_calls=True
    )
    assert accepts(book, tokenizer, required, call("calculator", {"expression": "2 * 3"}))
    assert accepts(book, tokenizer, required, two)
    assert not accepts(book, tokenizer, required, "The answer is 6.")
    llama = constraint_for(
        response_format=None, tools=[CALC], tool_choice="required", tool_parser="llama3_json"
    )
    assert accepts(book, tokenizer, llama, call("calculator", {"expression": "1"}, "llama3_json"))
    assert not accepts(book, tokenizer, llama, call("calculator", {"expression": "1"}))


def _allowed_after(book: GrammarBook, constraint: Constraint, ids: list[int]) -> torch.Tensor:
    """Which tokens may follow ``ids`` under ``constraint`` ([V] bool), through the
    engine's own masking (:func:`masked_logits`)."""
    matcher = book.matcher(constraint)
    assert all(matcher.accept_token(t) for t in ids)
    masked = masked_logits(book, torch.zeros(1, book.vocab_size), [matcher])
    return masked[0] > float("-inf")


@pytest.mark.parametrize("bounded", [True, False])
def test_a_string_holds_neither_special_tokens_nor_surrogates(
    book: GrammarBook, tokenizer: Any, bounded: bool
) -> None:
    """Inside a forced call's string the grammar allows no special token but the end of
    turn's successor rules (an ``<|endoftext|>`` there ended the generation, cutting the
    call: CI saw it) and no UTF-16 surrogate as bytes (ED A0 80: not UTF-8; each byte
    decoded to U+FFFD and a maxLength-24 string came back 26 characters long)."""
    schema = {"type": "string", "maxLength": 24} if bounded else {"type": "string"}
    tool = {**CALC, "function": {**CALC["function"], "parameters": {
        "type": "object", "properties": {"expression": schema}, "required": ["expression"],
    }}}  # fmt: skip
    forced = constraint_for(response_format=None, tools=[tool], tool_choice="required")
    opened = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1'
    ids = tokenizer.encode(opened, add_special_tokens=False)
    allowed = _allowed_after(book, forced, ids)
    assert allowed[tokenizer.encode("2", add_special_tokens=False)[0]]
    for special in tokenizer.all_special_ids:
        assert not allowed[special], tokenizer.convert_ids_to_tokens(special)
    byte = {b: t for t, b in _byte_decoder(tokenizer).items()}
    lead = tokenizer.convert_tokens_to_ids(byte[0xED])
    after_lead = _allowed_after(book, forced, [*ids, lead])
    assert after_lead[tokenizer.convert_tokens_to_ids(byte[0x9F])]  # ED 9F BF is U+D7FF
    assert not after_lead[tokenizer.convert_tokens_to_ids(byte[0xA0])]  # ED A0 .. a surrogate


def _byte_decoder(tokenizer: Any) -> dict[str, int]:
    """The byte-level tokenizer's one-character tokens → the byte each stands for."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: b for b, char in bytes_to_unicode().items()}


def test_strict_tools_under_auto_and_json_or_tools(book: GrammarBook, tokenizer: Any) -> None:
    auto = constraint_for(response_format=None, tools=[CALC, STRICT], tool_choice="auto")
    assert auto.label == "strict_tools"
    assert accepts(book, tokenizer, auto, "The answer is 6.")
    assert accepts(book, tokenizer, auto, "Let me look. " + call("lookup", {"fruit": "apple"}))
    assert not accepts(book, tokenizer, auto, call("lookup", {"fruit": "apple", "x": 1}))
    assert accepts(book, tokenizer, auto, call("calculator", {"expression": "1", "x": 2}))
    # Without a strict tool nothing is constrained; with tool_choice "none" neither.
    assert constraint_for(response_format=None, tools=[CALC], tool_choice="auto") is None
    assert constraint_for(response_format=None, tools=[STRICT], tool_choice="none") is None
    either = constraint_for(response_format=ANSWER, tools=[CALC], tool_choice=None)
    assert either.label == "json_schema:Answer"
    assert accepts(book, tokenizer, either, '{"answer": 42}')
    assert accepts(book, tokenizer, either, call("calculator", {"expression": "1"}))
    assert not accepts(book, tokenizer, either, "42")
    only = constraint_for(response_format=ANSWER, tools=None, tool_choice=None)
    assert accepts(book, tokenizer, only, '{"answer": 42}')
    assert not accepts(book, tokenizer, only, '{"answer":42}')  # json.dumps' separators
    assert not accepts(book, tokenizer, only, '{"answer": 42, "more": 1}')


def test_grammars_are_compiled_once_and_evicted_lru(tokenizer: Any) -> None:
    book = GrammarBook(tokenizer, len(tokenizer), 0, size=2)
    a, b, c = (
        constraint_for(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": n, "schema": {"enum": [n]}},
            },
            tools=None,
            tool_choice=None,
        )
        for n in "abc"
    )
    assert hash(a) == hash(
        constraint_for(response_format=a_format("a"), tools=None, tool_choice=None)
    )
    book.matcher(a), book.matcher(a), book.matcher(b)
    assert book.compiled == 2
    book.matcher(a)  # a is now the most recent: c evicts b
    book.matcher(c)
    book.matcher(a)
    assert book.compiled == 3
    book.matcher(b)
    assert book.compiled == 4


def a_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": {"enum": [name]}}}


def test_fake_engines_refuse_a_constraint(tokenizer: Any) -> None:
    constraint = constraint_for(response_format=ANSWER, tools=None, tool_choice=None)
    params = SamplingParams(constraint=constraint)
    for engine in (NullEngine([1, 2]), ScriptedEngine(["{}"], tokenizer=tokenizer)):
        with pytest.raises(UnsupportedConstraint, match="cannot honour a grammar constraint"):
            asyncio.run(engine.generate([1, 2, 3], params))
        assert engine.num_calls == 0


def test_without_xgrammar_a_constrained_request_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now fails
    with pytest.raises(InvalidRequest) as err:
        constraint_for(response_format=ANSWER, tools=None, tool_choice=None)
    assert "pip install 'tether[structured]'" in err.value.message
    assert (
        constraint_for(response_format={"type": "text"}, tools=[CALC], tool_choice="auto") is None
    )


def test_responses_text_format_maps_to_the_same_grammar() -> None:
    """The Responses API's ``text.format`` (flat) builds the chat ``response_format``'s grammar."""
    flat = {"type": "json_schema", **ANSWER["json_schema"]}
    chat = constraint_for(response_format=ANSWER, tools=None, tool_choice=None)
    assert constraint_for(response_format=flat, tools=None, tool_choice=None) == chat
    responses_tool = {"type": "function", **STRICT["function"]}  # name/parameters at top level
    assert constraint_for(
        response_format=None, tools=[responses_tool], tool_choice="required"
    ) == constraint_for(response_format=None, tools=[STRICT], tool_choice="required")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"tools": [CALC, {**STRICT, "function": {**STRICT["function"], "parameters": {
                "type": "object", "properties": ["fruit"]}}}],
             "tool_choice": {"type": "function", "function": {"name": "lookup"}}},
            "tools[1].function.parameters",
            "properties at # must be an object",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {
                "anyOf": {"type": "string"}}}}},
            "response_format.json_schema",
            "anyOf at # must be a list",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {
                "$ref": "https://example.com/s.json"}}}},
            "response_format.json_schema",
            "only local $ref",
        ),
        ({"tools": [CALC], "tool_choice": "required", "tool_parser": "none"}, "tool_choice",
         "tool_parser is 'none'"),
    ],
)  # fmt: skip
def test_malformed_requests_name_the_field(fields: dict, param: str, words: str) -> None:
    kw = {"response_format": None, "tools": None, "tool_choice": None, **fields}
    with pytest.raises(InvalidRequest) as err:
        constraint_for(**kw)
    assert err.value.param == param and words in err.value.message, err.value.message
