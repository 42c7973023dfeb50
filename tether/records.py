"""The records tether keeps, and the rollout state machine.

These are plain dataclasses shared by every package; this module imports
nothing else of tether. See docs/design.md, "Records".

- :class:`Run`        one training or evaluation run (its config as given)
- :class:`Task`       one input of a data set (JSON), split ``train``/``val``
- :class:`Rollout`    one execution of the agent on one task; ``group_id`` ties
                      the ``n`` rollouts of one task in one step
- :class:`Place`      where a rollout sits in its run: phase, step, group, index
- :class:`Call`       one model call of a rollout, ``seq`` gap-free from 0
- :class:`Reward`     a float64 reward with its source
- :class:`AttemptEnd` how one attempt of a rollout ended: status, error, output tail
- :class:`Metric`, :class:`Checkpoint`  per run and step
- :class:`UpdateRecord` what one update trained: each group kept or dropped and why
  (:class:`GroupFate`), the advantages it used, its credit settings, the weights it made
"""

from __future__ import annotations

import enum
import math
import numbers
import re
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GRADER_FIELD",
    "AttemptEnd",
    "Call",
    "CallStatus",
    "Checkpoint",
    "GroupFate",
    "IllegalTransition",
    "Metric",
    "Phase",
    "Place",
    "Reward",
    "RewardSource",
    "Rollout",
    "RolloutStatus",
    "Run",
    "RunStatus",
    "Split",
    "Task",
    "UpdateGroup",
    "UpdateRecord",
    "agent_task",
    "check_role_name",
    "check_transition",
    "read_reward",
    "usable_reward",
]


class Split(str, enum.Enum):
    TRAIN = "train"
    VAL = "val"


class RunStatus(str, enum.Enum):
    """``running`` from its start; then ``finished``, ``failed`` (an error ended it) or
    ``interrupted`` (Ctrl-C or SIGTERM). A run killed outright stays ``running``."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class RolloutStatus(str, enum.Enum):
    """``queued → running → succeeded | failed | timeout | cancelled``."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMEOUT, RolloutStatus.CANCELLED}
)

# Legal transitions. An attempt is ``queued`` until its runner starts the agent
# (the runner may start it at once: ``running``). A retry is a new *attempt* of a
# rollout that goes back to ``queued`` or ``running`` from ``failed``/``timeout``
# (the old attempt's writes are refused).
_TRANSITIONS: dict[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.QUEUED: frozenset({RolloutStatus.RUNNING, RolloutStatus.CANCELLED}),
    RolloutStatus.RUNNING: _FINAL,
    RolloutStatus.FAILED: frozenset({RolloutStatus.QUEUED, RolloutStatus.RUNNING}),
    RolloutStatus.TIMEOUT: frozenset({RolloutStatus.QUEUED, RolloutStatus.RUNNING}),
    RolloutStatus.SUCCEEDED: frozenset(),
    RolloutStatus.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    """A rollout was asked to move between two states that are not connected."""


def check_transition(old: RolloutStatus, new: RolloutStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``old → new`` is legal."""
    if new not in _TRANSITIONS[old]:
        allowed = ", ".join(s.value for s in sorted(_TRANSITIONS[old], key=lambda s: s.value))
        raise IllegalTransition(
            f"rollout cannot go from {old.value!r} to {new.value!r} (allowed: {allowed or 'none'})"
        )


class CallStatus(str, enum.Enum):
    OK = "ok"
    FAILED = "failed"  # the engine failed; never a training sample
    CANCELLED = "cancelled"  # the client left a streamed call before it ended; never a sample


class RewardSource(str, enum.Enum):
    AGENT = "agent"
    GRADER = "grader"
    ADMIN = "admin"


def read_reward(value: object) -> tuple[float | None, str | None]:
    """A reward as given → ``(its float64, None)`` when it is a training signal, else
    ``(None, why not)``. The one rule, never raising: a finite real number is a signal;
    a bool, a non-number (``None``, ``"1.0"``), NaN, ±inf, or an int beyond float64
    (``10**400``) is not, and is never turned into a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"reward {value!r:.200} is not a number"
    try:
        as_float = float(value)
    except (OverflowError, TypeError, ValueError):
        # named by its size, not printed: repr() of an int past 4300 digits raises
        what = f"an int of {value.bit_length()} bits" if isinstance(value, int) else "a number"
        return None, f"reward ({what}) does not fit a float64"
    if not math.isfinite(as_float):
        return None, f"reward {as_float!r} is not finite"
    return as_float, None


def usable_reward(value: object) -> bool:
    """Whether a reward is a training signal (:func:`read_reward`'s rule)."""
    return read_reward(value)[0] is not None


def _now() -> float:
    return time.time()


@dataclass
class Run:
    id: str
    config: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = RunStatus.RUNNING
    created_at: float = field(default_factory=_now)


#: A task row's grader-only object (``{"question": ..., "grader": {"answer": 4}}``): the
#: grader gets the whole row, the agent never sees this field.
GRADER_FIELD = "grader"


def agent_task(data: dict[str, Any], private: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the agent receives of the task row ``data``: every field but
    :data:`GRADER_FIELD` and the ``private`` ones (``tasks.private_fields``)."""
    hidden = {GRADER_FIELD, *private}
    return {k: v for k, v in data.items() if k not in hidden}


@dataclass
class Task:
    """One task row. ``data`` is the row as written (what the grader gets); the agent
    gets :attr:`for_agent`: the row without ``grader`` and the ``private`` fields."""

    id: str
    data: dict[str, Any]
    split: Split = Split.TRAIN
    run_id: str | None = None
    private: tuple[str, ...] = ()  # field names kept from the agent (tasks.private_fields)

    @property
    def for_agent(self) -> dict[str, Any]:
        return agent_task(self.data, self.private)


class Phase(str, enum.Enum):
    """What a rollout was opened for: ``train`` (a sync update's group), ``async`` (async
    mode's scheduler: the update that takes it is decided later) or ``eval``."""

    TRAIN = "train"
    ASYNC = "async"
    EVAL = "eval"


@dataclass(frozen=True)
class Place:
    """Where a rollout sits in its run, as the code that opened it said (stored in columns;
    its id is opaque and never read for this).

    ``step``: for ``train``, the update the group feeds (from 1); for ``eval``, the step the
    eval ran at (0 before training, N after update N); for ``async``, the update it was
    opened for (the engine's policy version at opening + 1: the update it feeds if no
    other group is ahead of it). ``group``: the group's number in its collection;
    ``index``: the rollout's number in its group (None where a store written before
    tether kept places did not say). ``greedy``: an eval's greedy pass (temperature 0)."""

    phase: Phase
    step: int | None = None
    group: int | None = None
    index: int | None = None
    greedy: bool = False


@dataclass
class Rollout:
    id: str
    run_id: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    task: dict[str, Any] | None = None  # the task input as given to the agent
    status: RolloutStatus = RolloutStatus.QUEUED
    attempt: int = 0  # the current attempt; 0 until it first runs
    reward: float | None = None  # the final reward (float64); None if none/unusable
    reward_source: RewardSource | None = None
    final_answer: str | None = None
    error: str | None = None
    created_at: float = field(default_factory=_now)
    finished_at: float | None = None
    #: when the current attempt's agent started (None while queued, and in stores from
    #: before tether recorded it); ``created_at`` is the batch's, shared by its rollouts
    started_at: float | None = None
    #: where it sits in its run; None for one opened outside the training loop (the admin
    #: API, ``tether serve``, record mode)
    place: Place | None = None

    @property
    def usable(self) -> bool:
        return self.status is RolloutStatus.SUCCEEDED and usable_reward(self.reward)


#: A role name (``/rollouts/{id}/roles/{role}/v1``, the run config's ``roles``): a letter,
#: then up to 63 letters, digits, ``_`` or ``-``.
_ROLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def check_role_name(name: object) -> str:
    """``name`` if it is a role name; ValueError naming the rule otherwise."""
    if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
        raise ValueError(
            f"invalid role name {name!r}: use a letter, then up to 63 letters, digits, _ or -"
        )
    return name


@dataclass
class Call:
    """One model call. ``logprobs[i]`` is the log-probability of ``completion_ids[i]``
    under the sampling distribution ``log_softmax(logits / T)`` (T = 1 when greedy),
    before top-p truncation; the trainer recomputes exactly this quantity.

    ``constraint`` names the grammar the tokens were drawn under (``json_schema:NAME``,
    ``json_object``, ``tool_choice:...``, ``strict_tools``), None when unconstrained:
    the logprobs are then still the unmasked model's, not those of the masked
    distribution the tokens were drawn from (docs/structured-outputs.md)."""

    rollout_id: str
    seq: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: int
    attempt: int = 1
    request: dict[str, Any] = field(default_factory=dict)  # messages, tools, params
    response: dict[str, Any] = field(default_factory=dict)  # the OpenAI body returned
    finish_reason: str | None = None
    temperature: float = 1.0
    status: CallStatus = CallStatus.OK
    error: str | None = None
    latency_s: float = 0.0
    created_at: float = field(default_factory=_now)
    constraint: str | None = None
    role: str | None = None


@dataclass
class Reward:
    rollout_id: str
    value: float
    source: RewardSource
    attempt: int = 1
    call_seq: int | None = None  # an intermediate reward for one call; None = final
    created_at: float = field(default_factory=_now)


@dataclass
class AttemptEnd:
    """How one attempt of a rollout ended, kept for every attempt (retried ones too).

    ``output_tail`` is the end of what the agent printed (stdout and stderr
    interleaved; the traceback for an in-process agent), the last 4 KiB as
    the store keeps it. ``success`` is the task's own verdict
    (the grader's, or the run's success threshold); None when not graded.
    ``started_at`` is when the attempt's agent started (None if it never did, and
    in stores from before tether recorded it). ``grader_error`` is what the grader
    raised on the attempt: ``"KeyError: 'answr' (grader.py:12 in grade)"`` on its
    first line, then the traceback's last frames; None when it did not raise.
    ``grade_detail`` is what a group grader (the judge) saw and answered for the
    attempt: its model, prompt messages, raw answer and parsed scores (JSON); None
    for other graders. The store keeps a group's prompt once (the others' detail names
    that attempt as ``prompt_from``) and fills it back in when it reads attempts.
    """

    rollout_id: str
    attempt: int
    status: RolloutStatus
    error: str | None = None
    exit_code: int | None = None
    output_tail: str = ""
    success: bool | None = None
    finished_at: float = field(default_factory=_now)
    started_at: float | None = None
    grader_error: str | None = None
    grade_detail: dict[str, Any] | None = None


@dataclass
class Metric:
    run_id: str
    step: int
    name: str
    value: float
    created_at: float = field(default_factory=_now)


@dataclass
class Checkpoint:
    run_id: str
    step: int
    path: str
    created_at: float = field(default_factory=_now)


class GroupFate(str, enum.Enum):
    """What an update did with a finished group: ``kept`` (in the batch it learned from)
    or why it was dropped: ``unusable`` (a rollout without a usable reward, or with turn
    credit a non-finite intermediate one), ``no_signal`` (``rollout.filter_groups``: every
    advantage would be 0), ``surplus`` (``filter_groups``: it had signal, the batch was
    full), ``lag`` (async mode: older than ``run.max_policy_lag`` allows)."""

    KEPT = "kept"
    UNUSABLE = "unusable"
    NO_SIGNAL = "no_signal"
    SURPLUS = "surplus"
    LAG = "lag"


@dataclass(frozen=True)
class UpdateGroup:
    """One group an update decided on: its number (the rollouts' ``Place.group``), its
    rollout ids in index order, its fate and, for a kept group, each rollout's advantage
    (a float, or per call seq with turn credit or roles)."""

    group: int
    rollouts: tuple[str, ...]
    fate: GroupFate
    advantages: tuple[float | dict[int, float], ...] | None = None


@dataclass
class UpdateRecord:
    """What update ``step`` of a run trained, written once by the run when it decided it.

    ``version``: the policy version the update produced (None: nothing was learned, e.g.
    every kept group had zero reward variance). ``credit``: the run's credit settings as
    the update used them (``tether.run``'s ``Learning``, as a dict). ``groups``: every
    group decided at this update, kept or dropped, in group order."""

    run_id: str
    step: int
    version: int | None
    credit: dict[str, Any]
    groups: list[UpdateGroup]
    created_at: float = field(default_factory=_now)

    def kept(self) -> list[UpdateGroup]:
        return [g for g in self.groups if g.fate is GroupFate.KEPT]
