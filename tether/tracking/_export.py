"""``tether export``: one row per rollout attempt, with its calls, to JSONL or Parquet.

The schema is in docs/export.md (:data:`ROW_FIELDS`, :data:`CALL_FIELDS`);
both formats hold the same rows and load with ``datasets.load_dataset``
("json" / "parquet"). Free-form JSON of the store (the task, each call's
messages, tools and response) is kept as JSON text, so the columns keep one
type across rows whatever the agent sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tether.errors import UserError
from tether.records import Call, Rollout
from tether.tracking._groups import Fate, place_kind, rollout_fates

__all__ = [
    "CALL_FIELDS",
    "EXPORT_FORMATS",
    "ROW_FIELDS",
    "SAMPLE_FIELDS",
    "export_attempts",
    "write_rows",
]

EXPORT_FORMATS = ("jsonl", "parquet")

#: A row: one attempt of one rollout (name -> pyarrow type name, for the Parquet schema).
ROW_FIELDS = {
    "run_id": "string",
    "rollout_id": "string",
    "attempt": "int64",
    "final_attempt": "bool",
    "group_id": "string",
    "group": "int64",
    "index": "int64",
    "kind": "string",
    "step": "int64",
    "task_id": "string",
    "task": "string",
    "status": "string",
    "reward": "float64",
    "reward_source": "string",
    "success": "bool",
    "advantage": "float64",
    "update": "int64",
    "fate": "string",
    "final_answer": "string",
    "error": "string",
    "grade_detail": "string",
}
#: A call of an attempt (the items of the row's ``calls`` list).
CALL_FIELDS = {
    "seq": "int64",
    "role": "string",
    "policy_version": "int64",
    "status": "string",
    "finish_reason": "string",
    "temperature": "float64",
    "latency_s": "float64",
    "messages": "string",
    "tools": "string",
    "response": "string",
    "prompt_ids": "list<int32>",
    "completion_ids": "list<int32>",
    "logprobs": "list<float32>",
    "reward": "float64",
    "advantage": "float64",
}
#: A training sample (``tether export --samples``): one row per sample of the update.
SAMPLE_FIELDS = {
    "run_id": "string",
    "step": "int64",
    "rollout_id": "string",
    "input_ids": "list<int32>",
    "loss_mask": "list<int8>",
    "old_logprobs": "list<float32>",
    "advantage": "float64",
    "token_advantages": "list<float32>",
    "temperature": "float64",
    "num_calls": "int64",
}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _call_row(c: Call, reward: float | None, advantage: float | None) -> dict[str, Any]:
    request = c.request or {}
    return {
        "seq": c.seq,
        "role": c.role,
        "policy_version": c.policy_version,
        "status": c.status.value,
        "finish_reason": c.finish_reason,
        "temperature": float(c.temperature),
        "latency_s": float(c.latency_s),
        "messages": json.dumps(request.get("messages") or []),
        "tools": json.dumps(request.get("tools")) if request.get("tools") else None,
        "response": json.dumps(c.response or {}),
        "prompt_ids": list(c.prompt_ids),
        "completion_ids": list(c.completion_ids),
        "logprobs": [float(x) for x in c.logprobs],
        "reward": _finite(reward),
        "advantage": advantage,
    }


def export_attempts(store: Any, run_id: str | None = None) -> Iterator[dict[str, Any]]:
    """The rows of every rollout attempt in ``store`` (or of run record ``run_id``), in
    creation order. The last attempt of each rollout an update decided on carries that
    update (``update``), its group's fate there (``fate``: kept, or why it was dropped)
    and, when kept, the advantage it trained with, as the run recorded them; else None."""
    runs = [run_id] if run_id is not None else [r.id for r in store.list_runs()]
    for rid in runs:
        fates = rollout_fates(store.updates(rid))
        for r in store.list_rollouts(run_id=rid):
            yield from _rollout_rows(store, r, fates.get(r.id))
    if run_id is None:  # rollouts of no run: tether serve's admin API, record mode
        for r in store.list_rollouts():
            if r.run_id is None or r.run_id not in runs:
                yield from _rollout_rows(store, r, None)


def _source(r: Rollout, stored: Any, final: bool) -> str | None:
    """The reward's source: the rollout's for its final attempt, else the attempt's own."""
    if final:
        return r.reward_source.value if r.reward_source else None
    return stored.source.value if stored is not None else None


def _rollout_rows(store: Any, r: Rollout, fate: Fate | None) -> Iterator[dict[str, Any]]:
    p = r.place
    advantage = None if fate is None else fate.advantage
    ends = {a.attempt: a for a in store.attempts(r.id)}
    rewards = store.rewards(r.id)
    task = r.task
    if r.task_id and r.run_id and task is None:
        try:
            task = store.get_task(r.task_id, run_id=r.run_id).data
        except LookupError:
            task = None
    for attempt in range(1, max(r.attempt, 1) + 1):
        final = attempt == r.attempt
        end = ends.get(attempt)
        mine = [w for w in rewards if w.attempt == attempt]
        per_call: dict[int, float] = {}  # several for one call add up, as in the trainer
        for w in mine:
            if w.call_seq is not None:
                per_call[w.call_seq] = per_call.get(w.call_seq, 0.0) + w.value
        stored = next((w for w in reversed(mine) if w.call_seq is None), None)
        calls = store.calls(r.id, attempt=attempt)
        yield {
            "run_id": r.run_id,
            "rollout_id": r.id,
            "attempt": attempt,
            "final_attempt": final,
            "group_id": r.group_id,
            "group": None if p is None else p.group,
            "index": None if p is None else p.index,
            "kind": place_kind(r),
            "step": None if p is None else p.step,
            "task_id": r.task_id,
            "task": json.dumps(task) if task is not None else None,
            "status": (r.status if final else end.status if end else r.status).value,
            "reward": _finite(r.reward) if final else _finite(stored.value if stored else None),
            "reward_source": _source(r, stored, final),
            "success": end.success if end else None,
            "advantage": advantage if final and not isinstance(advantage, dict) else None,
            "update": fate.step if final and fate is not None else None,
            "fate": fate.fate.value if final and fate is not None else None,
            "final_answer": r.final_answer if final else None,
            "error": (r.error if final else end.error if end else None),
            "grade_detail": _grade_detail(end),
            "calls": [
                _call_row(c, per_call.get(c.seq), _call_advantage(advantage, c.seq, final))
                for c in calls
            ],
        }


def _grade_detail(end: Any) -> str | None:
    """What a judge saw and said for the attempt (``AttemptEnd.grade_detail``), as JSON."""
    detail = end.grade_detail if end is not None else None
    return json.dumps(detail, ensure_ascii=False) if detail else None


def _call_advantage(
    advantage: float | dict[int, float] | None, seq: int, final: bool
) -> float | None:
    """The advantage the call's tokens trained with: the rollout's, or its own (turn credit)."""
    if not final or advantage is None:
        return None
    return advantage.get(seq) if isinstance(advantage, dict) else advantage


def _schema(samples: bool) -> Any:
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "bool": pa.bool_(),
        "float64": pa.float64(),
        "list<int32>": pa.list_(pa.int32()),
        "list<int8>": pa.list_(pa.int8()),
        "list<float32>": pa.list_(pa.float32()),
    }
    if samples:
        return pa.schema([(k, types[v]) for k, v in SAMPLE_FIELDS.items()])
    call = pa.struct([(k, types[v]) for k, v in CALL_FIELDS.items()])
    return pa.schema([*((k, types[v]) for k, v in ROW_FIELDS.items()), ("calls", pa.list_(call))])


def write_rows(
    rows: Iterator[dict[str, Any]], path: Path, fmt: str, *, samples: bool = False
) -> int:
    """Write ``rows`` (attempts, or with ``samples`` training samples) to ``path`` as
    ``jsonl`` or ``parquet``; returns how many."""
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"--format {fmt!r} is not known: use jsonl or parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    if fmt == "jsonl":
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row, allow_nan=False) + "\n")
                n += 1
        return n
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("--format parquet needs pyarrow: pip install 'tether[export]'") from None
    schema = _schema(samples)
    batch: list[dict[str, Any]] = []
    with pq.ParquetWriter(str(path), schema) as writer:
        for row in rows:
            batch.append(row)
            n += 1
            if len(batch) == 512:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n
