"""Finished rollouts → token sequences with loss masks → padded micro-batches.

A rollout is a list of model calls (:class:`tether.records.Call`). Multi-turn
agents resend the whole conversation, so call ``k+1``'s prompt usually starts
with call ``k``'s prompt + completion, token for token (the gateway renders
and tokenizes, so there is no re-tokenization drift). Such calls are merged
into one sequence::

    [prompt₀][completion₀][tool result, next header][completion₁] ...
     mask 0    mask 1       mask 0                   mask 1

Masked-out tokens (prompts, tool results) have old logprob 0; completion
tokens carry the engine's recorded logprobs. A call that extends none of the
rollout's open sequences (the agent rewrote or truncated its history, or a
sub-agent with another prompt) starts a new sample: the rollout is cut into
segments, each trained as its own sample with the rollout's credit, and
``trainer.aggregation`` says how its segments weigh together (docs/credit.md).
A call extends a sequence when its prompt starts with that sequence's full
tokens and it was sampled at the same temperature. We try the rollout's sequences newest first, not only
the previous one, so an interleaved side call (a summarizer, a sub-agent)
does not break the main conversation's merging (:mod:`tether.trainer.segments`).

**Alignment convention.** Every per-token tensor is ``[B, L]``, aligned with
``input_ids``: column ``t`` is about token ``t``. ``loss_mask[b, t] = 1`` when
token ``t`` is a completion token; ``old_logprobs[b, t]`` is the engine's
logprob of token ``t``; :func:`tether.trainer._forward.token_logprobs` puts the
trainer's logprob of token ``t`` — computed from the logits at position ``t − 1`` — in column ``t``,
and 0 in column 0 (never a completion token: a prompt is never empty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tether.records import Call, CallStatus
from tether.trainer.segments import call_segments

__all__ = [
    "Sample",
    "SampleStats",
    "build_samples",
    "collate",
    "make_micro_batches",
    "weigh_roles",
]


@dataclass
class Sample:
    """One training sequence: one call, or several prefix-merged calls of one rollout."""

    input_ids: list[int]  # [L]
    loss_mask: list[int]  # [L], 1 on completion tokens
    old_logprobs: list[float]  # [L], the engine's logprob of each token, 0 where masked
    advantage: float  # the rollout's advantage (per-call credit: its tokens' mean, a summary)
    rollout_index: int  # position of the rollout in build_samples' input
    temperature: float  # the sampling temperature; the trainer divides logits by it
    num_calls: int = 1
    #: [L] each token's advantage (0 where masked) when the calls of this sample have
    #: their own (``trainer.credit: turn``); None: every token has ``advantage``.
    token_advantages: list[float] | None = None
    #: The ``seq`` of each call in this sample, in order (one segment of the rollout).
    call_seqs: list[int] = field(default_factory=list)
    #: The role of its calls (``Call.role``; a sample never mixes roles), None without one.
    role: str | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def completion_advantages(self) -> list[float]:
        """The advantage of each completion token (``loss_mask`` 1), in order."""
        per_token = self.token_advantages
        if per_token is None:
            return [self.advantage for m in self.loss_mask if m]
        return [a for a, m in zip(per_token, self.loss_mask, strict=True) if m]

    @property
    def trains(self) -> bool:
        """Whether some completion token has a nonzero advantage (else the sample adds
        nothing to a policy loss or its gradient)."""
        return any(self.completion_advantages())


@dataclass(frozen=True)
class SampleStats:
    calls: int  # calls used (failed calls excluded)
    merged_calls: int  # calls appended to an earlier call's sequence
    samples: int
    failed_calls: int  # skipped: the engine failed, never a training sample
    empty_samples: int  # dropped: no completion token at all
    #: Rollouts whose calls all became one sample, and rollouts cut into several
    #: (a context reset, a sub-agent's own conversation: the prefix broke).
    one_sample_rollouts: int = 0
    forked_rollouts: int = 0

    @property
    def merge_fraction(self) -> float:
        """Fraction of calls that were prefix-merged into an earlier sequence."""
        return self.merged_calls / self.calls if self.calls else 0.0


def _check(call: Call) -> None:
    if len(call.logprobs) != len(call.completion_ids):
        raise ValueError(
            f"call {call.rollout_id}#{call.seq} has {len(call.logprobs)} logprobs for "
            f"{len(call.completion_ids)} completion tokens; they must match one to one"
        )
    if not call.prompt_ids:
        raise ValueError(f"call {call.rollout_id}#{call.seq} has an empty prompt")


def build_samples(
    rollouts: Sequence[Sequence[Call]], advantages: Sequence[float | Mapping[int, float]]
) -> tuple[list[Sample], SampleStats]:
    """Turn usable rollouts into samples.

    ``rollouts[i]`` are the calls of rollout ``i`` (any order; sorted by ``seq``),
    ``advantages[i]`` its advantage, given to every sample it yields, or a mapping
    call ``seq`` → advantage (per-call credit, :mod:`tether.trainer.credit`): each
    call's completion tokens get their call's, in ``Sample.token_advantages``.
    Samples come out in rollout order, then in the order of their first call.
    """
    if len(rollouts) != len(advantages):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    samples: list[Sample] = []
    calls = merged = failed = empty = one = forked = 0
    for index, (rollout_calls, advantage) in enumerate(zip(rollouts, advantages, strict=True)):
        per_call = advantage if isinstance(advantage, Mapping) else None
        whole = 0.0 if isinstance(advantage, Mapping) else float(advantage)
        ok = sorted((c for c in rollout_calls if c.status is CallStatus.OK), key=lambda c: c.seq)
        for call in ok:
            _check(call)
        calls, failed = calls + len(ok), failed + len(rollout_calls) - len(ok)
        kept = 0
        for segment in call_segments(ok):  # the calls of each segment, merged into one sample
            merged += len(segment.calls) - 1
            s = Sample([], [], [], whole, index, segment.temperature, 0, role=segment.role)
            s.token_advantages = [] if per_call is not None else None
            for call in segment.calls:
                _append(s, call, per_call)
            if not any(s.loss_mask):
                empty += 1
                continue
            if s.token_advantages is not None:
                trained = s.completion_advantages()
                s.advantage = sum(trained) / len(trained)
            samples.append(s)
            kept += 1
        one, forked = one + (kept == 1), forked + (kept > 1)
    return samples, SampleStats(calls, merged, len(samples), failed, empty, one, forked)


def _append(target: Sample, call: Call, per_call: Mapping[int, float] | None) -> None:
    """Extend ``target`` by ``call``: the prompt's new tokens (masked), then its completion."""
    gap = call.prompt_ids[len(target.input_ids) :]
    target.input_ids.extend(gap)
    target.loss_mask.extend([0] * len(gap))
    target.old_logprobs.extend([0.0] * len(gap))
    target.input_ids.extend(call.completion_ids)
    target.loss_mask.extend([1] * len(call.completion_ids))
    target.old_logprobs.extend(float(x) for x in call.logprobs)
    if per_call is not None and target.token_advantages is not None:
        if call.seq not in per_call:
            raise ValueError(f"no advantage for call {call.rollout_id}#{call.seq}")
        target.token_advantages.extend([0.0] * len(gap))
        target.token_advantages.extend([float(per_call[call.seq])] * len(call.completion_ids))
    target.num_calls += 1
    target.call_seqs.append(call.seq)


def weigh_roles(samples: Sequence[Sample], weights: Mapping[str, float]) -> list[Sample]:
    """The samples an update trains, by role: a role's weight scales its advantages (so
    its policy loss); weight 0 (a frozen role: ``train: false``) drops its samples. A
    role not in ``weights``, and a sample without a role, keep theirs (weight 1)."""
    out = []
    for s in samples:
        w = weights.get(s.role, 1.0) if s.role is not None else 1.0
        if w == 0:
            continue
        if w != 1:
            s.advantage *= w
            if s.token_advantages is not None:
                s.token_advantages = [a * w for a in s.token_advantages]
        out.append(s)
    return out


def make_micro_batches(samples: Sequence[Sample], max_tokens_per_batch: int) -> list[list[Sample]]:
    """Pack samples into micro-batches of at most ``max_tokens_per_batch`` padded tokens
    (rows × longest row).

    Samples are sorted by length, longest first (ties by input order), and filled
    greedily, so rows of a batch have similar lengths and little padding; the
    result is deterministic. A sample longer than the budget gets a batch of its
    own (truncating it would change what the loss means; the caller decides).
    """
    if max_tokens_per_batch <= 0:
        raise ValueError(f"max_tokens_per_batch ({max_tokens_per_batch}) must be positive")
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i))
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    width = 0
    for i in order:
        s = samples[i]
        new_width = max(width, len(s))
        if current and new_width * (len(current) + 1) > max_tokens_per_batch:
            batches.append(current)
            current, new_width = [], len(s)
        current.append(s)
        width = new_width
    if current:
        batches.append(current)
    return batches


def collate(samples: Sequence[Sample], pad_id: int = 0) -> dict[str, Tensor]:
    """Right-pad samples into tensors, all aligned with ``input_ids`` (module docstring).

    Returns ``input_ids`` ``[B, L]`` long, ``attention_mask`` ``[B, L]`` long,
    ``loss_mask`` ``[B, L]`` float32, ``old_logprobs`` ``[B, L]`` float32,
    ``advantages`` ``[B]`` float32 (``[B, L]``, each token's, when a sample has
    ``token_advantages``), ``rollout_index`` ``[B]`` long, ``temperature`` ``[B]`` float32.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    b, length = len(samples), max(len(s) for s in samples)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length), dtype=torch.float32)
    old = torch.zeros((b, length), dtype=torch.float32)
    for row, s in enumerate(samples):
        n = len(s)
        input_ids[row, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[row, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": old,
        "advantages": _advantages(samples, length),
        "rollout_index": torch.tensor([s.rollout_index for s in samples], dtype=torch.long),
        "temperature": torch.tensor([s.temperature for s in samples], dtype=torch.float32),
    }


def _advantages(samples: Sequence[Sample], length: int) -> Tensor:
    """``[B]``, or ``[B, length]`` when some sample has per-token advantages."""
    if all(s.token_advantages is None for s in samples):
        return torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    out = torch.zeros((len(samples), length), dtype=torch.float32)
    for row, s in enumerate(samples):
        per_token = s.token_advantages or [s.advantage] * len(s)
        out[row, : len(s)] = torch.tensor(per_token, dtype=torch.float32)
    return out
