"""Engine output → answers (:func:`choices_from`) → OpenAI response bodies.

The bodies see tokens only through a :data:`TokenText` (``Gateway.token_text``): one
token id as its text, for the logprobs they list.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tether.chat import (
    ParsedMessage,
    decode_completion,
    finish_reason_for,
)
from tether.engine import GenerateResult, SamplingParams

__all__ = [
    "Choice",
    "TokenText",
    "chat_body",
    "choices_from",
    "completion_body",
]

#: One token id as its text (special tokens included).
TokenText = Callable[[int], str]


@dataclass
class Choice:
    text: str  # the visible text (stop token and stop string removed)
    message: dict[str, Any]  # the OpenAI assistant message
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float]
    parsed: ParsedMessage | None = None  # set when tool calls were parsed
    top_logprobs: list[dict[int, float]] | None = None


def _trim_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((i for s in stops if (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def choices_from(
    tokenizer: Any,
    result: GenerateResult,
    params: SamplingParams,
    parser: Any,
    *,
    max_tool_calls: int | None = None,
) -> list[Choice]:
    """Decode each completion, trim stop strings, parse tool calls when a parser is given.

    ``max_tool_calls`` keeps only that many of the parsed tool calls (the first ones).
    """
    choices = []
    for completion in result.completions:
        text = decode_completion(
            tokenizer, completion.token_ids, stop_token_ids=params.stop_token_ids
        )
        text, stopped = _trim_stop(text, params.stop)
        finish = "stop" if stopped else completion.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": text}
        parsed = parser.parse(text) if parser is not None else None
        if parsed is not None and parsed.tool_calls:
            if max_tool_calls is not None and len(parsed.tool_calls) > max_tool_calls:
                parsed = replace(parsed, tool_calls=parsed.tool_calls[:max_tool_calls])
            message = parsed.to_message()
            finish = finish_reason_for(parsed, finish)
        else:
            parsed = None
        choices.append(
            Choice(
                text=text,
                message=message,
                finish_reason=finish,
                parsed=parsed,
                token_ids=list(completion.token_ids),
                logprobs=list(completion.logprobs),
                top_logprobs=completion.top_logprobs,
            )
        )
    return choices


def _chat_logprobs(token_text: TokenText, choice: Choice, top: int) -> dict[str, Any]:
    content = []
    for i, (tid, lp) in enumerate(zip(choice.token_ids, choice.logprobs, strict=True)):
        text = token_text(tid)
        entry: dict[str, Any] = {
            "token": text,
            "logprob": lp,
            "bytes": list(text.encode()),
            "top_logprobs": [],
        }
        if top and choice.top_logprobs:
            entry["top_logprobs"] = [
                {"token": (t := token_text(k)), "logprob": v, "bytes": list(t.encode())}
                for k, v in sorted(choice.top_logprobs[i].items(), key=lambda kv: -kv[1])[:top]
            ]
        content.append(entry)
    return {"content": content, "refusal": None}


def _usage(prompt_len: int, choices: list[Choice]) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
    }


def chat_body(
    token_text: TokenText,
    model: str,
    prompt_len: int,
    choices: list[Choice],
    *,
    logprobs: bool,
    top_logprobs: int,
    policy_version: int,
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"tether-policy-v{policy_version}",
        "choices": [
            {
                "index": i,
                "message": {**c.message, "refusal": None},
                "logprobs": _chat_logprobs(token_text, c, top_logprobs) if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_len, choices),
    }


def completion_body(
    token_text: TokenText,
    model: str,
    prompt_len: int,
    choices: list[Choice],
    *,
    logprobs: int | None,
    policy_version: int,
) -> dict[str, Any]:
    def lp(c: Choice) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        texts = [token_text(t) for t in c.token_ids]
        offsets, pos = [], 0
        for t in texts:
            offsets.append(pos)
            pos += len(t)
        top = None
        if logprobs and c.top_logprobs:
            top = [
                {token_text(k): v for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:logprobs]}
                for d in c.top_logprobs
            ]
        return {
            "tokens": texts,
            "token_logprobs": c.logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"tether-policy-v{policy_version}",
        "choices": [
            {"index": i, "text": c.text, "logprobs": lp(c), "finish_reason": c.finish_reason}
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_len, choices),
    }
