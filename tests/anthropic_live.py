"""What the Messages API's test modules share (test modules do not import each other):
the request pieces, the scripted model turns, :class:`Session` (the ``anthropic``
clients of a rollout or of record mode) and the checks of a recorded call."""

from __future__ import annotations

import json
from typing import Any

import anthropic

from tether.chat import render_prompt
from tether.records import RolloutStatus

from .helpers import LiveGateway

RECORD_KEY = "test-record-key-0123456789"
SYSTEM = "You are a careful calculator agent."
QUESTION = "Ava has 12 apples and gets 30 more. How many?"
SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string", "maxLength": 24}},
    "required": ["expression"],
}
TOOL = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": SCHEMA,
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "calculator", "parameters": SCHEMA, "description": TOOL["description"]},
}
CHAT_SENT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def tool_call(expression: str) -> str:
    args = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'


ONE_CALL = tool_call("12 + 30")
TEXT_AND_CALL = "Let me use the calculator.\n" + ONE_CALL
TWO_CALLS = ONE_CALL + "\n" + tool_call("30 + 12")
ANSWER = "The answer is 42."
MODES = ["rollout", "record"]  # through a rollout, and through record mode
GW = {"task": {"question": QUESTION}, "record_keys": (RECORD_KEY,)}  # every LiveGateway here


class Session:
    """The ``anthropic`` clients of one rollout (``mode="rollout"``: its Anthropic base URL
    and token) or of record mode (``"record"``: the gateway's URL and a record key; each
    call a rollout of its own). The sync client sends its key as ``x-api-key``
    (``ANTHROPIC_API_KEY``), the async one as a bearer token (``ANTHROPIC_AUTH_TOKEN``)."""

    def __init__(self, live: LiveGateway, rid: str, mode: str = "rollout") -> None:
        self.live, self.rid, self.mode = live, rid, mode
        self.before = {r.id for r in live.store.list_rollouts()}
        if mode == "rollout":
            opened = live.gw.open_rollout(live.task, rollout_id=rid)
            base, key = opened.anthropic_base_url, opened.token
            assert opened.base_url == f"{base}/v1"
        else:
            base, key = live.server.url, RECORD_KEY
        self.sync = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        self.async_ = anthropic.AsyncAnthropic(base_url=base, auth_token=key, max_retries=0)

    def calls(self) -> list[Any]:
        """The calls made so far, in order (record mode: those of the rollouts opened since)."""
        if self.mode == "rollout":
            return self.live.store.calls(self.rid)
        new = [r for r in self.live.store.list_rollouts() if r.id not in self.before]
        assert all(r.status is not RolloutStatus.RUNNING for r in new)  # each ended with its call
        return [c for r in new for c in self.live.store.calls(r.id)]


def clients(
    live: LiveGateway, rid: str, mode: str = "rollout"
) -> tuple[anthropic.Anthropic, anthropic.AsyncAnthropic]:
    session = Session(live, rid, mode)
    return session.sync, session.async_


def visible(call: Any) -> list[int]:
    return call.completion_ids[:-1] if call.finish_reason == "stop" else call.completion_ids


def text_of(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def check_recorded(live: LiveGateway, call: Any, message: Any, sent: list, tools: Any) -> None:
    """The stored call is the template of what was sent, and decodes to what was received."""
    tok = live.tokenizer
    assert call.prompt_ids == render_prompt(tok, sent, tools)
    assert call.request["api"] == "messages" and call.request["anthropic"]["id"] == message.id
    assert len(call.completion_ids) == len(call.logprobs) == message.usage.output_tokens > 0
    assert message.usage.input_tokens == len(call.prompt_ids)
    assert all(lp <= 0 for lp in call.logprobs)
    want = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
    assert message.stop_reason == want[call.finish_reason]
    if call.finish_reason != "tool_calls":
        assert text_of(message) == tok.decode(visible(call), skip_special_tokens=False)
