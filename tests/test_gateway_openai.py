"""The official ``openai`` client against a real uvicorn server on 127.0.0.1.

Uses the starter model (random weights) through the embedded transformers
engine, and a scripted engine where the output must be a tool call.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tether.chat import render_prompt
from tether.engine import TransformersEngine
from tether.engine.testing import ScriptedEngine

from .helpers import CHAT_MESSAGES, CHAT_TOOLS, LiveGateway

TOOLS, MESSAGES = CHAT_TOOLS, CHAT_MESSAGES


@pytest.fixture
def live(model: Any, tokenizer: Any, tmp_path: Path):
    engine = TransformersEngine(model, tokenizer, max_batch_size=16)
    lv = LiveGateway(engine, tokenizer, tmp_path / "traces.sqlite")
    yield lv
    lv.stop()


def _forward_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float
) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    n = len(prompt)
    return [logp[n - 1 + i, t].item() for i, t in enumerate(completion)]


def test_sync_call_is_recorded_token_exactly(live: LiveGateway, tokenizer: Any, model: Any) -> None:
    client = live.client("r-1")
    resp = client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=24, temperature=1.0, seed=7, logprobs=True
    )
    choice = resp.choices[0]
    (call,) = live.store.calls("r-1")
    # The prompt is exactly the chat template's rendering.
    assert call.prompt_ids == render_prompt(tokenizer, MESSAGES, None)
    # The completion ids decode to the text that was returned.
    visible = call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids
    assert tokenizer.decode(visible, skip_special_tokens=False) == choice.message.content
    assert resp.usage.completion_tokens == len(call.completion_ids)
    assert resp.usage.prompt_tokens == len(call.prompt_ids)
    # One finite logprob <= 0 per completion token, the same as the response's.
    assert len(call.logprobs) == len(call.completion_ids) > 0
    assert all(math.isfinite(x) and x <= 0 for x in call.logprobs)
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(call.logprobs, abs=1e-6)
    # A forward pass of the same model reproduces the recorded logprobs.
    ref = _forward_logprobs(model, call.prompt_ids, call.completion_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, call.logprobs, strict=True)) <= 1e-4


def test_temperature_logprobs_match_forward_pass(live: LiveGateway, model: Any) -> None:
    client = live.client("r-t")
    client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=16, temperature=0.7, seed=1
    )
    (call,) = live.store.calls("r-t")
    assert call.temperature == 0.7
    ref = _forward_logprobs(model, call.prompt_ids, call.completion_ids, 0.7)
    assert max(abs(a - b) for a, b in zip(ref, call.logprobs, strict=True)) <= 1e-4


async def test_async_and_streaming_clients(live: LiveGateway, tokenizer: Any) -> None:
    client, aclient = live.clients("r-s")
    stream = client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish and finish[-1] in ("stop", "length")
    resp = await aclient.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=12)
    astream = await aclient.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=12, stream=True
    )
    atext = "".join([c.choices[0].delta.content or "" async for c in astream if c.choices])
    calls = live.store.calls("r-s")
    assert [c.seq for c in calls] == [0, 1, 2]
    assert calls[1].response["content"] == resp.choices[0].message.content
    for streamed, call in ((text, calls[0]), (atext, calls[2])):
        visible = call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids
        assert streamed == tokenizer.decode(visible, skip_special_tokens=False)
    await aclient.close()


def test_n_samples_are_separate_calls(live: LiveGateway) -> None:
    client = live.client("r-n")
    resp = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, n=3)
    assert len(resp.choices) == 3
    calls = live.store.calls("r-n")
    assert [c.seq for c in calls] == [0, 1, 2]
    assert all(c.prompt_ids == calls[0].prompt_ids for c in calls)


def test_completions_route(live: LiveGateway, tokenizer: Any) -> None:
    client = live.client("r-c")
    resp = client.completions.create(model="policy", prompt="12 + 30 =", max_tokens=6, logprobs=1)
    (call,) = live.store.calls("r-c")
    assert call.prompt_ids == tokenizer.encode("12 + 30 =", add_special_tokens=False)
    assert resp.choices[0].logprobs.token_logprobs == pytest.approx(call.logprobs, abs=1e-6)


TOOL_TEXT = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 + 25"}}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_comes_back_in_openai_form(stream: bool, tokenizer: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine([TOOL_TEXT], tokenizer=tokenizer)
    lv = LiveGateway(engine, tokenizer, tmp_path / "t.sqlite")
    try:
        client = lv.client("r-tool")
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model="policy", messages=MESSAGES, tools=TOOLS, stream=True
                )
            )
            deltas = [
                tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
            ]
            # Accumulate as a streaming client does: name first, arguments in pieces.
            name = next(d.function.name for d in deltas if d.function.name)
            args = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
            finish = [
                c.choices[0].finish_reason
                for c in chunks
                if c.choices and c.choices[0].finish_reason
            ][-1]
        else:
            resp = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
            tc = resp.choices[0].message.tool_calls[0]
            name, args, finish = (
                tc.function.name,
                tc.function.arguments,
                resp.choices[0].finish_reason,
            )
            assert tc.id and tc.type == "function"
        assert name == "calculator"
        assert args == '{"expression": "17 + 25"}'
        assert finish == "tool_calls"
        (call,) = lv.store.calls("r-tool")
        engine.assert_exhausted()
        assert call.prompt_ids == render_prompt(tokenizer, MESSAGES, TOOLS)
        assert call.response["tool_calls"][0]["function"]["name"] == "calculator"
    finally:
        lv.stop()


def test_malformed_tool_call_comes_back_as_content(tokenizer: Any, tmp_path: Path) -> None:
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
    lv = LiveGateway(ScriptedEngine([bad], tokenizer=tokenizer), tokenizer, tmp_path / "m.sqlite")
    try:
        client = lv.client("r-bad")
        resp = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)
        assert resp.choices[0].message.tool_calls is None
        assert resp.choices[0].message.content == bad
        assert resp.choices[0].finish_reason == "stop"
    finally:
        lv.stop()


def test_restart_keeps_every_acknowledged_call(model: Any, tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "restart.sqlite"
    lv = LiveGateway(TransformersEngine(model, tokenizer), tokenizer, path)
    client = lv.client("r-keep")
    acked = [
        client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6)
        for _ in range(3)
    ]
    before = [(c.seq, c.completion_ids, c.logprobs) for c in lv.store.calls("r-keep")]
    lv.stop()
    lv2 = LiveGateway(TransformersEngine(model, tokenizer), tokenizer, path)
    try:
        after = [(c.seq, c.completion_ids, c.logprobs) for c in lv2.store.calls("r-keep")]
        assert after == before and len(after) == len(acked)
        # The rollout's token was stored only as a hash, and still works after the restart.
        client2 = openai.OpenAI(
            base_url=f"{lv2.server.url}/rollouts/r-keep/v1", api_key=client.api_key, max_retries=0
        )
        client2.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
        assert [c.seq for c in lv2.store.calls("r-keep")] == [0, 1, 2, 3]
    finally:
        lv2.stop()


def test_openai_errors_map_to_client_exceptions(live: LiveGateway) -> None:
    client = live.client("r-e")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=10**7)
    bad = openai.OpenAI(
        base_url=f"{live.server.url}/rollouts/r-e/v1", api_key="tr-wrong", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="policy", messages=MESSAGES)
    assert live.store.calls("r-e") == []
