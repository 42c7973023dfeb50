"""The run-level half of :class:`~tether.store.Store`: runs, tasks, metrics, checkpoints,
what each update trained.

:class:`RunLog` holds the connections (``self._db``) and the methods that do
not touch rollouts; :class:`~tether.store._store.Store` adds rollouts, calls
and rewards on top. Users only ever see ``Store``.
"""

from __future__ import annotations

import math
import sqlite3
import time
import uuid
from typing import Any

from tether.records import Checkpoint, Metric, Run, RunStatus, Split, Task, UpdateRecord
from tether.store import _rows as rows
from tether.store._codec import dump_json, redact_secrets
from tether.store._db import Database
from tether.store._errors import AlreadyExists, InvalidRecord, NotFound

__all__ = ["RunLog"]


class RunLog:
    """Runs, tasks, metrics, checkpoints and update records over one :class:`Database`."""

    _db: Database

    @property
    def path(self) -> str:
        return self._db.path

    def __repr__(self) -> str:
        return f"Store({self._db.path!r}, synchronous={self._db.synchronous!r})"

    def close(self) -> None:
        """Close the file; later calls raise :class:`StoreError`. Safe to call twice."""
        self._db.close()

    def schema_version(self) -> int:
        """The file's schema version (``PRAGMA user_version``)."""
        with self._db.read() as conn:
            return conn.execute("PRAGMA user_version").fetchone()[0]

    # -- runs and tasks -------------------------------------------------------

    def create_run(self, config: dict[str, Any], run_id: str | None = None) -> Run:
        """Store a new run (status running) with its config, secrets redacted."""
        run = Run(id=run_id or f"run-{uuid.uuid4().hex[:12]}", config=redact_secrets(dict(config)))
        text = dump_json(run.config, "run config")
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO runs (id, config, status, created_at) VALUES (?,?,?,?) "
                "ON CONFLICT(id) DO NOTHING",
                (run.id, text, run.status.value, run.created_at),
            )
            if cur.rowcount == 0:
                raise AlreadyExists(f"run {run.id!r} already exists")
        return run

    def get_run(self, run_id: str) -> Run:
        """The run with this id, or :class:`NotFound`."""
        with self._db.read() as conn:
            row = conn.execute(f"SELECT {rows.RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
            row = row.fetchone()
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return rows.run_from_row(row)

    def list_runs(self) -> list[Run]:
        """Every run, oldest first."""
        with self._db.read() as conn:
            found = conn.execute(f"SELECT {rows.RUN_COLUMNS} FROM runs ORDER BY rowid").fetchall()
        return [rows.run_from_row(r) for r in found]

    def set_run_status(self, run_id: str, status: RunStatus) -> None:
        """Set a run's status (any status may follow any other)."""
        value = RunStatus(status).value
        with self._db.write() as conn:
            cur = conn.execute("UPDATE runs SET status = ? WHERE id = ?", (value, run_id))
            if cur.rowcount == 0:
                raise NotFound(f"run {run_id!r} not found")

    def add_tasks(self, tasks: list[Task], run_id: str | None = None) -> None:
        """Store tasks (each as of ``run_id`` when given, else of its own ``run_id``) in
        one transaction, one ``executemany``: a run's 4000 tasks take milliseconds. Ids
        are unique per run: re-adding an identical task is a no-op; the same (run, id)
        with other content raises :class:`AlreadyExists`."""
        values = [
            (
                t.id,
                t.run_id if run_id is None else run_id,
                Split(t.split).value,
                dump_json(t.data, f"task {t.id!r} data"),
            )
            for t in tasks
        ]
        with self._db.write() as conn:
            for run_id in {v[1] for v in values} - {None}:
                if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                    raise NotFound(f"tasks of run {run_id!r}: run {run_id!r} not found")
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO tasks (id, run_id, split, data) VALUES (?,?,?,?) "
                "ON CONFLICT DO NOTHING",
                values,
            )
            if conn.total_changes - before == len(values):
                return
            for tid, rid, split, data in values:  # some were there: the slow check
                old = conn.execute(
                    "SELECT split, data FROM tasks WHERE ifnull(run_id, '') = ifnull(?, '') "
                    "AND id = ?",  # the unique index's own expression, so the index is used
                    (rid, tid),
                ).fetchone()
                if tuple(old) != (split, data):
                    raise AlreadyExists(
                        f"task {tid!r} of run {rid!r} already exists with other content"
                    )

    def get_task(self, task_id: str, run_id: str | None = None) -> Task:
        """The task with this id (of ``run_id`` when given, else the first stored), or
        :class:`NotFound`."""
        sql = f"SELECT {rows.TASK_COLUMNS} FROM tasks WHERE id = ?"
        params: list[Any] = [task_id]
        if run_id is not None:
            sql += " AND ifnull(run_id, '') = ?"  # as the unique index has it
            params.append(run_id)
        with self._db.read() as conn:
            row = conn.execute(sql + " ORDER BY rowid LIMIT 1", params).fetchone()
        if row is None:
            raise NotFound(f"task {task_id!r} not found")
        return rows.task_from_row(row)

    def list_tasks(self, run_id: str | None = None, split: Split | str | None = None) -> list[Task]:
        """Tasks in the order they were added, optionally of one run and/or split."""
        scope, params = rows.where(
            ("run_id = ?", run_id), ("split = ?", rows.optional(Split, split))
        )
        sql = f"SELECT {rows.TASK_COLUMNS} FROM tasks{scope} ORDER BY rowid"
        with self._db.read() as conn:
            found = conn.execute(sql, params).fetchall()
        return [rows.task_from_row(r) for r in found]

    # -- metrics and checkpoints ---------------------------------------------

    def log_metrics(self, run_id: str, step: int, values: dict[str, float]) -> None:
        """Store one value per name for ``step`` of the run, in one transaction.

        NaN is stored (as NULL, SQLite's only NaN) and reads back as NaN.
        """
        now = time.time()
        try:
            params = [(run_id, int(step), str(k), float(v), now) for k, v in values.items()]
        except (TypeError, ValueError) as e:
            raise InvalidRecord(f"metric values of run {run_id!r} must be numbers ({e})") from None
        with self._db.write() as conn:
            try:
                conn.executemany(
                    "INSERT INTO metrics (run_id, step, name, value, created_at) "
                    "VALUES (?,?,?,?,?)",
                    [(r, s, k, None if math.isnan(v) else v, t) for r, s, k, v, t in params],
                )
            except sqlite3.IntegrityError:
                raise NotFound(f"run {run_id!r} not found") from None

    def metrics(self, run_id: str, name: str | None = None) -> list[Metric]:
        """The run's metrics (or one metric's series), by step then in logging order."""
        sql = f"SELECT {rows.METRIC_COLUMNS} FROM metrics WHERE run_id = ?"
        params: list[Any] = [run_id]
        if name is not None:
            sql += " AND name = ?"
            params.append(name)
        with self._db.read() as conn:
            found = conn.execute(sql + " ORDER BY step, id", params).fetchall()
        return [rows.metric_from_row(r) for r in found]

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record that the run saved a checkpoint at ``step`` under ``path``."""
        with self._db.write() as conn:
            try:
                conn.execute(
                    "INSERT INTO checkpoints (run_id, step, path, created_at) VALUES (?,?,?,?)",
                    (checkpoint.run_id, int(checkpoint.step), str(checkpoint.path),
                     checkpoint.created_at),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                raise NotFound(f"run {checkpoint.run_id!r} not found") from None

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with the highest step (the last added among equals)."""
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {rows.CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? "
                "ORDER BY step DESC, id DESC LIMIT 1",
                (run_id,),
            ).fetchone()
        return None if row is None else rows.checkpoint_from_row(row)

    # -- what each update trained ---------------------------------------------

    def add_update(self, update: UpdateRecord) -> None:
        """Record what update ``step`` of the run trained (once per run and step)."""
        fates = dump_json(rows.update_fates(update.groups), "update groups")
        credit = dump_json(update.credit, "update credit")
        with self._db.write() as conn:
            try:
                cur = conn.execute(
                    f"INSERT INTO updates ({rows.UPDATE_COLUMNS}) VALUES (?,?,?,?,?,?) "
                    "ON CONFLICT(run_id, step) DO NOTHING",
                    (update.run_id, int(update.step), update.version, credit, fates,
                     update.created_at),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                raise NotFound(f"run {update.run_id!r} not found") from None
            if cur.rowcount == 0:
                raise AlreadyExists(f"update {update.step} of run {update.run_id!r} is recorded")

    def updates(self, run_id: str) -> list[UpdateRecord]:
        """What each update of the run trained, by step (none for a run stored before
        tether kept them, or one that made no update)."""
        with self._db.read() as conn:
            found = conn.execute(
                f"SELECT {rows.UPDATE_COLUMNS} FROM updates WHERE run_id = ? ORDER BY step",
                (run_id,),
            ).fetchall()
        return [rows.update_from_row(r) for r in found]
