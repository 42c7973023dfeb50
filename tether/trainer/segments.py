"""Where a rollout's token prefix breaks: its calls grouped into segments.

A multi-turn agent resends its conversation, so a call's prompt usually
starts with the previous call's prompt + completion, token for token: such
calls form one segment, trained as one sample (:func:`tether.trainer.build_samples`).
A call that extends none of the rollout's segments so far starts a new one:
the agent summarised or truncated its history (a context reset), rewrote its
system prompt, or a sub-agent made a call with its own conversation. A call
joins the newest segment it extends, so a side call between two turns of the
main conversation does not break the main segment.

Torch-free, so that ``tether rollouts show`` can say where a rollout's
segments are without loading torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tether.records import Call, CallStatus

__all__ = ["Segment", "call_segments", "effective_temperature"]


def effective_temperature(call: Call) -> float:
    """The temperature the call's logprobs are at: ``Call.logprobs`` are
    ``log_softmax(logits / T)`` with ``T = 1`` when greedy (``T = 0``)."""
    return float(call.temperature) if call.temperature > 0 else 1.0


@dataclass
class Segment:
    """Calls of one rollout whose prompts extend each other, in ``seq`` order."""

    calls: list[Call] = field(default_factory=list)
    temperature: float = 1.0
    role: str | None = None  # every call's role (Call.role): roles never share a segment

    @property
    def tokens(self) -> list[int]:
        """What the next call's prompt must start with: the last call's prompt + completion."""
        last = self.calls[-1]
        return [*last.prompt_ids, *last.completion_ids]

    def extended_by(self, call: Call) -> bool:
        """Whether ``call`` continues this segment: same temperature and role, and its prompt
        starts with the segment's tokens."""
        if effective_temperature(call) != self.temperature or call.role != self.role:
            return False
        last = self.calls[-1]
        n = len(last.prompt_ids) + len(last.completion_ids)
        return (
            len(call.prompt_ids) >= n
            and call.prompt_ids[: len(last.prompt_ids)] == last.prompt_ids
            and call.prompt_ids[len(last.prompt_ids) : n] == last.completion_ids
        )


def call_segments(calls: Sequence[Call]) -> list[Segment]:
    """The rollout's successful calls (any order; sorted by ``seq``) as segments, in the
    order of their first call. Failed calls (the engine failed) belong to none."""
    segments: list[Segment] = []
    for call in sorted(calls, key=lambda c: c.seq):
        if call.status is not CallStatus.OK:
            continue
        target = next((s for s in reversed(segments) if s.extended_by(call)), None)
        if target is None:
            target = Segment(temperature=effective_temperature(call), role=call.role)
            segments.append(target)
        target.calls.append(call)
    return segments
