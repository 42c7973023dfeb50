"""Pydantic shapes of the gateway's HTTP bodies.

Unknown fields are refused (``extra="forbid"``) so nothing a client sends is
silently dropped: the 400 names the field. Fields accepted but without effect
are listed in :data:`ACCEPTED_WITHOUT_EFFECT`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ACCEPTED_WITHOUT_EFFECT",
    "ChatCompletionRequest",
    "CompletionRequest",
    "CreateRolloutRequest",
    "FinishRolloutRequest",
    "RewardRequest",
]

Finite = Annotated[float, Field(allow_inf_nan=False)]
# A reward: a JSON number (int or float), finite; never a string or a bool.
RewardValue = Annotated[float, Field(allow_inf_nan=False, strict=True)]

# Fields an OpenAI client may send that change nothing tether generates; they are
# validated and kept in the call's recorded request. (``parallel_tool_calls: false``
# has an effect: only the first parsed tool call is returned.)
ACCEPTED_WITHOUT_EFFECT = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "stream_options.include_obfuscation",
)
_STREAM_OPTIONS = ("include_usage", "include_obfuscation")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Sampling(_Strict):
    model: str = "policy"
    n: int = Field(1, ge=1)
    temperature: Finite | None = Field(None, ge=0, le=2)
    top_p: Finite | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    frequency_penalty: Finite | None = None
    presence_penalty: Finite | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (v or {}).items():
            if key not in _STREAM_OPTIONS:
                raise ValueError(
                    f"unsupported key {key!r}; tether implements {', '.join(_STREAM_OPTIONS)}"
                )
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
        return v

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v not in (None, 0, 0.0):
            raise ValueError(
                "is not supported by tether (it would change the sampling the trainer assumes); leave it unset or 0"
            )
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError(
                "is not supported by tether (it would change the sampling the trainer assumes)"
            )
        return v

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0)
    response_format: dict[str, Any] | None = None
    store: bool | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("auto", "none", "required"):
            raise ValueError("must be 'auto', 'none', 'required' or a function object")
        return v  # a function object is checked against tools (gateway._core.constrain)

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") not in ("text", "json_object", "json_schema"):
            raise ValueError("type must be 'text', 'json_object' or 'json_schema'")
        return v


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by tether; leave it false")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported by tether")
        return v


class RewardRequest(_Strict):
    value: RewardValue
    call_seq: int | None = Field(None, ge=0, description="an intermediate reward for one call")


class CreateRolloutRequest(_Strict):
    task: dict[str, Any] = Field(default_factory=dict)
    rollout_id: str | None = None
    run_id: str | None = None
    group_id: str | None = None
    task_id: str | None = None


class FinishRolloutRequest(_Strict):
    status: Literal["succeeded", "failed", "timeout", "cancelled"] = "succeeded"
    reward: RewardValue | None = None
    final_answer: str | None = None
    error: str | None = None
