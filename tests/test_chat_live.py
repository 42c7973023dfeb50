"""tether.chat.LiveText / live_prefix: what is streamed always begins the final content.

The reference is the non-streamed path: decode the completion, trim the stop
strings, parse the tool calls (all or nothing), take the message's content.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tether.chat import LiveText, decode_completion, get_parser
from tether.chat._incremental import live_prefix

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
LLAMA = '{"name": "calculator", "parameters": {"expression": "%s"}}'
PIECES = [
    "Let me think. ",
    "  ",
    "\n",
    "héllo wörld ✓ ",
    "数学 ",
    CALL % "1 + 2",
    CALL % "3 * 4",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',  # bad
    "</tool_call>",
    "<tool",
    "STOP",
    "ST",
    "<|python_tag|>",
    LLAMA % "5 - 1",
    ";",
    "{",
    " done.",
]


def final_content(text: str, parser_name: str | None, stops: tuple[str, ...]) -> str:
    cut = min((i for s in stops if (i := text.find(s)) >= 0), default=-1)
    text = text[:cut] if cut >= 0 else text
    if parser_name is None:
        return text
    parsed = get_parser(parser_name).parse(text)
    return (parsed.content or "") if parsed.tool_calls else text


def texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))) for _ in range(count)]


@pytest.mark.parametrize("parser_name", [None, "none", "hermes", "llama3_json", "custom"])
def test_every_live_prefix_begins_the_final_content(parser_name: str | None) -> None:
    """Character by character over 400 random completions (pure function)."""
    ref_parser = parser_name if parser_name not in ("none", "custom") else None
    if parser_name == "custom":
        ref_parser = "hermes"  # an unknown parser may do anything: nothing is released
    for text in texts(1, 400):
        want = final_content(text, ref_parser, ())
        for k in range(len(text) + 1):
            shown = text[:k][: live_prefix(parser_name, text[:k])]
            assert want.startswith(shown), (text, k, shown, want)
            if parser_name == "custom":
                assert shown == ""


@pytest.mark.parametrize("parser_name", [None, "hermes", "llama3_json"])
@pytest.mark.parametrize("stops", [(), ("STOP",), ("ST", "é")])
def test_live_text_token_by_token_matches_the_plain_path(
    tokenizer: Any, parser_name: str | None, stops: tuple[str, ...]
) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    released = 0
    for i, text in enumerate(texts(2, 150)):
        ids = tokenizer.encode(text, add_special_tokens=False) + ([end] if i % 2 else [])
        live = LiveText(tokenizer, stop_token_ids=(end,), stop=stops, parser_name=parser_name)
        sent = ""
        want = final_content(
            decode_completion(tokenizer, ids, stop_token_ids=(end,)), parser_name, stops
        )
        for tok in ids:
            sent += live.feed(tok)
            assert want.startswith(sent), (text, sent, want)
        released += len(sent)
        assert sent + live.rest(want) == want
    assert released > 1000  # most text is streamed live, not held to the end


def test_text_is_released_before_the_end(tokenizer: Any) -> None:
    text = "The answer is forty-two, as computed."
    live = LiveText(tokenizer, parser_name="hermes")
    ids = tokenizer.encode(text, add_special_tokens=False)
    sent = [live.feed(t) for t in ids]
    assert sum(1 for s in sent if s) >= len(ids) - 2 and "".join(sent) == text
