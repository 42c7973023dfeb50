"""tether.chat: rendering and tool-call parsing, on a tiny ChatML tokenizer.

Live streaming (``gateway/_sse.py``) is tested end to end in ``test_gateway_stream.py``.
"""

from __future__ import annotations

import json
from random import Random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

import tether.chat as chat
from tether.chat import (
    ChatError,
    InvalidMessages,
    ParsedMessage,
    get_parser,
    render_prompt,
    render_text,
)
from tether.chat._parsers import CallIds, random_call_id
from tether.chat._prompt import turn_token
from tether.chat._render import normalize_messages
from tether.chat.testing import tiny_chat_tokenizer

PARAMS = {"type": "object", "properties": {"expression": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": PARAMS}}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "3 + 4"}'},
}
USER = {"role": "user", "content": "hi"}
CONVERSATION = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "7"},
    {"role": "assistant", "content": "It is 7."},
    {"role": "user", "content": "Thanks"},
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def starter_tok(tmp_path_factory: pytest.TempPathFactory):
    starter = pytest.importorskip("tether.starter")
    from tether.models import load_tokenizer

    return load_tokenizer(starter.build_starter(cache_dir=tmp_path_factory.mktemp("s")))


@pytest.fixture(scope="module", params=["tiny", "starter"])
def any_tok(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return request.getfixturevalue("tok" if request.param == "tiny" else "starter_tok")


# --- rendering ---------------------------------------------------------------------------


def test_render_full_conversation(tok: PreTrainedTokenizerFast) -> None:
    text = render_text(tok, CONVERSATION, TOOLS)
    tools_json = json.dumps(TOOLS[0], ensure_ascii=False)
    assert text == (
        f"<|im_start|>system\nUse tools.\n\n# Tools\n\n<tools>\n{tools_json}\n</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", '
        '"arguments": {"expression": "3 + 4"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 7.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = render_text(tok, CONVERSATION, TOOLS, add_generation_prompt=False)
    assert text == no_prompt + "<|im_start|>assistant\n"


def test_ids_match_transformers_and_decode_back(tok: PreTrainedTokenizerFast) -> None:
    ids = render_prompt(tok, CONVERSATION, TOOLS)
    text = render_text(tok, CONVERSATION, TOOLS)
    msgs = normalize_messages(CONVERSATION)
    ref = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    assert ids == list(getattr(ref, "input_ids", ref))
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.convert_tokens_to_ids("<tool_call>") in ids


def test_string_and_dict_arguments_render_the_same(tok: PreTrainedTokenizerFast) -> None:
    as_dict = json.loads(json.dumps(CONVERSATION))
    as_dict[2]["tool_calls"][0]["function"]["arguments"] = {"expression": "3 + 4"}
    assert render_prompt(tok, as_dict) == render_prompt(tok, CONVERSATION)
    assert '"arguments": {"expression"' in render_text(tok, CONVERSATION)


def test_content_parts_developer_and_pydantic_messages(tok: PreTrainedTokenizerFast) -> None:
    from openai.types.chat import ChatCompletionMessage

    parts = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ChatCompletionMessage.model_validate({"role": "assistant", "tool_calls": [CALL]}),
    ]
    plain = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ]
    assert render_text(tok, parts) == render_text(tok, plain)
    assert normalize_messages(parts)[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {**CALL, "function": {"name": "calculator", "arguments": {"expression": "3 + 4"}}}
        ],
    }


def test_normalize_keeps_input_and_odd_arguments() -> None:
    original = json.loads(json.dumps(CONVERSATION))
    normalize_messages(original)
    assert original == CONVERSATION
    odd = [{"role": "assistant", "content": "x", "tool_calls": [dict(CALL)]}]
    for sent, expected in [
        ("not json", "not json"),
        ("", {}),
        ("[1]", "[1]"),
        ('{"a": 1}', {"a": 1}),
    ]:
        odd[0]["tool_calls"][0] = {**CALL, "function": {"name": "f", "arguments": sent}}
        assert normalize_messages(odd)[0]["tool_calls"][0]["function"]["arguments"] == expected


BAD_MESSAGES = {
    "messages must be a list": {"role": "user", "content": "hi"},
    "at least one": [],
    r"messages\[1\] must be an object": [{"role": "user", "content": "a"}, "hi"],
    r"messages\[0\]\.role is missing": [{"content": "a"}],
    r"messages\[1\]\.role is 'robot'": [USER, {"role": "robot", "content": "b"}],
    r"messages\[1\]\.content is missing": [USER, {"role": "user"}],
    r"messages\[0\]\.content is missing": [{"role": "assistant", "content": None}],
    r"messages\[0\]\.content must be": [{"role": "user", "content": 5}],
    r"messages\[0\]\.content\[0\] has type 'image_url'": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    ],
    r"messages\[0\]\.tool_calls is only allowed": [{**USER, "tool_calls": [CALL]}],
    r"messages\[0\]\.tool_calls\[0\]\.function\.name": [
        {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}
    ],
}


@pytest.mark.parametrize("match", BAD_MESSAGES)
def test_invalid_messages(tok: PreTrainedTokenizerFast, match: str) -> None:
    with pytest.raises(InvalidMessages, match=match) as info:
        render_prompt(tok, BAD_MESSAGES[match])
    assert isinstance(info.value, ChatError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, chat.UnsupportedContent) == ("image_url" in match)


def test_invalid_tools_and_template_errors(tok: PreTrainedTokenizerFast) -> None:
    user = [USER]
    with pytest.raises(InvalidMessages, match=r"tools\[0\]\.function\.name"):
        render_prompt(tok, user, [{"type": "function", "function": {}}])
    with pytest.raises(InvalidMessages, match="tools must be a list"):
        render_prompt(tok, user, {"type": "function"})
    strict = tok.__class__(tokenizer_object=tok.backend_tokenizer)
    strict.chat_template = "{{ raise_exception('only one user message') }}"
    with pytest.raises(chat.TemplateRenderError, match="only one user message"):
        render_text(strict, user)
    strict.chat_template = None
    with pytest.raises(chat.MissingChatTemplate, match="no chat template"):
        render_prompt(strict, user)


def test_continue_final_message_and_decode_completion(tok: PreTrainedTokenizerFast) -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer"}]
    assert render_text(tok, msgs, continue_final_message=True).endswith("assistant\nThe answer")
    completion = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    ids = [*tok.encode(completion, add_special_tokens=False), tok.eos_token_id]
    assert chat.decode_completion(tok, ids) == completion
    assert chat.decode_completion(tok, ids[:-1], stop_token_ids=[]) == completion


# --- parsers -----------------------------------------------------------------------------


def test_hermes_single_several_and_content() -> None:
    hermes = get_parser("hermes")
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"q": "ünï </tool_call>"}}\n</tool_call>'
    )
    parsed = hermes.parse(text, new_id=CallIds())
    assert parsed.content == "Let me compute."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["calculator", "search"]
    assert parsed.tool_calls[0] == {
        "id": "call_" + "0" * 24,
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "3 + 4"}'},
    }
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"q": "ünï </tool_call>"}
    only = hermes.parse('<tool_call>{"name": "f"}</tool_call>\n')
    assert only.content is None and only.tool_calls[0]["function"]["arguments"] == "{}"
    assert hermes.parse("Just text.") == ParsedMessage(content="Just text.")


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>',  # bad JSON
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # missing name
        '<tool_call>\n{"name": "f", "arguments": {}}',  # unterminated
        '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',  # non-string name
        '<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>',  # not JSON
        '<tool_call>\n["f"]\n</tool_call>',  # not an object
        '</tool_call><tool_call>{"name": "f"}</tool_call>',  # stray close tag
        '<tool_call>{"name": "f"}</tool_call><tool_call>',  # good, then unterminated
    ],
)
def test_hermes_malformed_is_content(text: str) -> None:
    assert get_parser("hermes").parse(text) == ParsedMessage(content=text)


def test_llama3_json() -> None:
    llama = get_parser("llama3_json")
    parsed = llama.parse(
        '<|python_tag|>{"name": "f", "parameters": {"a": [1, 2]}}', new_id=CallIds()
    )
    assert parsed.content is None
    assert parsed.tool_calls[0]["function"] == {"name": "f", "arguments": '{"a": [1, 2]}'}
    two = llama.parse(' {"name": "f", "parameters": {}}; {"name": "g", "arguments": {"b": 1}} ')
    assert [c["function"]["name"] for c in two.tool_calls] == ["f", "g"]
    assert two.tool_calls[0]["id"] != two.tool_calls[1]["id"]
    for text in [
        'Sure: {"name": "f", "parameters": {}}',
        '{"name": "f", "parameters": {}} and more',
        '{"name": "f", "parameters": 3}',
        '{"parameters": {}}',
        '{"name": "f"',
        "plain answer",
    ]:
        assert llama.parse(text) == ParsedMessage(content=text)


def test_registry_ids_and_finish_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.chat import _parsers

    monkeypatch.setattr(_parsers, "_REGISTRY", dict(_parsers._REGISTRY))
    assert {"hermes", "llama3_json", "none"} <= set(chat.parser_names())
    assert get_parser("none").parse("<tool_call>{}</tool_call>").tool_calls == []
    with pytest.raises(chat.UnknownParser, match=r"unknown tool-call parser 'mistral'.*hermes"):
        get_parser("mistral")
    with pytest.raises(ChatError, match="already registered"):
        chat.register_parser(get_parser("none"))
    chat.register_parser(_parsers.PlainParser(), replace=True)
    assert CallIds(Random(1))() == CallIds(Random(1))() != CallIds(Random(2))()
    ids = {random_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    call = ParsedMessage(content=None, tool_calls=[{"id": "c", "type": "function", "function": {}}])
    assert chat.finish_reason_for(call, "stop") == "tool_calls"
    assert chat.finish_reason_for(call, "length") == "length"
    assert chat.finish_reason_for(ParsedMessage(content="x"), "stop") == "stop"
    assert call.to_message()["tool_calls"] == call.tool_calls
    assert "tool_calls" not in ParsedMessage(content="x").to_message()


# --- properties --------------------------------------------------------------------------

MARKUP = (
    st.sampled_from(["<tool_call>", "</tool_call>", "<|python_tag|>", " ", "\n", ":", ","])
    | (st.sampled_from(["{", "}", "[", "]", ";", "{}", "NaN", "1", '"f"', '"name"', '"arguments"']))
    | st.sampled_from(['"parameters"', '"\\ud800"'])
)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | st.integers() | FLOATS | st.text(max_size=9)
JSON = st.recursive(
    SCALARS,
    lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=5), v, max_size=3),
    max_leaves=8,
)
ARGS = st.dictionaries(st.text(max_size=5), JSON, max_size=3)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
HERMES_CALL = st.builds(
    lambda n, a: f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>",
    NAMES,
    ARGS,
)
LLAMA_CALL = st.builds(lambda n, a: json.dumps({"name": n, "parameters": a}), NAMES, ARGS)
PIECES = st.one_of(MARKUP, st.text(max_size=8), HERMES_CALL, LLAMA_CALL)
TEXTS = st.lists(PIECES, max_size=12).map("".join)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(text=TEXTS, name=st.sampled_from(["hermes", "llama3_json", "none"]))
def test_any_text_parses_or_is_content(text: str, name: str) -> None:
    parsed = get_parser(name).parse(text, new_id=CallIds())
    if not parsed.tool_calls:
        assert parsed.content == text
    for call in parsed.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert isinstance(call["function"]["name"], str) and call["function"]["name"]
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
        call["function"]["arguments"].encode("utf-8")
    assert len({c["id"] for c in parsed.tool_calls}) == len(parsed.tool_calls)


@FAST
@given(
    calls=st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=3),
    content=st.text(max_size=20).filter(lambda s: "tool_call>" not in s),
)
def test_round_trip_through_template(any_tok: PreTrainedTokenizerFast, calls, content) -> None:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)
    ]
    msgs = [{"role": "user", "content": "go"}]
    head = render_text(any_tok, msgs)
    full = render_text(
        any_tok,
        [*msgs, {"role": "assistant", "content": content, "tool_calls": tool_calls}],
        add_generation_prompt=False,
    )
    assert full.startswith(head) and full.endswith("<|im_end|>\n")
    completion = full[len(head) : -len("<|im_end|>\n")]
    parsed = get_parser("hermes").parse(completion, new_id=CallIds())
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]
    assert got == [(n, json.loads(json.dumps(a))) for n, a in calls]
    assert parsed.content == (content.rstrip() or None)
    if content == content.rstrip():  # the parsed message re-renders to what the model wrote
        again = render_text(any_tok, [*msgs, parsed.to_message()], add_generation_prompt=False)
        assert again == full


# --- the starter tokenizer ---------------------------------------------------------------


def test_starter_calc_turn_is_prefix_stable(starter_tok) -> None:
    """prompt₂ extends prompt₁ + completion₁ token for token, through parse and re-render."""
    from tether.engine import end_of_turn_ids
    from tether.starter import calc

    msgs = [{"role": "system", "content": calc.SYSTEM_PROMPT}, {"role": "user", "content": "3+4?"}]
    prompt1 = render_prompt(starter_tok, msgs, [calc.CALCULATOR_TOOL])
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>'
    completion = [*starter_tok.encode(text, add_special_tokens=False), starter_tok.eos_token_id]
    decoded = chat.decode_completion(
        starter_tok, completion, stop_token_ids=list(end_of_turn_ids(starter_tok))
    )
    parsed = get_parser("hermes").parse(decoded)
    assert parsed.content is None and parsed.tool_calls[0]["function"]["name"] == "calculator"
    call_id = parsed.tool_calls[0]["id"]
    tool = {"role": "tool", "tool_call_id": call_id, "content": calc.calculator("3 + 4")}
    prompt2 = render_prompt(starter_tok, [*msgs, parsed.to_message(), tool], [calc.CALCULATOR_TOOL])
    assert prompt2[: len(prompt1) + len(completion)] == prompt1 + completion


def test_prompt_encoder_reuses_prefixes_and_stays_token_exact(tokenizer) -> None:
    """A growing conversation: every prompt encodes as the whole text does, with reuse."""
    enc = chat.PromptEncoder(tokenizer)
    assert enc.turn is not None and enc.turn[0] == "<|im_start|>"
    messages = [{"role": "system", "content": "Use tools."}, USER]
    for i in range(4):
        text = render_text(tokenizer, messages, TOOLS)
        assert enc.encode(text) == tokenizer.encode(text, add_special_tokens=False)
        messages += [
            {"role": "assistant", "content": f"step {i} 3 + {i}"},
            {"role": "user", "content": f"and {i}?"},
        ]
    assert enc.hits >= 3 and enc.tokens_reused > 0


def test_prompt_encoder_never_cuts_a_slow_tokenizer() -> None:
    class Slow:
        is_fast = False

    assert turn_token(Slow()) is None
