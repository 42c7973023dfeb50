"""One model call made ready: :class:`CallContext`, what every step of a call reads.

The routes build it through :meth:`Gateway.prepare_chat` / :meth:`Gateway.prepare_completion`
(checked, rendered, nothing generated or stored yet); the engine call, its stream and its
records (``calls``, ``streaming``, ``record``) take it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tether.engine import SamplingParams

__all__ = ["CallContext"]


@dataclass(frozen=True)
class CallContext:
    """A checked call: whose it is, what the engine gets and what is recorded with it.

    ``max_tool_calls=1`` (``parallel_tool_calls: false``) keeps only the first parsed
    tool call in the answer and in the recorded response. ``params.adapter`` is the
    role's adapter where the role has its own (``Gateway.prepare_chat``).
    """

    rollout_id: str
    attempt: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    request: dict[str, Any]  # what is recorded as the call's request
    parse_tools: bool = False
    max_tool_calls: int | None = None
    role: str | None = None  # the agent role named in the call's URL, recorded with it

    @property
    def conversation(self) -> tuple[str, int]:
        """The key of this call's conversation (``HistoryCache``): rollout id and attempt."""
        return (self.rollout_id, self.attempt)

    def with_params(self, params: SamplingParams) -> CallContext:
        return replace(self, params=params)
