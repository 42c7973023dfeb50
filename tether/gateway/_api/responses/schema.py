"""The body of ``POST /v1/responses``: the stateless subset of OpenAI's Responses API.

Unknown fields are refused by name (``extra="forbid"``), like every gateway body.
Server-side state (``previous_response_id``, ``conversation``, ``background``) is
refused with a 400 that says what to do instead: tether keeps no response
objects, it records token ids; the agent sends its whole conversation in
``input`` (the Agents SDK and the ``openai`` client do this by default).

Accepted without effect (validated and kept in the call's recorded request):
:data:`RESPONSES_WITHOUT_EFFECT`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["INCLUDABLE", "RESPONSES_WITHOUT_EFFECT", "ResponsesRequest"]

Finite = Annotated[float, Field(allow_inf_nan=False)]

# ``store`` (true or false): nothing is retrievable later either way (see docs/responses-api.md);
# ``reasoning`` and ``text.verbosity``: the Agents SDK sends them by default for its default
# model; the served model's chat template has no such knob.
RESPONSES_WITHOUT_EFFECT = (
    "store",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "reasoning",
    "text.verbosity",
    "stream_options.include_obfuscation",
    "include: reasoning.encrypted_content",
)
# ``include`` values: logprobs are returned; encrypted reasoning is accepted (there is none).
INCLUDABLE = ("message.output_text.logprobs", "reasoning.encrypted_content")

_STATELESS = (
    "tether keeps no server-side conversation state; send the whole conversation in "
    "`input` instead (the Agents SDK does unless you pass previous_response_id / "
    "conversation_id / auto_previous_response_id)"
)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "policy"
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: Finite | None = Field(None, ge=0, le=2)
    top_p: Finite | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    text: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None

    @field_validator("previous_response_id", "conversation")
    @classmethod
    def _stateless(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError(f"is not supported: {_STATELESS}")
        return v

    @field_validator("background")
    @classmethod
    def _no_background(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError(
                "background responses are not supported (tether answers every call directly); "
                "leave it unset or false"
            )
        return v

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, v: str | None) -> str | None:
        if v not in (None, "disabled"):
            raise ValueError(
                f"{v!r} is not supported: tether never drops input the agent sent (the trainer "
                "needs the prompt as sent); use 'disabled' and keep the conversation in context"
            )
        return v

    @field_validator("include")
    @classmethod
    def _include(cls, v: list[str] | None) -> list[str] | None:
        for value in v or []:
            if value not in INCLUDABLE:
                raise ValueError(f"{value!r} is not supported; tether implements {INCLUDABLE}")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (v or {}).items():
            if key != "include_obfuscation" or not isinstance(value, bool):
                raise ValueError(f"unsupported key {key!r}; tether implements include_obfuscation")
        return v

    @field_validator("reasoning")
    @classmethod
    def _reasoning(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(v or {}) - {"effort", "summary", "generate_summary"})
        if unknown:
            raise ValueError(f"unsupported key {unknown[0]!r}; tether accepts effort and summary")
        return v

    @field_validator("text")
    @classmethod
    def _text(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(v or {}) - {"format", "verbosity"})
        if unknown:
            raise ValueError(f"unsupported key {unknown[0]!r}; tether implements format, verbosity")
        return v

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])
