"""Numbered schema migrations.

``MIGRATIONS[i]`` takes the schema from version ``i`` to ``i + 1``; the file's
version is ``PRAGMA user_version``. :func:`migrate` runs the missing ones, each
in its own ``BEGIN IMMEDIATE`` transaction together with the version bump, so a
crash leaves the file at a whole version and two processes opening a fresh file
at once do not both migrate it. A new migration is a new function appended to
the list; an old one never changes.

Column conventions (see ``_codec``): ``*_ids`` are little-endian int32 blobs,
``logprobs`` little-endian float32 blobs, rewards REAL (float64, NULL when the
given value was not a finite number), ``config``/``data``/``task``/
``request``/``response`` JSON text, times Unix seconds as REAL, flags
(``success``) INTEGER 0/1 or NULL.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable

from tether.store._errors import StoreError

__all__ = ["MIGRATIONS", "migrate"]


#: Migration 1 as it shipped: runs, tasks, rollouts, calls, rewards, metrics, checkpoints.
_INITIAL_SCHEMA = (
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        run_id TEXT REFERENCES runs(id),
        split TEXT NOT NULL,
        data TEXT NOT NULL
    )""",
    "CREATE INDEX tasks_run_split ON tasks(run_id, split)",
    # task_id is deliberately not a foreign key: a rollout carries its task
    # inline (``task``), so one created through the admin API needs no row.
    """CREATE TABLE rollouts (
        id TEXT PRIMARY KEY,
        run_id TEXT REFERENCES runs(id),
        task_id TEXT,
        group_id TEXT,
        task TEXT,
        status TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        token_hash TEXT,
        reward REAL,
        reward_source TEXT,
        final_answer TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        finished_at REAL
    )""",
    "CREATE INDEX rollouts_run_status ON rollouts(run_id, status)",
    "CREATE INDEX rollouts_group ON rollouts(group_id)",
    "CREATE INDEX rollouts_status ON rollouts(status)",
    """CREATE TABLE calls (
        rollout_id TEXT NOT NULL REFERENCES rollouts(id),
        attempt INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        prompt_ids BLOB NOT NULL,
        completion_ids BLOB NOT NULL,
        logprobs BLOB NOT NULL,
        n_prompt INTEGER NOT NULL,
        n_completion INTEGER NOT NULL,
        policy_version INTEGER NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        finish_reason TEXT,
        temperature REAL NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        latency_s REAL NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (rollout_id, attempt, seq)
    )""",
    """CREATE TABLE rewards (
        id INTEGER PRIMARY KEY,
        rollout_id TEXT NOT NULL REFERENCES rollouts(id),
        attempt INTEGER NOT NULL,
        call_seq INTEGER,
        value REAL,
        given TEXT,
        source TEXT NOT NULL,
        created_at REAL NOT NULL,
        FOREIGN KEY (rollout_id, attempt, call_seq) REFERENCES calls(rollout_id, attempt, seq)
    )""",
    "CREATE INDEX rewards_rollout ON rewards(rollout_id, attempt)",
    # At most one final reward (call_seq NULL) per attempt, enforced by the file itself.
    """CREATE UNIQUE INDEX rewards_final ON rewards(rollout_id, attempt)
        WHERE call_seq IS NULL""",
    """CREATE TABLE metrics (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        step INTEGER NOT NULL,
        name TEXT NOT NULL,
        value REAL,
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX metrics_run_name_step ON metrics(run_id, name, step)",
    """CREATE TABLE checkpoints (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        step INTEGER NOT NULL,
        path TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX checkpoints_run_step ON checkpoints(run_id, step)",
)


def _m001_initial(conn: sqlite3.Connection) -> None:
    """Runs, tasks, rollouts, calls, rewards, metrics, checkpoints."""
    for statement in _INITIAL_SCHEMA:
        conn.execute(statement)


def _m002_attempts(conn: sqlite3.Connection) -> None:
    """How each attempt ended (retried ones too): status, error, exit code, output tail,
    success. ``rollouts`` keeps only the current attempt's state; this keeps them all."""
    conn.execute(
        """CREATE TABLE attempts (
            rollout_id TEXT NOT NULL REFERENCES rollouts(id),
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            error TEXT,
            exit_code INTEGER,
            output_tail TEXT NOT NULL DEFAULT '',
            success INTEGER,
            finished_at REAL NOT NULL,
            PRIMARY KEY (rollout_id, attempt)
        )"""
    )


def _m003_tasks_per_run(conn: sqlite3.Connection) -> None:
    """Task ids are unique per run, not per file: each run record (a resumed run, an
    eval) stores its own task set, and the calc ids repeat across them. NULL run ids
    count as one run (``ifnull``), so a task without a run is still stored once."""
    for statement in (
        """CREATE TABLE tasks_new (
            id TEXT NOT NULL,
            run_id TEXT REFERENCES runs(id),
            split TEXT NOT NULL,
            data TEXT NOT NULL
        )""",
        "INSERT INTO tasks_new (rowid, id, run_id, split, data) "
        "SELECT rowid, id, run_id, split, data FROM tasks",
        "DROP TABLE tasks",
        "ALTER TABLE tasks_new RENAME TO tasks",
        "CREATE UNIQUE INDEX tasks_run_id ON tasks(ifnull(run_id, ''), id)",
        "CREATE INDEX tasks_run_split ON tasks(run_id, split)",
    ):
        conn.execute(statement)


def _m004_call_constraint(conn: sqlite3.Connection) -> None:
    """``calls.constraint``: the grammar a call's tokens were drawn under (structured
    output, forced tool call), NULL when unconstrained. Its logprobs stay the unmasked
    model's, so the trainer can tell these calls apart."""
    conn.execute("ALTER TABLE calls ADD COLUMN constraint_label TEXT")


def _m005_attempt_start(conn: sqlite3.Connection) -> None:
    """When each attempt started (its agent began running): ``rollouts.started_at`` for
    the current attempt, copied to ``attempts.started_at`` when it ends. A rollout's
    ``created_at`` is its batch's (every rollout of a step is created at once and waits
    for a runner), so only this gives a rollout's own time. Rows from before stay NULL."""
    for table in ("rollouts", "attempts"):
        columns = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if "started_at" not in columns:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN started_at REAL")


def _m006_grader_error(conn: sqlite3.Connection) -> None:
    """``attempts.grader_error``: the exception the grader raised on the attempt (its type,
    message and the last frames of the traceback, in the grader's own file first), NULL
    when the grader did not raise. The attempt is unusable then; this says why."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(attempts)")}
    if "grader_error" not in columns:
        conn.execute("ALTER TABLE attempts ADD COLUMN grader_error TEXT")


_TRAIN_GROUP = re.compile(r"s(\d+)-g(\d+)")


def _m007_steps_from_one(conn: sqlite3.Connection) -> None:
    """Train steps count updates from 1, as checkpoints (``step-0000NN``) and evals (at
    step N after N updates, 0 before training) always did. Every row this finds was
    written when updates counted from 0, so: each train metric (any name but ``eval/*``)
    moves one step up, and each sync-mode group ``{run}-s{k}-g{j}`` becomes
    ``{run}-s{k+1}-g{j}`` with its rollouts ``{group}-{i}`` (their calls, rewards and
    attempts follow). A run's highest step is renamed first, so no id is ever taken
    twice; the foreign keys are checked at the commit."""
    if conn.execute("SELECT 1 FROM rollouts UNION ALL SELECT 1 FROM metrics").fetchone() is None:
        return  # a new file (nothing to renumber, nothing for PRAGMA optimize to analyze)
    conn.execute("PRAGMA defer_foreign_keys = ON")
    conn.execute("UPDATE metrics SET step = step + 1 WHERE name NOT LIKE 'eval/%'")
    renames: list[tuple[int, str, str, str]] = []  # (k, id, new id, new group id)
    rows = conn.execute(
        "SELECT id, run_id, group_id FROM rollouts WHERE run_id IS NOT NULL AND group_id IS NOT NULL"
    )
    for rid, run_id, gid in rows.fetchall():
        m = (
            _TRAIN_GROUP.fullmatch(gid.removeprefix(f"{run_id}-"))
            if gid.startswith(f"{run_id}-")
            else None
        )
        if m is None:
            continue
        new_gid = f"{run_id}-s{int(m[1]) + 1}-g{m[2]}"
        new_id = new_gid + rid[len(gid) :] if rid.startswith(f"{gid}-") else rid
        renames.append((int(m[1]), rid, new_id, new_gid))
    for _, rid, new_id, new_gid in sorted(renames, key=lambda r: -r[0]):
        conn.execute(
            "UPDATE rollouts SET id = ?, group_id = ? WHERE id = ?", (new_id, new_gid, rid)
        )
        if new_id != rid:
            for table in ("calls", "rewards", "attempts"):
                conn.execute(
                    f"UPDATE {table} SET rollout_id = ? WHERE rollout_id = ?", (new_id, rid)
                )


def _m008_grade_detail(conn: sqlite3.Connection) -> None:
    """``attempts.grade_detail``: what a group grader (``rollout.grader: judge``) saw and
    said for the attempt, as JSON (the judge's model, prompt messages, raw answer, the
    group's parsed scores, this rollout's candidate label); NULL for other graders. On
    the attempt, not the reward row: a failed judgement has no reward, and must still
    show the judge's text."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(attempts)")}
    if "grade_detail" not in columns:
        conn.execute("ALTER TABLE attempts ADD COLUMN grade_detail TEXT")


def _m009_call_role(conn: sqlite3.Connection) -> None:
    """``calls.role``: the agent role that made the call (several agents in one run, named
    in the call's URL ``/rollouts/{id}/roles/{role}/v1``), NULL for a call without one;
    rows from before roles existed stay NULL."""
    conn.execute("ALTER TABLE calls ADD COLUMN role TEXT")


#: The group ids the training loop minted before places were stored: ``{run}-{tag}-g{k}``
#: with the tag ``s{step}`` (a sync update), ``eval{step}-s`` / ``eval{step}-g`` (an eval's
#: sampled / greedy pass) or ``a`` (async mode); rollouts ``{group}-{i}``. Read here only,
#: once, to fill the place columns of rows written then.
_OLD_GROUP = re.compile(r"(?:s(?P<step>\d+)|eval(?P<eval>\d+)-(?P<how>[sg])|a)-g(?P<group>\d+)")


def _old_place(
    rollout_id: str, run_id: str | None, group_id: str | None
) -> tuple[str, int | None, int, int | None, int] | None:
    """``(phase, step, group, index, greedy)`` of a rollout from its old ids; None if the
    training loop did not open it."""
    if not run_id or not group_id or not group_id.startswith(f"{run_id}-"):
        return None
    m = _OLD_GROUP.fullmatch(group_id[len(run_id) + 1 :])
    if m is None:
        return None
    tail = rollout_id[len(group_id) + 1 :] if rollout_id.startswith(f"{group_id}-") else ""
    index = int(tail) if tail.isdigit() else None
    if m["step"] is not None:
        return "train", int(m["step"]), int(m["group"]), index, 0
    if m["eval"] is not None:
        return "eval", int(m["eval"]), int(m["group"]), index, int(m["how"] == "g")
    return "async", None, int(m["group"]), index, 0


def _m010_rollout_place(conn: sqlite3.Connection) -> None:
    """A rollout's place in its run as columns (``records.Place``): ``phase`` (train,
    async, eval; NULL for a rollout opened outside the training loop), ``step``,
    ``group_index``, ``member_index`` and ``greedy`` (0/1). Rows written before are filled
    from the ids the loop minted then (the one place an id is read); an async row's step
    was not kept and stays NULL."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(rollouts)")}
    for column in (
        "phase TEXT",
        "step INTEGER",
        "group_index INTEGER",
        "member_index INTEGER",
        "greedy INTEGER NOT NULL DEFAULT 0",
    ):
        if column.split()[0] not in have:
            conn.execute(f"ALTER TABLE rollouts ADD COLUMN {column}")
    conn.execute(
        "CREATE INDEX IF NOT EXISTS rollouts_run_phase_step ON rollouts(run_id, phase, step)"
    )
    if conn.execute("SELECT 1 FROM rollouts").fetchone() is None:
        return  # a new file (nothing to fill, nothing for PRAGMA optimize to analyze)
    rows = conn.execute(
        "SELECT id, run_id, group_id FROM rollouts "
        "WHERE run_id IS NOT NULL AND group_id IS NOT NULL AND phase IS NULL"
    ).fetchall()
    for rid, run_id, gid in rows:
        found = _old_place(rid, run_id, gid)
        if found is not None:
            conn.execute(
                "UPDATE rollouts SET phase = ?, step = ?, group_index = ?, member_index = ?, "
                "greedy = ? WHERE id = ?",
                (*found, rid),
            )


def _m011_updates(conn: sqlite3.Connection) -> None:
    """``updates``: what each update trained (``records.UpdateRecord``), one row per run
    and step: the policy version it produced (NULL: none), its credit settings and every
    group it decided on with its fate and advantages (JSON). Stores written before have
    none: what their updates trained was not kept."""
    conn.execute(
        """CREATE TABLE updates (
            run_id TEXT NOT NULL REFERENCES runs(id),
            step INTEGER NOT NULL,
            version INTEGER,
            credit TEXT NOT NULL,
            fates TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (run_id, step)
        )"""
    )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _m001_initial,
    _m002_attempts,
    _m003_tasks_per_run,
    _m004_call_constraint,
    _m005_attempt_start,
    _m006_grader_error,
    _m007_steps_from_one,
    _m008_grade_detail,
    _m009_call_role,
    _m010_rollout_place,
    _m011_updates,
]


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the file up to the newest schema; return the number of migrations run.

    ``conn`` must be in autocommit mode (``isolation_level=None``). A file made
    by a newer tether (version above ``len(MIGRATIONS)``) is refused.
    """
    steps = MIGRATIONS
    ran = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(steps):
                raise StoreError(
                    f"the store's schema version ({version}) is newer than this tether "
                    f"knows ({len(steps)}); upgrade tether to open it"
                )
            if version == len(steps):
                conn.execute("COMMIT")
                return ran
            steps[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
            ran += 1
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
