"""Measure the calc agent's success in process, without a gateway.

The loop is the agent's (system prompt + calculator tool + question; up to
four model calls; each ``<tool_call>`` is run with :func:`calc.calculator`
and fed back as a tool message; the first reply without a tool call is the
final answer), batched over tasks with ``model.generate``. This is the
starter's own check of the warm-up, not the trainer's evaluation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from tether.starter import calc
from tether.starter._model import stop_token_ids

__all__ = ["Episode", "evaluate", "parse_tool_calls", "run_episodes"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a completion into (content, tool calls as ``{"name", "arguments": dict}``).

    A call whose JSON does not parse is kept as ``{"name": None, "error": ...}``.
    """
    calls: list[dict[str, Any]] = []
    for raw in _TOOL_CALL.findall(text):
        try:
            body = json.loads(raw)
            calls.append({"name": body["name"], "arguments": dict(body.get("arguments") or {})})
        except (ValueError, KeyError, TypeError) as exc:
            calls.append({"name": None, "error": f"bad tool call: {exc}"})
    content = text.split("<tool_call>", 1)[0].strip() if calls else text.strip()
    return content, calls


@dataclass
class Episode:
    task: dict[str, Any]
    messages: list[dict[str, Any]]
    answer: str | None = None
    calls: int = 0
    tool_calls: int = 0
    done: bool = False
    completions: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return calc.grade(self.task, self.answer)


def _step(ep: Episode, text: str, max_calls: int) -> None:
    ep.calls += 1
    ep.completions.append(text)
    content, calls = parse_tool_calls(text)
    if not calls:
        ep.answer, ep.done = content, True
        ep.messages.append({"role": "assistant", "content": content})
        return
    tool_calls = [
        {"id": f"call_{ep.calls}_{i}", "type": "function", "function": c}
        for i, c in enumerate(calls)
        if c["name"] is not None
    ]
    ep.messages.append({"role": "assistant", "content": content or None, "tool_calls": tool_calls})
    for call in calls:
        ep.tool_calls += 1
        if call["name"] == "calculator":
            result = calc.calculator(str(call["arguments"].get("expression", "")))
        else:
            result = f"error: {call.get('error') or 'unknown tool ' + repr(call['name'])}"
        ep.messages.append({"role": "tool", "content": result})
    if ep.calls >= max_calls:
        ep.answer, ep.done = content, True


@torch.no_grad()
def run_episodes(
    model: Any,  # a transformers causal LM (``model.generate``)
    tokenizer: Any,
    tasks: list[dict[str, Any]],
    temperature: float = 0.0,
    seed: int = 0,
    max_calls: int = 4,
    max_new_tokens: int = 64,
    batch_size: int = 64,
) -> list[Episode]:
    """Run the calc agent loop on every task; ``temperature == 0`` is greedy."""
    episodes = [
        Episode(
            task,
            [
                {"role": "system", "content": calc.SYSTEM_PROMPT},
                {"role": "user", "content": task["question"]},
            ],
        )
        for task in tasks
    ]
    stops = stop_token_ids(tokenizer)
    pad = int(tokenizer.pad_token_id)
    sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    options = sample if temperature > 0 else {"do_sample": False}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        while active := [ep for ep in episodes if not ep.done]:
            for start in range(0, len(active), batch_size):
                chunk = active[start : start + batch_size]
                prompts = [
                    tokenizer.apply_chat_template(
                        ep.messages,
                        tools=[calc.CALCULATOR_TOOL],
                        add_generation_prompt=True,
                        tokenize=False,
                    )
                    for ep in chunk
                ]
                ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
                width = max(map(len, ids))
                input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
                attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=stops,
                    pad_token_id=pad,
                    **options,
                )
                for ep, row in zip(chunk, out[:, width:].tolist(), strict=True):
                    tokens = [t for t in row if t != pad]
                    text = tokenizer.decode(tokens, skip_special_tokens=True)
                    _step(ep, text, max_calls)
    return episodes


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: list[dict[str, Any]],
    temperature: float = 0.0,
    seed: int = 0,
) -> dict[str, float]:
    """Success rate and behaviour counts of the agent loop over ``tasks``."""
    episodes = run_episodes(model, tokenizer, tasks, temperature=temperature, seed=seed)
    n = max(1, len(episodes))
    return {
        "success": sum(ep.reward for ep in episodes) / n,
        "used_tool": sum(ep.tool_calls > 0 for ep in episodes) / n,
        "mean_calls": sum(ep.calls for ep in episodes) / n,
        "n": float(len(episodes)),
    }
