"""Answers (:class:`~tether.gateway._core.choices.Choice`) → OpenAI response bodies.

The bodies see tokens only through a :data:`TokenText` (``Gateway.token_text``): one
token id as its text, for the logprobs they list.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..._core.choices import Choice, TokenText

__all__ = ["chat_body", "completion_body"]


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
