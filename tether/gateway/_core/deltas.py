"""What a streamed model call yields, in order: text and tool-call pieces as the
tokens are generated, then the finished call (the same choices a non-streamed call returns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Done", "TextDelta", "ToolCallDelta"]


@dataclass(frozen=True)
class TextDelta:
    index: int  # the choice
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int  # the choice
    call: int  # the tool call's position within the choice
    id: str | None  # set on the call's first delta only
    name: str | None  # set on the call's first delta only
    arguments: str  # the next piece of the call's JSON arguments


@dataclass(frozen=True)
class Done:
    choices: list[Any]  # tether.gateway._core.choices.Choice, as a non-streamed call gets them
    prompt_tokens: int
