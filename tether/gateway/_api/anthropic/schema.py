"""The bodies of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's
Messages API, the subset a self-hosted model can honour.

Unknown fields are refused by name (``extra="forbid"``), like every gateway body; the
content blocks, tools and ``tool_choice`` are checked where they are mapped
(``items``). ``max_tokens`` is required, as Anthropic requires it.

Accepted without effect (validated and kept in the call's recorded request):
:data:`MESSAGES_WITHOUT_EFFECT`. ``top_k`` is accepted unset or 0 only: tether's
engines sample with temperature and top_p (a follow-up for the engines).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MESSAGES_WITHOUT_EFFECT", "CountTokensRequest", "MessagesRequest"]

Finite = Annotated[float, Field(allow_inf_nan=False)]

# ``thinking`` and ``output_config.effort``: the served model's chat template decides
# whether it reasons; ``cache_control`` (top level, on system / content blocks, on tools):
# tether renders every prompt (its render cache reuses the ids of a conversation's prefix).
MESSAGES_WITHOUT_EFFECT = (
    "metadata",
    "thinking",
    "cache_control",
    "service_tier",
    "inference_geo",
    "speed",
    "output_config.effort",  # and a message's own output_config.effort
    "context_management",
)
_THINKING = ("enabled", "disabled", "adaptive")


class _Body(BaseModel):
    """What a Messages call and a token count share."""

    model_config = ConfigDict(extra="forbid")

    model: str = "policy"
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") not in _THINKING:
            raise ValueError(f"type must be one of {', '.join(_THINKING)}")
        return v

    @field_validator("output_config")
    @classmethod
    def _output_config(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(v or {}) - {"effort", "format"})
        if unknown:
            raise ValueError(f"unsupported key {unknown[0]!r}; tether implements effort, format")
        fmt = (v or {}).get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"):
            raise ValueError("format must be {'type': 'json_schema', 'schema': {...}}")
        return v


class MessagesRequest(_Body):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Finite | None = Field(None, ge=0, le=1)
    top_p: Finite | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v:
            raise ValueError(
                "is not supported by tether's engines (they sample with temperature and "
                "top_p only); leave it unset or 0"
            )
        return v

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if any(not s for s in v or []):
            raise ValueError("stop sequences must be non-empty")
        return v


class CountTokensRequest(_Body):
    """``POST /v1/messages/count_tokens``: the prompt a Messages call would render."""
