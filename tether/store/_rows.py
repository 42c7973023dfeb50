"""Rows ↔ records: the column lists the store selects, and the decoders.

Each ``*_COLUMNS`` string is the SELECT list whose row the matching
``*_from_row`` function turns back into a record of :mod:`tether.records`.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tether.records import (
    AttemptEnd,
    Call,
    CallStatus,
    Checkpoint,
    GroupFate,
    Metric,
    Phase,
    Place,
    Reward,
    RewardSource,
    Rollout,
    RolloutStatus,
    Run,
    RunStatus,
    Split,
    Task,
    UpdateGroup,
    UpdateRecord,
)
from tether.store._codec import load_json, reward_value, unpack_floats, unpack_ids

__all__ = [
    "ATTEMPT_COLUMNS",
    "CALL_COLUMNS",
    "CHECKPOINT_COLUMNS",
    "METRIC_COLUMNS",
    "REWARD_COLUMNS",
    "ROLLOUT_COLUMNS",
    "RUN_COLUMNS",
    "TASK_COLUMNS",
    "UPDATE_COLUMNS",
    "attempt_from_row",
    "call_from_row",
    "checkpoint_from_row",
    "filters",
    "metric_from_row",
    "optional",
    "place_columns",
    "reward_from_row",
    "rollout_from_row",
    "run_from_row",
    "task_from_row",
    "update_fates",
    "update_from_row",
    "where",
    "with_shared_prompt",
]

Row = Sequence
T = TypeVar("T")

RUN_COLUMNS = "id, config, status, created_at"
TASK_COLUMNS = "id, data, split, run_id"
ROLLOUT_COLUMNS = (
    "id, run_id, task_id, group_id, task, status, attempt, reward, reward_source, "
    "final_answer, error, created_at, finished_at, started_at, "
    "phase, step, group_index, member_index, greedy"
)
CALL_COLUMNS = (
    "rollout_id, seq, prompt_ids, completion_ids, logprobs, policy_version, attempt, "
    "request, response, finish_reason, temperature, status, error, latency_s, created_at, "
    "constraint_label, role"
)
ATTEMPT_COLUMNS = (
    "rollout_id, attempt, status, error, exit_code, output_tail, success, finished_at, started_at, "
    "grader_error, grade_detail"
)
REWARD_COLUMNS = "rollout_id, value, given, source, attempt, call_seq, created_at"
METRIC_COLUMNS = "run_id, step, name, value, created_at"
CHECKPOINT_COLUMNS = "run_id, step, path, created_at"
UPDATE_COLUMNS = "run_id, step, version, credit, fates, created_at"


def optional(convert: Callable[[Any], T], value: Any) -> T | None:
    """``convert(value)`` (which checks it), or None (no filter) when ``value`` is None."""
    return None if value is None else convert(value)


def filters(*pairs: tuple[str, Any]) -> tuple[list[str], list[Any]]:
    """The conditions and parameters of the ``(condition, value)`` pairs whose value is
    not None (a None value sets no filter)."""
    kept = [(condition, value) for condition, value in pairs if value is not None]
    return [c for c, _ in kept], [v for _, v in kept]


def where(*pairs: tuple[str, Any]) -> tuple[str, list[Any]]:
    """``" WHERE a AND b"`` of :func:`filters` (``""`` when none is set) and its parameters."""
    conditions, params = filters(*pairs)
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), params


def run_from_row(row: Row) -> Run:
    return Run(id=row[0], config=load_json(row[1]), status=RunStatus(row[2]), created_at=row[3])


def task_from_row(row: Row) -> Task:
    return Task(id=row[0], data=load_json(row[1]), split=Split(row[2]), run_id=row[3])


def rollout_from_row(row: Row) -> Rollout:
    return Rollout(
        id=row[0],
        run_id=row[1],
        task_id=row[2],
        group_id=row[3],
        task=load_json(row[4]),
        status=RolloutStatus(row[5]),
        attempt=row[6],
        reward=row[7],
        reward_source=None if row[8] is None else RewardSource(row[8]),
        final_answer=row[9],
        error=row[10],
        created_at=row[11],
        finished_at=row[12],
        started_at=row[13],
        place=None
        if row[14] is None
        else Place(Phase(row[14]), row[15], row[16], row[17], bool(row[18])),
    )


def place_columns(
    place: Place | None,
) -> tuple[str | None, int | None, int | None, int | None, int]:
    """A rollout's place → its columns ``phase, step, group_index, member_index, greedy``."""
    if place is None:
        return None, None, None, None, 0
    return place.phase.value, place.step, place.group, place.index, int(place.greedy)


def attempt_from_row(row: Row) -> AttemptEnd:
    return AttemptEnd(
        rollout_id=row[0],
        attempt=row[1],
        status=RolloutStatus(row[2]),
        error=row[3],
        exit_code=row[4],
        output_tail=row[5],
        success=None if row[6] is None else bool(row[6]),
        finished_at=row[7],
        started_at=row[8],
        grader_error=row[9],
        grade_detail=load_json(row[10]),
    )


def call_from_row(row: Row) -> Call:
    return Call(
        rollout_id=row[0],
        seq=row[1],
        prompt_ids=unpack_ids(row[2]),
        completion_ids=unpack_ids(row[3]),
        logprobs=unpack_floats(row[4]),
        policy_version=row[5],
        attempt=row[6],
        request=load_json(row[7]),
        response=load_json(row[8]),
        finish_reason=row[9],
        temperature=row[10],
        status=CallStatus(row[11]),
        error=row[12],
        latency_s=row[13],
        created_at=row[14],
        constraint=row[15],
        role=row[16],
    )


def reward_from_row(row: Row) -> Reward:
    return Reward(
        rollout_id=row[0],
        value=reward_value(row[1], row[2]),
        source=RewardSource(row[3]),
        attempt=row[4],
        call_seq=row[5],
        created_at=row[6],
    )


def metric_from_row(row: Row) -> Metric:
    # SQLite stores NaN as NULL; a NaN metric (a diverged loss) reads back as NaN.
    value = float("nan") if row[3] is None else row[3]
    return Metric(run_id=row[0], step=row[1], name=row[2], value=value, created_at=row[4])


def checkpoint_from_row(row: Row) -> Checkpoint:
    return Checkpoint(run_id=row[0], step=row[1], path=row[2], created_at=row[3])


def with_shared_prompt(conn: sqlite3.Connection, end: AttemptEnd) -> AttemptEnd:
    """``end`` with the judge's prompt filled back in where its ``grade_detail`` names the
    attempt that keeps it for the whole group (``"prompt_from": {"rollout_id",
    "attempt"}``, the prompt stored once per group); as it is otherwise."""
    detail = end.grade_detail
    ref = detail.get("prompt_from") if detail else None
    if not isinstance(ref, dict) or detail is None or "messages" in detail:
        return end
    row = conn.execute(
        "SELECT grade_detail FROM attempts WHERE rollout_id = ? AND attempt = ?",
        (ref.get("rollout_id"), ref.get("attempt")),
    ).fetchone()
    held = load_json(row[0]) if row and row[0] else None
    if not isinstance(held, dict) or "messages" not in held:
        return end  # its holder is gone: the rest of the detail still reads
    return dataclasses.replace(end, grade_detail={**detail, "messages": held["messages"]})


def update_fates(groups: Sequence[UpdateGroup]) -> list[dict[str, object]]:
    """An update's groups as the JSON of ``updates.fates`` (a per-call advantage's seq
    becomes a string key)."""
    return [
        {
            "group": g.group,
            "rollouts": list(g.rollouts),
            "fate": g.fate.value,
            "advantages": None if g.advantages is None else list(g.advantages),
        }
        for g in groups
    ]


def _advantage(a: float | dict[str, float]) -> float | dict[int, float]:
    return {int(k): float(v) for k, v in a.items()} if isinstance(a, dict) else float(a)


def update_from_row(row: Row) -> UpdateRecord:
    groups = [
        UpdateGroup(
            int(g["group"]),
            tuple(g["rollouts"]),
            GroupFate(g["fate"]),
            None if g["advantages"] is None else tuple(_advantage(a) for a in g["advantages"]),
        )
        for g in load_json(row[4])
    ]
    return UpdateRecord(row[0], row[1], row[2], load_json(row[3]), groups, row[5])
