"""Engine output → answers: :class:`Choice` (one completion decoded, stop strings trimmed,
tool calls parsed), what every dialect renders into its own response body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tether.chat import ParsedMessage, decode_completion, finish_reason_for
from tether.engine import GenerateResult, SamplingParams

__all__ = ["Choice", "TokenText", "choices_from"]

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
