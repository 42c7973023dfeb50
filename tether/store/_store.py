"""The :class:`Store`: tether's durable record of runs, rollouts, calls and rewards.

A method that writes returns only after its transaction has committed, so
what it stored survives a crash of the process from then on (and, with
``synchronous="FULL"``, a power loss). Every method may be called from any
thread; an event loop awaits its writes with :meth:`Store.in_writer`, which runs
them on the store's writer thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from tether.records import (
    AttemptEnd,
    Call,
    CallStatus,
    IllegalTransition,
    Reward,
    RewardSource,
    Rollout,
    RolloutStatus,
    check_transition,
)
from tether.store import _rows as rows
from tether.store._browse import Browse
from tether.store._codec import dump_json, pack_floats, pack_ids, reward_column
from tether.store._db import Database
from tether.store._errors import (
    AlreadyExists,
    DuplicateReward,
    IllegalRolloutTransition,
    InvalidRecord,
    NotFound,
    RolloutClosed,
    StaleAttempt,
)
from tether.store._runs import RunLog

__all__ = ["Store"]

_INSERT_CALL = (
    "INSERT INTO calls (rollout_id, attempt, seq, prompt_ids, completion_ids, logprobs, "
    "n_prompt, n_completion, policy_version, request, response, finish_reason, temperature, "
    "status, error, latency_s, created_at, constraint_label, role) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_NEXT_SEQ = "SELECT COALESCE(MAX(seq) + 1, 0) FROM calls WHERE rollout_id = ? AND attempt = ?"
_STATE = "SELECT status, attempt FROM rollouts WHERE id = ?"
# Appends the bound reason to ``error`` ("a; b"); binds the reason twice.
_ADD_ERROR = "error = CASE WHEN ? IS NULL THEN error ELSE COALESCE(error || '; ', '') || ? END"
#: The end of an attempt's output the store keeps (the runner may capture more).
TAIL_BYTES = 4096
_RUNNING = RolloutStatus.RUNNING.value
_QUEUED = RolloutStatus.QUEUED.value
T = TypeVar("T")


def _state(conn: sqlite3.Connection, rollout_id: str) -> tuple[str, int]:
    row = conn.execute(_STATE, (rollout_id,)).fetchone()
    if row is None:
        raise NotFound(f"rollout {rollout_id!r} not found")
    return row


def keep_tail(text: str, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` (UTF-8), marked when cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    cut = len(data) - limit
    return f"[... {cut} bytes cut ...]\n" + data[cut:].decode("utf-8", errors="ignore")


def _check_attempt(rollout_id: str, given: int, current: int) -> None:
    if given != current:
        raise StaleAttempt(
            f"rollout {rollout_id!r} is at attempt {current}; a write from attempt {given} "
            "is refused"
        )


def _insert_final_reward(conn: sqlite3.Connection, reward: Reward) -> None:
    """Insert the attempt's final reward and copy it onto the rollout (inside a write)."""
    stored, given, why = reward_column(reward.value)
    source = RewardSource(reward.source).value
    try:
        conn.execute(
            "INSERT INTO rewards (rollout_id, attempt, call_seq, value, given, source, "
            "created_at) VALUES (?,?,NULL,?,?,?,?)",
            (reward.rollout_id, reward.attempt, stored, given, source, reward.created_at),
        )
    except sqlite3.IntegrityError:
        raise DuplicateReward(
            f"rollout {reward.rollout_id!r} attempt {reward.attempt} already has a final reward"
        ) from None
    conn.execute(
        f"UPDATE rollouts SET reward = ?, reward_source = ?, {_ADD_ERROR} WHERE id = ?",
        (stored, source, why, why, reward.rollout_id),
    )


class Store(RunLog, Browse):
    """A SQLite (WAL) trace store at ``path``; created and migrated on open.

    ``synchronous`` is ``"NORMAL"`` (a commit survives a process crash) or
    ``"FULL"`` (also a power loss, at the cost of an fsync per commit).
    ``busy_timeout_s`` bounds the wait for another process's write lock.
    Missing parent directories are created. One ``Store`` serves every thread
    of a process; a forked child must open its own.

    ``read_only=True`` opens an existing file for reading only (no writer
    connection, no migration; every write raises :class:`StoreError`): what a
    viewer such as ``tether dashboard`` uses on a store a run is writing.
    ``peek=True`` is a read-only open for a one-off look that creates no file
    beside the store (no ``-wal``/``-shm``; see ``_db.py``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 10.0,
        read_only: bool = False,
        peek: bool = False,
    ) -> None:
        self._db = Database(path, synchronous, busy_timeout_s, read_only, peek)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def in_writer(self, write: Callable[..., T], *args: Any) -> T:
        """``write(*args)`` (writes of this store, e.g. ``store.record_call, call``) run on the
        store's writer thread and awaited: the event loop serves on meanwhile. Writes sent
        this way commit in the order sent; each returns or raises what it does when called
        directly, and one that was sent commits even if the awaiting task is cancelled."""
        return await asyncio.shield(asyncio.wrap_future(self._db.submit(write, *args)))

    # -- rollouts -------------------------------------------------------------

    def create_rollout(self, rollout: Rollout) -> Rollout:
        """Store a new rollout as ``queued`` at attempt 0 and return what was stored."""
        stored = replace(
            rollout,
            status=RolloutStatus.QUEUED,
            attempt=0,
            reward=None,
            reward_source=None,
            final_answer=None,
            error=None,
            finished_at=None,
            started_at=None,
        )
        task = None if stored.task is None else dump_json(stored.task, "rollout task")
        with self._db.write() as conn:
            try:
                cur = conn.execute(
                    "INSERT INTO rollouts (id, run_id, task_id, group_id, task, status, attempt, "
                    "created_at, phase, step, group_index, member_index, greedy) "
                    "VALUES (?,?,?,?,?,?,0,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                    (stored.id, stored.run_id, stored.task_id, stored.group_id, task, _QUEUED,
                     stored.created_at, *rows.place_columns(stored.place)),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                raise NotFound(f"rollout {stored.id!r}: run {stored.run_id!r} not found") from None
            if cur.rowcount == 0:
                raise AlreadyExists(f"rollout {stored.id!r} already exists")
        return stored

    def start_attempt(
        self, rollout_id: str, token_hash: str | None = None, *, queued: bool = False
    ) -> int:
        """Start a new attempt (from a new ``queued`` rollout, or from ``failed``/``timeout``
        for a retry) as ``running``, or as ``queued`` until :meth:`mark_running` when its
        runner has yet to start the agent; return the new attempt number.

        The attempt's reward, answer and error start empty; the old attempt's
        calls and rewards stay, and its late writes are refused from now on. A
        ``running`` attempt's ``started_at`` is now; a queued one's is set by
        :meth:`mark_running`.
        """
        new = RolloutStatus.QUEUED if queued else RolloutStatus.RUNNING
        with self._db.write() as conn:
            status, attempt = _state(conn, rollout_id)
            first = status == _QUEUED and attempt == 0  # a new rollout's first attempt
            try:
                if not (first and queued):
                    check_transition(RolloutStatus(status), new)
            except IllegalTransition as e:
                raise IllegalRolloutTransition(f"rollout {rollout_id!r}: {e}") from e
            conn.execute(
                "UPDATE rollouts SET status = ?, attempt = ?, token_hash = ?, reward = NULL, "
                "reward_source = NULL, final_answer = NULL, error = NULL, finished_at = NULL, "
                "started_at = ? WHERE id = ?",
                (new.value, attempt + 1, token_hash, None if queued else time.time(), rollout_id),
            )
        return attempt + 1

    def mark_running(self, rollout_id: str, attempt: int) -> bool:
        """Move a ``queued`` attempt to ``running`` (its agent has started); False if it
        already was running. Refuses a stale attempt and any other state."""
        with self._db.write() as conn:
            status, current = _state(conn, rollout_id)
            _check_attempt(rollout_id, attempt, current)
            if status == _RUNNING:
                return False
            try:
                if current == 0:
                    raise IllegalTransition("it has no attempt yet; use start_attempt")
                check_transition(RolloutStatus(status), RolloutStatus.RUNNING)
            except IllegalTransition as e:
                raise IllegalRolloutTransition(f"rollout {rollout_id!r}: {e}") from e
            conn.execute(
                "UPDATE rollouts SET status = ?, started_at = ? WHERE id = ?",
                (_RUNNING, time.time(), rollout_id),
            )
        return True

    def rollout_auth(self, rollout_id: str) -> tuple[RolloutStatus, int, str | None] | None:
        """``(status, current attempt, token hash)`` for the gateway's auth; None if unknown."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT status, attempt, token_hash FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return None if row is None else (RolloutStatus(row[0]), row[1], row[2])

    def token_in_use(self, token_hash: str) -> bool:
        """True when a running or queued rollout holds this token hash (the gateway's 403 vs 401)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT 1 FROM rollouts WHERE status IN (?, ?) AND token_hash = ? LIMIT 1",
                (_RUNNING, _QUEUED, token_hash),
            ).fetchone()
        return row is not None

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with this id, or None."""
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {rows.ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return None if row is None else rows.rollout_from_row(row)

    def list_rollouts(
        self,
        run_id: str | None = None,
        group_id: str | None = None,
        status: RolloutStatus | str | None = None,
        limit: int | None = None,
    ) -> list[Rollout]:
        """Rollouts in creation order, filtered by run, group and/or status."""
        scope, params = rows.where(
            ("run_id = ?", run_id),
            ("group_id = ?", group_id),
            ("status = ?", rows.optional(RolloutStatus, status)),
        )
        sql = f"SELECT {rows.ROLLOUT_COLUMNS} FROM rollouts{scope} ORDER BY rowid"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._db.read() as conn:
            found = conn.execute(sql, params).fetchall()
        return [rows.rollout_from_row(r) for r in found]

    def finish_rollout(
        self,
        end: AttemptEnd,
        *,
        reward: float | None = None,
        reward_source: RewardSource | str | None = None,
        final_answer: str | None = None,
    ) -> Rollout:
        """End attempt ``end.attempt`` of rollout ``end.rollout_id`` as ``end`` says; return
        the stored rollout.

        The attempt's end (its status, ``error``, ``exit_code``, the last
        :data:`TAIL_BYTES` of ``output_tail``, ``success``, what the grader raised
        as ``grader_error``, what a judge saw and said as ``grade_detail``) is also kept
        in its own row, which a retry does not clear (:meth:`attempts`); its
        ``finished_at`` and ``started_at`` are the store's to set.

        A ``reward`` is stored as the attempt's final reward (source defaults to
        ``admin``); one that is not a finite number is stored as NULL, the reason
        goes to ``error``, and the rollout stays unusable. ``final_answer`` is kept
        with the rollout. Refuses a stale
        ``attempt`` (:class:`StaleAttempt`), an illegal change
        (:class:`IllegalRolloutTransition`) and a second final reward
        (:class:`DuplicateReward`); nothing is stored then.
        """
        rollout_id, attempt, error = end.rollout_id, end.attempt, end.error
        new = RolloutStatus(end.status)
        if not new.is_final:
            raise IllegalRolloutTransition(
                f"rollout {rollout_id!r}: finish_rollout needs a final status, not "
                f"{new.value!r}; use start_attempt to run it again"
            )
        source = RewardSource(reward_source or RewardSource.ADMIN)
        detail = None if end.grade_detail is None else dump_json(end.grade_detail, "grade_detail")
        with self._db.write() as conn:
            old, current = _state(conn, rollout_id)
            _check_attempt(rollout_id, attempt, current)
            try:
                check_transition(RolloutStatus(old), new)
            except IllegalTransition as e:
                raise IllegalRolloutTransition(f"rollout {rollout_id!r}: {e}") from e
            if reward is not None:
                _insert_final_reward(conn, Reward(rollout_id, reward, source, attempt))
            now = time.time()
            conn.execute(
                f"UPDATE rollouts SET status = ?, finished_at = ?, "
                f"final_answer = COALESCE(?, final_answer), {_ADD_ERROR} WHERE id = ?",
                (new.value, now, final_answer, error, error, rollout_id),
            )
            conn.execute(
                "INSERT OR REPLACE INTO attempts (rollout_id, attempt, status, error, exit_code, "
                "output_tail, success, finished_at, grader_error, grade_detail, started_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,(SELECT started_at FROM rollouts WHERE id = ?))",
                (rollout_id, attempt, new.value, error, end.exit_code,
                 keep_tail(end.output_tail or ""),
                 None if end.success is None else int(bool(end.success)), now,
                 None if end.grader_error is None else end.grader_error[:TAIL_BYTES], detail,
                 rollout_id),
            )  # fmt: skip
            row = conn.execute(
                f"SELECT {rows.ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return rows.rollout_from_row(row)

    # -- calls and rewards ----------------------------------------------------

    def record_call(self, call: Call) -> int:
        """Store one call under the next gap-free ``seq`` of its attempt; return that seq.

        ``call.seq`` is ignored: the seq is assigned in the same transaction as
        the insert. Refuses an unknown rollout (:class:`NotFound`), an attempt
        that is not current (:class:`StaleAttempt`) and a rollout that is not
        running (:class:`RolloutClosed`); nothing is stored then. The call is
        durable when this returns.
        """
        if len(call.logprobs) != len(call.completion_ids):
            raise InvalidRecord(
                f"call of rollout {call.rollout_id!r}: logprobs ({len(call.logprobs)}) must "
                f"have one value per completion token ({len(call.completion_ids)})"
            )
        values = [
            call.rollout_id,
            call.attempt,
            0,  # seq, filled in under the lock
            pack_ids(call.prompt_ids, "prompt_ids"),
            pack_ids(call.completion_ids, "completion_ids"),
            pack_floats(call.logprobs),
            len(call.prompt_ids),
            len(call.completion_ids),
            call.policy_version,
            dump_json(call.request, "call request"),
            dump_json(call.response, "call response"),
            call.finish_reason,
            call.temperature,
            CallStatus(call.status).value,
            call.error,
            call.latency_s,
            call.created_at,
            call.constraint,
            call.role,
        ]
        with self._db.write() as conn:
            status, current = _state(conn, call.rollout_id)
            _check_attempt(call.rollout_id, call.attempt, current)
            if status != _RUNNING:
                raise RolloutClosed(f"rollout {call.rollout_id!r} is {status}, not running")
            seq = conn.execute(_NEXT_SEQ, (call.rollout_id, current)).fetchone()[0]
            values[2] = seq
            conn.execute(_INSERT_CALL, values)
        return seq

    def calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        """The calls of one attempt (default: the current one) in ``seq`` order."""
        with self._db.read() as conn:
            found = conn.execute(
                f"SELECT {rows.CALL_COLUMNS} FROM calls WHERE rollout_id = ? AND attempt = "
                "COALESCE(?, (SELECT attempt FROM rollouts WHERE id = ?)) ORDER BY seq",
                (rollout_id, attempt, rollout_id),
            ).fetchall()
        return [rows.call_from_row(r) for r in found]

    def record_reward(self, reward: Reward) -> None:
        """Store a reward of the current attempt.

        A final reward (``call_seq`` None) becomes the rollout's reward; a second
        one for the same attempt raises :class:`DuplicateReward`. Intermediate
        rewards (``call_seq`` set, naming a stored call) may be many. A value that
        is not a finite number is stored as NULL and never used for training.
        """
        with self._db.write() as conn:
            status, current = _state(conn, reward.rollout_id)
            _check_attempt(reward.rollout_id, reward.attempt, current)
            if status == _QUEUED:
                raise RolloutClosed(f"rollout {reward.rollout_id!r} has not started")
            if reward.call_seq is None:
                _insert_final_reward(conn, reward)
                return
            found = conn.execute(
                "SELECT 1 FROM calls WHERE rollout_id = ? AND attempt = ? AND seq = ?",
                (reward.rollout_id, current, reward.call_seq),
            ).fetchone()
            if found is None:
                raise NotFound(
                    f"rollout {reward.rollout_id!r} attempt {current} has no call {reward.call_seq}"
                )
            stored, given, _ = reward_column(reward.value)
            conn.execute(
                "INSERT INTO rewards (rollout_id, attempt, call_seq, value, given, source, "
                "created_at) VALUES (?,?,?,?,?,?,?)",
                (reward.rollout_id, current, reward.call_seq, stored, given,
                 RewardSource(reward.source).value, reward.created_at),
            )  # fmt: skip

    def attempts(self, rollout_id: str) -> list[AttemptEnd]:
        """How each finished attempt of the rollout ended, oldest first."""
        with self._db.read() as conn:
            found = conn.execute(
                f"SELECT {rows.ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? "
                "ORDER BY attempt",
                (rollout_id,),
            ).fetchall()
            return [rows.with_shared_prompt(conn, rows.attempt_from_row(r)) for r in found]

    def rewards(self, rollout_id: str) -> list[Reward]:
        """Every reward of the rollout (all attempts), in the order they were stored."""
        with self._db.read() as conn:
            found = conn.execute(
                f"SELECT {rows.REWARD_COLUMNS} FROM rewards WHERE rollout_id = ? ORDER BY id",
                (rollout_id,),
            ).fetchall()
        return [rows.reward_from_row(r) for r in found]

    def counts(self, run_id: str | None = None) -> dict[str, Any]:
        """What the store holds, for ``tether rollouts list``; one consistent snapshot.

        ``{"rollouts": {status: n, ...every status}, "usable": n, "unusable_reward": n,
        "calls": n}``: ``usable`` counts succeeded rollouts with a finite reward;
        ``unusable_reward`` succeeded ones without (missing, NaN, ±inf: never 0).
        """
        scope, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        by_status = {s.value: 0 for s in RolloutStatus}
        with self._db.read(snapshot=True) as conn:
            found = conn.execute(
                f"SELECT status, COUNT(*), COUNT(reward) FROM rollouts {scope} GROUP BY status",
                params,
            ).fetchall()
            in_run = " WHERE rollout_id IN (SELECT id FROM rollouts WHERE run_id = ?)"
            n_calls = conn.execute(
                "SELECT COUNT(*) FROM calls" + (in_run if scope else ""), params
            ).fetchone()[0]
        with_reward = {status: rewarded for status, _, rewarded in found}
        by_status.update({status: n for status, n, _ in found})
        succeeded = RolloutStatus.SUCCEEDED.value
        usable = with_reward.get(succeeded, 0)
        return {
            "rollouts": by_status,
            "usable": usable,
            "unusable_reward": by_status[succeeded] - usable,
            "calls": n_calls,
        }
