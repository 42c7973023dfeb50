"""Real token streaming: the official ``openai`` client against a uvicorn server on 127.0.0.1.

The starter model (untrained: it runs to ``max_tokens``) in the embedded transformers
engine, or a scripted engine where the output must be tool calls.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tether.engine import TransformersEngine
from tether.engine.testing import FaultyEngine, NullEngine, ScriptedEngine
from tether.records import CallStatus, RolloutStatus

from .helpers import CHAT_MESSAGES, CHAT_TOOLS, LiveGateway

TOOLS, MESSAGES = CHAT_TOOLS, CHAT_MESSAGES


@pytest.fixture
def live(model: Any, tokenizer: Any, tmp_path: Path):
    lv = LiveGateway(
        TransformersEngine(model, tokenizer, max_batch_size=16), tokenizer, tmp_path / "t.db"
    )
    yield lv
    lv.stop()


def visible_text(tokenizer: Any, call: Any) -> str:
    ids = call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_first_chunk_arrives_long_before_the_last(live: LiveGateway, tokenizer: Any) -> None:
    """300 tokens: the first content chunk comes before half the total time (it came at
    ~99% of it when the gateway streamed a finished completion)."""
    client = live.client("r-ttft")
    t0 = time.perf_counter()
    first = None
    text = []
    stream = client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=300, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
    total = time.perf_counter() - t0
    (call,) = live.store.calls("r-ttft")
    assert len(call.completion_ids) == 300 and call.finish_reason == "length"
    print(f"first content chunk at {first:.3f} s of {total:.3f} s")
    assert first is not None and first < total / 2, (first, total)
    assert "".join(text) == visible_text(tokenizer, call) == call.response["content"]


def test_streamed_text_and_logprobs_are_what_was_stored(live: LiveGateway, tokenizer: Any) -> None:
    client = live.client("r-lp")
    chunks = list(
        client.chat.completions.create(
            model="policy",
            messages=MESSAGES,
            max_tokens=40,
            seed=3,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    (call,) = live.store.calls("r-lp")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == visible_text(tokenizer, call)
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in entries] == pytest.approx(call.logprobs, abs=1e-6)
    assert all(len(e.top_logprobs) == 2 for e in entries)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 5  # live pieces
    assert chunks[-1].usage.completion_tokens == len(call.completion_ids)
    assert chunks[-1].usage.prompt_tokens == len(call.prompt_ids)


def test_a_seeded_stream_samples_what_the_plain_call_samples(live: LiveGateway) -> None:
    kw = dict(model="policy", messages=MESSAGES, max_tokens=30, temperature=1.0, seed=1234)
    live.client("r-plain").chat.completions.create(**kw)
    list(live.client("r-stream").chat.completions.create(**kw, stream=True))
    (plain,) = live.store.calls("r-plain")
    (streamed,) = live.store.calls("r-stream")
    assert streamed.completion_ids == plain.completion_ids
    assert streamed.logprobs == pytest.approx(plain.logprobs, abs=1e-6)


def test_n_choices_stream_interleaved(live: LiveGateway, tokenizer: Any) -> None:
    client = live.client("r-n")
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=20, n=3, seed=5, stream=True
        )
    )
    calls = live.store.calls("r-n")
    for i, call in enumerate(calls):
        text = "".join(
            c.choices[0].delta.content or ""
            for c in chunks
            if c.choices and c.choices[0].index == i
        )
        assert text == visible_text(tokenizer, call)


def test_completions_stream(live: LiveGateway, tokenizer: Any) -> None:
    client = live.client("r-c")
    chunks = list(
        client.completions.create(
            model="policy", prompt="12 + 30 =", max_tokens=25, logprobs=1, stream=True, seed=9
        )
    )
    (call,) = live.store.calls("r-c")
    assert "".join(c.choices[0].text for c in chunks) == visible_text(tokenizer, call)
    lps = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert lps == pytest.approx(call.logprobs, abs=1e-6)
    assert chunks[-1].choices[0].finish_reason == call.finish_reason


def test_client_disconnect_stops_generation_and_records_a_cancelled_call(
    live: LiveGateway, tokenizer: Any
) -> None:
    live.client("r-gone")
    url = f"{live.server.url}/rollouts/r-gone/v1/chat/completions"
    body = {"messages": MESSAGES, "max_tokens": 1500, "temperature": 0, "stream": True}
    engine = live.gw.engine
    with httpx.stream(
        "POST", url, json=body, headers={"Authorization": f"Bearer {live.token}"}, timeout=60
    ) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few chunks, then hang up
    assert any('"content"' in line for line in got)
    deadline = time.monotonic() + 30
    while not live.store.calls("r-gone") and time.monotonic() < deadline:
        time.sleep(0.05)
    (call,) = live.store.calls("r-gone")
    assert call.status is CallStatus.CANCELLED and call.finish_reason is None
    assert 0 < len(call.completion_ids) < 1500
    while engine._scheduler._rows and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine._scheduler._rows  # the engine dropped the request
    produced = engine.stats.tokens
    assert produced < 1500
    assert live.gw.gate.in_flight == 0
    # The rollout goes on: the next call is served and recorded after the cancelled one.
    live.client("r-next").chat.completions.create(model="policy", messages=MESSAGES, max_tokens=2)
    (after,) = live.store.calls("r-next")
    # Only the next call's tokens were generated since (it may sample its end token first).
    assert engine.stats.tokens == produced + len(after.completion_ids) > produced


def test_a_stream_broken_by_an_engine_fault_is_no_recorded_call(
    tokenizer: Any, tmp_path: Path
) -> None:
    ids = tokenizer.encode("The answer is forty two, I think.", add_special_tokens=False)
    engine = FaultyEngine(NullEngine(ids), fault="break")
    lv = LiveGateway(engine, tokenizer, tmp_path / "b.db")
    try:
        client = lv.client("r-broken")
        with pytest.raises(openai.APIError, match="injected fault"):
            list(client.chat.completions.create(model="policy", messages=MESSAGES, stream=True))
        (call,) = lv.store.calls("r-broken")
        assert call.status is CallStatus.FAILED and not call.completion_ids
    finally:
        lv.stop()


CONTENT_THEN_CALLS = (
    "Let me work that out.  \n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 + 25"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 21"}}\n</tool_call>'
)


@pytest.mark.parametrize(
    "text",
    [
        CONTENT_THEN_CALLS,
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "é + ü"}}\n</tool_call>',
        'Almost: <tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',
        "No tools needed: 42.",
    ],
    ids=["content+2calls", "call-only", "malformed", "text"],
)
@pytest.mark.parametrize("parallel", [True, False])
def test_tool_call_deltas_reassemble_to_the_plain_answer(
    text: str, parallel: bool, tokenizer: Any, tmp_path: Path
) -> None:
    engine = ScriptedEngine([text, text], tokenizer=tokenizer)
    lv = LiveGateway(engine, tokenizer, tmp_path / "tc.db")
    try:
        client = lv.client("r-tc")
        kw = dict(model="policy", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=parallel)
        plain = client.chat.completions.create(**kw).choices[0]
        chunks = list(client.chat.completions.create(**kw, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls: dict[int, dict[str, str]] = {}
        for c in chunks:
            for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += d.id or ""
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        assert content == (plain.message.content or "")
        want = [
            {"name": t.function.name, "arguments": t.function.arguments}
            for t in plain.message.tool_calls or []
        ]
        got = [{"name": c["name"], "arguments": c["arguments"]} for _, c in sorted(calls.items())]
        assert got == want and finish == plain.finish_reason
        stored = lv.store.calls("r-tc")[1].response
        assert [c["id"] for _, c in sorted(calls.items())] == [
            c["id"] for c in stored.get("tool_calls", [])
        ]
        assert stored["content"] == plain.message.content
        if want:
            json.loads(got[0]["arguments"])
    finally:
        lv.stop()


def test_text_before_a_tool_call_streams_before_the_call_ends(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Text before the markup is released token by token; only the call waits for the end."""
    lv = LiveGateway(
        ScriptedEngine([CONTENT_THEN_CALLS], tokenizer=tokenizer), tokenizer, tmp_path / "x"
    )
    try:
        client = lv.client("r-live")
        chunks = list(
            client.chat.completions.create(
                model="policy", messages=MESSAGES, tools=TOOLS, stream=True
            )
        )
        pieces = [
            c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
        ]
        assert len(pieces) > 3 and "".join(pieces) == "Let me work that out."
        first_call = next(
            i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.tool_calls
        )
        last_text = max(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
        assert last_text < first_call
    finally:
        lv.stop()


def test_record_mode_streams_and_records(tokenizer: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine(["Forty-two.", "Forty-two."], tokenizer=tokenizer)
    lv = LiveGateway(engine, tokenizer, tmp_path / "rec.db", record_keys=("rec-key",))
    finish = lv.gw.finish_rollout

    def slow_finish(*args: Any, **kwargs: Any) -> Any:  # widens any race with the client
        time.sleep(0.5)
        return finish(*args, **kwargs)

    lv.gw.finish_rollout = slow_finish  # type: ignore[method-assign]
    try:
        client = openai.OpenAI(base_url=f"{lv.server.url}/v1", api_key="rec-key", max_retries=0)
        chunks = list(
            client.chat.completions.create(model="policy", messages=MESSAGES, stream=True)
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Forty-two."
        )
        (rollout,) = lv.store.list_rollouts()
        assert rollout.status is RolloutStatus.SUCCEEDED
        (call,) = lv.store.calls(rollout.id)
        assert call.status is CallStatus.OK and call.response["content"] == "Forty-two."
        # a client that stops reading at [DONE] finds its rollout already finished
        body = {"model": "policy", "messages": MESSAGES, "stream": True}
        headers = {"Authorization": "Bearer rec-key"}
        url = f"{lv.server.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    break
            statuses = {x.id: x.status for x in lv.store.list_rollouts()}
        del statuses[rollout.id]
        assert list(statuses.values()) == [RolloutStatus.SUCCEEDED]
    finally:
        lv.stop()
