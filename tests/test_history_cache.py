"""tether.chat.HistoryCache: rendering only a conversation's new turns gives the full render's
ids, token for token, on many random multi-turn conversations with tool calls; anything that
is not an extension of the previous call takes the full path."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from tether.chat import HistoryCache, render_prompt, render_text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
    for name in ("calculator", "search")
]
WORDS = [
    "the",
    "of",
    "17",
    "+",
    "25",
    "=",
    "42",
    "naïve",
    "café",
    "数学",
    "tool",
    "call",
    "answer",
    "<b>",
    "\n",
    "\t",
    "{}",
    "[]",
    '"',
    "'",
    "ok",
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def assistant(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.6:
        calls = []
        for _ in range(rng.randint(1, 3)):
            args: Any = {"x": words(rng, 3)}
            if rng.random() < 0.5:
                args = json.dumps(args)  # as the OpenAI SDK sends them back
            calls.append(
                {
                    "id": f"call_{rng.getrandbits(32):08x}",
                    "type": "function",
                    "function": {"name": rng.choice(["calculator", "search"]), "arguments": args},
                }
            )
        content = rng.choice([None, "", words(rng, 4)])
        return {"role": "assistant", "content": content, "tool_calls": calls}
    return {"role": "assistant", "content": words(rng, rng.randint(1, 12))}


def conversations(seed: int, count: int, turns: int):
    """Each conversation as the list of requests an agent sends, each extending the last."""
    rng = random.Random(seed)
    for _ in range(count):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.8:
            msgs.append({"role": "system", "content": words(rng, 8)})
        msgs.append({"role": "user", "content": words(rng, 6)})
        tools = TOOLS if rng.random() < 0.7 else None
        requests = [copy.deepcopy(msgs)]
        for _ in range(turns):
            reply = assistant(rng)
            msgs.append(reply)
            if reply.get("tool_calls"):
                for call in reply["tool_calls"]:
                    msgs.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": words(rng, 5)}
                    )
            if not reply.get("tool_calls") or rng.random() < 0.2:
                msgs.append({"role": "user", "content": words(rng, 5)})
            requests.append(copy.deepcopy(msgs))
        yield tools, requests


def full_path(tokenizer: Any):
    def full(messages: Any, tools: Any) -> tuple[str, list[int]]:
        text = render_text(tokenizer, messages, tools)
        return text, list(tokenizer.encode(text, add_special_tokens=False))

    return full


def test_new_turns_only_equals_the_full_render(tokenizer: Any) -> None:
    cache = HistoryCache(tokenizer, verify=0, verify_every=10**9)  # no self-check: ours alone
    full = full_path(tokenizer)
    calls = 0
    for k, (tools, requests) in enumerate(conversations(0, 60, 8)):
        for messages in requests:
            got = cache.render(("r", k), messages, tools, full)
            assert got == render_prompt(tokenizer, messages, tools), (k, messages)
            calls += 1
    assert cache.enabled and cache.misses == 60 and cache.hits == calls - 60


def test_anything_but_an_extension_takes_the_full_path(tokenizer: Any) -> None:
    cache = HistoryCache(tokenizer, verify=0, verify_every=10**9)
    full = full_path(tokenizer)
    tools, requests = next(conversations(3, 1, 6))
    first, second, third = requests[1], requests[2], requests[3]
    cache.render("c", first, tools, full)
    variants = {
        "same": first,
        "shorter": first[:-1],
        "other tools": second,
        "edited history": [{**second[0], "content": second[0]["content"] + "!"}, *second[1:]],
        "int became float": None,
    }
    edited = copy.deepcopy(third)
    edited[-1]["content"] = edited[-1]["content"] + " "
    for name, messages in variants.items():
        if messages is None:
            continue
        use_tools = None if name == "other tools" else tools
        before = cache.hits
        got = cache.render("c", messages, use_tools, full)
        assert got == render_prompt(tokenizer, messages, use_tools), name
        assert cache.hits == before, name  # none of these extends the previous call
        cache.render("c", first, tools, full)  # back to the start
    # Key order counts: the template writes dict arguments in their order.
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "search", "arguments": {"x": "1", "y": 2}}}
    ]}  # fmt: skip
    swapped = copy.deepcopy(call)
    swapped["tool_calls"][0]["function"]["arguments"] = {"y": 2, "x": "1"}
    base = [{"role": "user", "content": "hi"}]
    cache.render("k", [*base, call, {"role": "user", "content": "a"}], tools, full)
    later = [
        *base,
        swapped,
        {"role": "user", "content": "a"},
        call,
        {"role": "user", "content": "b"},
    ]
    assert cache.render("k", later, tools, full) == render_prompt(tokenizer, later, tools)


# A template that renders an old turn differently once a later one exists (as Qwen3 drops
# old reasoning): here an assistant turn before the last user turn loses its content.
FORGETFUL = (
    "{%- set ns = namespace(last=0) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last %}(old){% else %}"
    "{{ m.content }}{% endif %}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def test_a_template_that_rewrites_old_turns_turns_the_cache_off(tokenizer: Any) -> None:
    tok = copy.copy(tokenizer)
    tok.chat_template = FORGETFUL
    cache = HistoryCache(tok, verify=4)
    full = full_path(tok)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
    for i in range(3):  # a tool turn (prefix-stable), then a user turn (old turns change)
        msgs = [*msgs, {"role": "assistant", "content": f"a{i}"}, {"role": "tool", "content": "t"}]
        assert cache.render("r", msgs, None, full) == render_prompt(tok, msgs, None)
        msgs = [*msgs, {"role": "assistant", "content": f"b{i}"}, {"role": "user", "content": "x"}]
        assert cache.render("r", msgs, None, full) == render_prompt(tok, msgs, None)
    assert not cache.enabled


@pytest.mark.parametrize("turns", [1, 30])
def test_long_tool_conversations_extend_exactly(tokenizer: Any, turns: int) -> None:
    cache = HistoryCache(tokenizer, verify=0, verify_every=10**9)
    full = full_path(tokenizer)
    for k, (tools, requests) in enumerate(conversations(7 + turns, 3, turns)):
        for messages in requests:
            assert cache.render(k, messages, tools, full) == render_prompt(
                tokenizer, messages, tools
            )
