"""Reads for viewers (``tether dashboard``): pages of rollouts, metrics since a row, a
run's activity. Mixed into :class:`~tether.store.Store`; every method only reads, so
they all work on a store opened ``read_only``.
"""

from __future__ import annotations

from typing import Any

from tether.records import AttemptEnd, Checkpoint, Metric, Phase, Rollout, RolloutStatus
from tether.store import _rows as rows
from tether.store._db import Database
from tether.store._errors import InvalidRecord

__all__ = ["ROLLOUT_SORTS", "Browse"]

_R_COLUMNS = ", ".join("r." + c.strip() for c in rows.ROLLOUT_COLUMNS.split(","))
_CURRENT = "c.rollout_id = r.id AND c.attempt = r.attempt"
_N_CALLS = f"(SELECT COUNT(*) FROM calls c WHERE {_CURRENT})"
_N_TOKENS = f"(SELECT COALESCE(SUM(c.n_completion), 0) FROM calls c WHERE {_CURRENT})"

#: ``rollout_page``'s sort keys → SQL (ties broken by creation order).
ROLLOUT_SORTS = {
    "created": "r.rowid",
    "reward": "r.reward IS NULL, r.reward",
    "status": "r.status",
    "task": "r.task_id",
    "calls": "n_calls",
    "tokens": "n_tokens",
    # the attempt's own time (a rollout's created_at is its batch's); no comma-space inside
    # a key: the direction is added after each ", "-separated part
    "duration": "r.finished_at IS NULL, r.finished_at - IFNULL(r.started_at,r.created_at)",
}


class Browse:
    """Read-only views over the tables :class:`~tether.store.Store` writes."""

    _db: Database

    def metrics_after(
        self, run_id: str, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, Metric]]:
        """``(row id, metric)`` of the run's metrics stored after row ``after``, in the order
        they were stored: a viewer polls with the last id it has and gets only what is new."""
        sql = (
            f"SELECT id, {rows.METRIC_COLUMNS} FROM metrics WHERE run_id = ? AND id > ? ORDER BY id"
        )
        params: list[Any] = [run_id, int(after)]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._db.read() as conn:
            found = conn.execute(sql, params).fetchall()
        return [(r[0], rows.metric_from_row(r[1:])) for r in found]

    def checkpoints(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, by step."""
        with self._db.read() as conn:
            found = conn.execute(
                f"SELECT {rows.CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? "
                "ORDER BY step, id",
                (run_id,),
            ).fetchall()
        return [rows.checkpoint_from_row(r) for r in found]

    def run_activity(self, run_id: str) -> dict[str, Any]:
        """What a run has done, from one snapshot: ``steps`` (distinct steps with a metric
        other than ``eval/*``), ``rollouts``, ``calls``, ``last_at`` (the newest metric or
        finished rollout, Unix seconds; None before either) and ``best`` (the highest value
        of each ``eval/*_success`` metric)."""
        with self._db.read(snapshot=True) as conn:
            steps, last_metric = conn.execute(
                "SELECT COUNT(DISTINCT CASE WHEN name NOT LIKE 'eval/%' THEN step END), "
                "MAX(created_at) FROM metrics WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            n_rollouts, last_rollout = conn.execute(
                "SELECT COUNT(*), MAX(finished_at) FROM rollouts WHERE run_id = ?", (run_id,)
            ).fetchone()
            n_calls = conn.execute(
                "SELECT COUNT(*) FROM calls WHERE rollout_id IN "
                "(SELECT id FROM rollouts WHERE run_id = ?)",
                (run_id,),
            ).fetchone()[0]
            best = conn.execute(
                "SELECT name, MAX(value) FROM metrics WHERE run_id = ? AND name LIKE "
                "'eval/%\\_success' ESCAPE '\\' GROUP BY name",
                (run_id,),
            ).fetchall()
        times = [t for t in (last_metric, last_rollout) if t is not None]
        return {
            "steps": steps or 0,
            "rollouts": n_rollouts,
            "calls": n_calls,
            "last_at": max(times) if times else None,
            "best": {name: value for name, value in best if value is not None},
        }

    def rollout_page(
        self,
        run_id: str | None,
        *,
        phase: Phase | str | None = None,
        step: int | None = None,
        task_id: str | None = None,
        status: RolloutStatus | str | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        sort: str = "created",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[int, list[tuple[Rollout, int, int]]]:
        """One page of a run's rollouts: ``(how many match, [(rollout, calls, completion
        tokens), ...])``, counting the calls of each rollout's current attempt.

        Filters: ``phase`` and ``step`` (the rollout's stored place), ``task_id``, ``status``,
        the reward range (a rollout without a usable reward matches no range). ``sort``
        is a key of :data:`ROLLOUT_SORTS`; ties keep creation order (either direction).
        """
        if sort not in ROLLOUT_SORTS:
            raise InvalidRecord(f"sort ({sort!r}) must be one of {', '.join(ROLLOUT_SORTS)}")
        where, params = rows.filters(
            ("r.phase = ?", rows.optional(Phase, phase)),
            ("r.step = ?", rows.optional(int, step)),
            ("r.task_id = ?", task_id),
            ("r.status = ?", rows.optional(RolloutStatus, status)),
            ("r.reward >= ?", rows.optional(float, reward_min)),
            ("r.reward <= ?", rows.optional(float, reward_max)),
        )
        where, params = ["r.run_id IS ?", *where], [run_id, *params]  # None: of no run
        scope = " WHERE " + " AND ".join(where)
        order = ROLLOUT_SORTS[sort]
        direction = " DESC" if descending else ""
        order = ", ".join(  # "x IS NULL" keeps the rows without a value last either way
            part + ("" if part.endswith("IS NULL") else direction) for part in order.split(", ")
        )
        sql = (
            f"SELECT {_R_COLUMNS}, {_N_CALLS} AS n_calls, {_N_TOKENS} AS n_tokens "
            f"FROM rollouts r{scope} ORDER BY {order}, r.rowid LIMIT ? OFFSET ?"
        )
        with self._db.read(snapshot=True) as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM rollouts r{scope}", params).fetchone()[0]
            found = conn.execute(sql, [*params, int(limit), max(int(offset), 0)]).fetchall()
        return total, [(rows.rollout_from_row(r[:-2]), r[-2], r[-1]) for r in found]

    def latest_rollouts(
        self,
        run_id: str | None = None,
        status: RolloutStatus | str | None = None,
        limit: int = 50,
    ) -> tuple[int, list[tuple[Rollout, int]]]:
        """The newest ``limit`` rollouts (all when ``limit`` <= 0), filtered by run and
        status, oldest of them first: ``(how many match, [(rollout, calls of its current
        attempt), ...])``, so a viewer can say how many it left out."""
        scope, params = rows.where(
            ("r.run_id = ?", run_id), ("r.status = ?", rows.optional(RolloutStatus, status))
        )
        sql = f"SELECT {_R_COLUMNS}, {_N_CALLS} FROM rollouts r{scope} ORDER BY r.rowid DESC"
        if limit > 0:
            sql += f" LIMIT {int(limit)}"
        with self._db.read(snapshot=True) as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM rollouts r{scope}", params).fetchone()[0]
            found = conn.execute(sql, params).fetchall()
        return total, [(rows.rollout_from_row(r[:-1]), r[-1]) for r in reversed(found)]

    def current_ends(self, rollout_ids: list[str]) -> dict[str, AttemptEnd]:
        """How each rollout's current attempt ended (success, exit code), by rollout id;
        a rollout whose attempt has not ended is missing. ``grade_detail`` is as stored
        (a group's shared judge prompt not filled in: :meth:`Store.attempts` does)."""
        ids = list(dict.fromkeys(rollout_ids))
        out: dict[str, AttemptEnd] = {}
        with self._db.read(snapshot=True) as conn:
            for at in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                chunk = ids[at : at + 500]
                marks = ",".join("?" * len(chunk))
                found = conn.execute(
                    f"SELECT {rows.ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id IN ({marks}) "
                    "AND attempt = (SELECT attempt FROM rollouts WHERE id = rollout_id)",
                    chunk,
                ).fetchall()
                out.update((r[0], rows.attempt_from_row(r)) for r in found)
        return out
