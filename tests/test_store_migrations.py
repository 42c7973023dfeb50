"""tether.store's schema and migrations: a new file's tables, columns and indexes, and an
old file (made by an earlier tether) opened by this one keeps what it held.

Every test uses a real SQLite file under ``tmp_path``; an old file is made by this
store with only the first migrations applied.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from tether.records import AttemptEnd, Call, Phase, Place, Rollout, Task
from tether.store import AlreadyExists, Store, StoreError, _migrations

SCHEMA = {
    "runs": ["id", "config", "status", "created_at"],
    "tasks": ["id", "run_id", "split", "data"],
    "rollouts": ["id", "run_id", "task_id", "group_id", "task", "status", "attempt",
                 "token_hash", "reward", "reward_source", "final_answer", "error",
                 "created_at", "finished_at", "started_at", "phase", "step", "group_index",
                 "member_index", "greedy"],
    "calls": ["rollout_id", "attempt", "seq", "prompt_ids", "completion_ids", "logprobs",
              "n_prompt", "n_completion", "policy_version", "request", "response",
              "finish_reason", "temperature", "status", "error", "latency_s", "created_at",
              "constraint_label", "role"],
    "rewards": ["id", "rollout_id", "attempt", "call_seq", "value", "given", "source",
                "created_at"],
    "metrics": ["id", "run_id", "step", "name", "value", "created_at"],
    "checkpoints": ["id", "run_id", "step", "path", "created_at"],
    "updates": ["run_id", "step", "version", "credit", "fates", "created_at"],
    "attempts": ["rollout_id", "attempt", "status", "error", "exit_code", "output_tail",
                 "success", "finished_at", "started_at", "grader_error", "grade_detail"],
}  # fmt: skip
INDEXES = {
    "tasks": {"tasks_run_split": 0, "tasks_run_id": 1},
    "runs": {"sqlite_autoindex_runs_1": 1},
    "rollouts": {"rollouts_run_status": 0, "rollouts_group": 0, "rollouts_status": 0,
                 "rollouts_run_phase_step": 0, "sqlite_autoindex_rollouts_1": 1},
    "calls": {"sqlite_autoindex_calls_1": 1},
    "rewards": {"rewards_rollout": 0, "rewards_final": 1},
    "metrics": {"metrics_run_name_step": 0},
    "checkpoints": {"checkpoints_run_step": 0},
    "attempts": {"sqlite_autoindex_attempts_1": 1},
    "updates": {"sqlite_autoindex_updates_1": 1},
}  # fmt: skip


#: One call of rollout ``?`` as tether wrote it before migration 9 (no ``role`` column).
_CALL_BEFORE_9 = (
    "INSERT INTO calls (rollout_id, attempt, seq, prompt_ids, completion_ids, logprobs, "
    "n_prompt, n_completion, policy_version, request, response, finish_reason, "
    "temperature, status, error, latency_s, created_at, constraint_label) "
    "VALUES (?, 1, 0, X'01000000', X'02000000', X'000000bf', 1, 1, 0, '{}', '{}', 'stop', "
    "1.0, 'ok', NULL, 0, 0, NULL)"
)


def _rollout_before_10(
    store: Store, rid: str, run_id: str | None = None, group_id: str | None = None
) -> None:
    """A queued rollout as tether wrote it before migration 10 (no place columns)."""
    with store._db.write() as conn:
        conn.execute(
            "INSERT INTO rollouts (id, run_id, group_id, status, attempt, created_at) "
            "VALUES (?, ?, ?, 'queued', 0, 0)",
            (rid, run_id, group_id),
        )  # fmt: skip


def test_schema_after_migrating(tmp_path):
    path = tmp_path / "s.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == set(SCHEMA)
    for table, columns in SCHEMA.items():
        assert [r[1] for r in conn.execute(f"PRAGMA table_info({table})")] == columns
        indexes = {r[1]: r[2] for r in conn.execute(f"PRAGMA index_list({table})")}
        assert indexes == INDEXES[table], table
    assert [r[2] for r in conn.execute("PRAGMA index_info(sqlite_autoindex_calls_1)")] == [
        "rollout_id", "attempt", "seq",
    ]  # fmt: skip
    assert [r[2] for r in conn.execute("PRAGMA index_info(sqlite_autoindex_attempts_1)")] == [
        "rollout_id", "attempt",
    ]  # fmt: skip
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(_migrations.MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_reopen_does_not_rerun_migrations(tmp_path, monkeypatch):
    path = tmp_path / "m.db"
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS)
        store.create_run({"a": 1}, run_id="kept")

    def boom(conn):
        raise AssertionError("migration re-run")

    monkeypatch.setattr(_migrations, "MIGRATIONS", [boom] * len(_migrations.MIGRATIONS))
    with Store(path) as store:
        assert store._db.migrations_run == 0
        assert store.schema_version() == len(_migrations.MIGRATIONS)
        assert store.get_run("kept").config == {"a": 1}
    monkeypatch.setattr(_migrations, "MIGRATIONS", [])  # a file newer than this tether
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_migration_2_adds_attempts_to_an_existing_file(tmp_path, monkeypatch):
    """A file made before migration 2 keeps its rollouts and gains the attempts table."""
    path = tmp_path / "v1.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:1])
        with Store(path) as old:
            _rollout_before_10(old, "r-old")
            assert old.schema_version() == 1
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 1
        assert store.schema_version() == len(_migrations.MIGRATIONS)
        assert store.get_rollout("r-old") is not None and store.attempts("r-old") == []
        attempt = store.start_attempt("r-old")
        store.finish_rollout(AttemptEnd("r-old", attempt, "failed", output_tail="boom\n"))
        assert [a.output_tail for a in store.attempts("r-old")] == ["boom\n"]


def test_migration_3_keys_tasks_by_run_and_keeps_them(tmp_path, monkeypatch):
    """A file made before migration 3 keeps its tasks, in order; then two runs may
    each store a task of the same id (a resumed run records its task set again)."""
    path = tmp_path / "v2.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:2])
        with Store(path) as old:
            old.create_run({}, run_id="a")
            old.add_tasks([Task("t1", {"q": 1}, run_id="a"), Task("t0", {"q": 0})])
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 2
        assert [(t.id, t.run_id) for t in store.list_tasks()] == [("t1", "a"), ("t0", None)]
        store.create_run({}, run_id="b")
        store.add_tasks([Task("t1", {"q": "other"}, run_id="b")])
        assert store.get_task("t1", run_id="b").data == {"q": "other"}
        assert store.get_task("t1").run_id == "a"  # without a run: the first stored
        with pytest.raises(AlreadyExists, match="run 'a'"):
            store.add_tasks([Task("t1", {"q": 2}, run_id="a")])


def test_migration_4_marks_constrained_calls_and_keeps_old_ones(tmp_path, monkeypatch):
    """A file made before migration 4 keeps its calls (unconstrained: NULL); new calls
    carry the grammar they were drawn under."""
    path = tmp_path / "v3.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:3])
        with Store(path) as old:
            _rollout_before_10(old, "r1")
    with closing(sqlite3.connect(path)) as conn, conn:  # a call as tether before 4 wrote it
        conn.execute("UPDATE rollouts SET status = 'running', attempt = 1 WHERE id = 'r1'")
        conn.execute(
            "INSERT INTO calls (rollout_id, attempt, seq, prompt_ids, completion_ids, logprobs, "
            "n_prompt, n_completion, policy_version, request, response, finish_reason, "
            "temperature, status, error, latency_s, created_at) "
            "VALUES ('r1', 1, 0, x'', x'', x'', 0, 0, 0, '{}', '{}', 'stop', 1.0, 'ok', NULL, 0, 0)"
        )
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 3
        store.record_call(
            Call(
                rollout_id="r1",
                seq=-1,
                prompt_ids=[1, 2],
                completion_ids=[3],
                logprobs=[-0.5],
                policy_version=0,
                constraint="json_schema:Answer",
            )
        )
        assert [c.constraint for c in store.calls("r1")] == [None, "json_schema:Answer"]


def test_migration_5_adds_attempt_start_times_and_keeps_old_rows(tmp_path, monkeypatch):
    """A file made before migration 5 keeps its rollouts and attempt ends (no start time:
    NULL); attempts after it record when they started."""
    path = tmp_path / "v4.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:4])
        with Store(path) as old:
            _rollout_before_10(old, "r1")
    with closing(sqlite3.connect(path)) as conn, conn:  # an attempt as tether before 5 ran it
        conn.execute("UPDATE rollouts SET status = 'failed', attempt = 1 WHERE id = 'r1'")
        conn.execute(
            "INSERT INTO attempts (rollout_id, attempt, status, finished_at) "
            "VALUES ('r1', 1, 'failed', 5.0)"
        )
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 4
        assert store.get_rollout("r1").started_at is None
        attempt = store.start_attempt("r1")
        assert store.get_rollout("r1").started_at is not None
        store.finish_rollout(AttemptEnd("r1", attempt, "succeeded"), reward=1.0)
        one, two = store.attempts("r1")
        assert (one.started_at, one.finished_at) == (None, 5.0)
        assert two.started_at is not None and two.finished_at >= two.started_at
    with closing(sqlite3.connect(path)) as conn:  # a re-run finds the columns: a no-op
        _migrations._m005_attempt_start(conn)


def test_migration_6_adds_the_grader_error_and_keeps_old_attempts(tmp_path, monkeypatch):
    """A file made before migration 6 keeps its attempt ends (no grader error: NULL);
    attempts after it keep what the grader raised."""
    path = tmp_path / "v5.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:5])
        with Store(path) as old:
            _rollout_before_10(old, "r1")
    with closing(sqlite3.connect(path)) as conn, conn:  # an attempt as tether before 6 ended it
        conn.execute("UPDATE rollouts SET status = 'failed', attempt = 1 WHERE id = 'r1'")
        conn.execute(
            "INSERT INTO attempts (rollout_id, attempt, status, error, finished_at) "
            "VALUES ('r1', 1, 'failed', 'x', 5.0)"
        )
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 5
        attempt = store.start_attempt("r1")
        store.finish_rollout(
            AttemptEnd(
                "r1", attempt, "succeeded", grader_error="KeyError: 'answr' (g.py:3 in grade)"
            )
        )
        one, two = store.attempts("r1")
        assert (one.error, one.grader_error) == ("x", None)
        assert two.grader_error == "KeyError: 'answr' (g.py:3 in grade)"
    with closing(sqlite3.connect(path)) as conn:  # a re-run finds the column: a no-op
        _migrations._m006_grader_error(conn)


def test_migration_8_adds_the_grade_detail_and_keeps_old_attempts(tmp_path, monkeypatch):
    """A file made before migration 8 keeps its attempt ends (no grade detail: None);
    attempts after it keep what the judge saw and said, as JSON."""
    path = tmp_path / "v7.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:7])
        with Store(path) as old:
            _rollout_before_10(old, "r1")
    with closing(sqlite3.connect(path)) as conn, conn:  # an attempt as tether before 8 ended it
        conn.execute("UPDATE rollouts SET status = 'failed', attempt = 1 WHERE id = 'r1'")
        conn.execute(
            "INSERT INTO attempts (rollout_id, attempt, status, error, finished_at) "
            "VALUES ('r1', 1, 'failed', 'x', 5.0)"
        )
    detail = {"model": "j", "raw": "{}", "scores": {"1": 0.5}, "candidate": "1"}
    with Store(path) as store:
        assert store._db.migrations_run == len(_migrations.MIGRATIONS) - 7
        store.finish_rollout(
            AttemptEnd("r1", store.start_attempt("r1"), "succeeded", grade_detail=detail),
            reward=0.5,
        )
        one, two = store.attempts("r1")
        assert (one.error, one.grade_detail) == ("x", None)
        assert two.grade_detail == detail
    with closing(sqlite3.connect(path)) as conn:  # a re-run finds the column: a no-op
        _migrations._m008_grade_detail(conn)


def test_migration_7_numbers_train_steps_from_one(tmp_path, monkeypatch):
    """A file written when updates counted from 0: its train metrics move one step up (evals
    and checkpoints already counted updates), and its sync groups ``s{k}`` with their
    rollouts, calls, rewards and attempts become ``s{k+1}``; eval, async and other groups
    keep their ids."""
    from tether.records import Checkpoint

    path = tmp_path / "v6.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:6])
        with Store(path) as old:
            with closing(sqlite3.connect(path)) as conn, conn:  # what this tether's
                conn.execute("ALTER TABLE attempts ADD COLUMN grade_detail TEXT")  # writes need
                for column in ("phase", "step", "group_index", "member_index", "greedy"):
                    conn.execute(f"ALTER TABLE rollouts ADD COLUMN {column}")
            old.create_run({}, run_id="r")
            old.log_metrics("r", 0, {"eval/sampled_success": 0.25})
            old.log_metrics("r", 0, {"reward_mean": 0.5})  # update 1
            old.log_metrics("r", 1, {"reward_mean": 0.75})  # update 2
            old.log_metrics("r", 2, {"eval/sampled_success": 0.5})  # after 2 updates
            old.add_checkpoint(Checkpoint(run_id="r", step=2, path="c/step-000002"))
            ids = ["r-s0-g0-0", "r-s0-g0-1", "r-s1-g0-0", "r-eval0-s-g0-0", "r-a-g3-0", "x"]
            for rid in ids:
                gid = rid.rsplit("-", 1)[0] if rid != "x" else None
                _rollout_before_10(old, rid, "r", gid)
                attempt = old.start_attempt(rid)
                with old._db.write() as conn:  # a call as tether before migration 9 wrote it
                    conn.execute(_CALL_BEFORE_9, (rid,))
                old.finish_rollout(AttemptEnd(rid, attempt, "succeeded"), reward=float(len(rid)))
    with Store(path) as store:
        assert store._db.migrations_run == 5  # 7, 8 and 10 finding their columns, 9, 11
        got = [(m.step, m.name, m.value) for m in store.metrics("r")]
        assert sorted(got) == [
            (0, "eval/sampled_success", 0.25),
            (1, "reward_mean", 0.5),
            (2, "eval/sampled_success", 0.5),
            (2, "reward_mean", 0.75),
        ]
        assert [c.step for c in store.checkpoints("r")] == [2]
        renamed = {
            "r-s0-g0-0": "r-s1-g0-0",
            "r-s0-g0-1": "r-s1-g0-1",
            "r-s1-g0-0": "r-s2-g0-0",
        }
        assert {r.id for r in store.list_rollouts(run_id="r")} == {
            renamed.get(rid, rid) for rid in ids
        }
        for old_id in ids:
            r = store.get_rollout(renamed.get(old_id, old_id))
            assert r.reward == float(len(old_id))  # its own row, moved whole
            assert [c.completion_ids for c in store.calls(r.id)] == [[2]]
            assert [a.status.value for a in store.attempts(r.id)] == ["succeeded"]
            assert [w.value for w in store.rewards(r.id)] == [float(len(old_id))]
        assert store.get_rollout("r-s2-g0-0").group_id == "r-s2-g0"
        assert store.get_rollout("r-eval0-s-g0-0").group_id == "r-eval0-s-g0"
        assert store.get_rollout("r-a-g3-0").group_id == "r-a-g3"
        # migration 10 then read each place from the renumbered ids
        assert store.get_rollout("r-s2-g0-0").place == Place(Phase.TRAIN, 2, 0, 0)
        assert store.get_rollout("r-s1-g0-1").place == Place(Phase.TRAIN, 1, 0, 1)
        with store._db.read() as conn:
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_migration_9_records_call_roles_and_keeps_old_calls(tmp_path, monkeypatch):
    """A file made before migration 9 keeps its calls (no role: NULL); new calls carry the
    role named in their URL."""
    path = tmp_path / "v8.db"
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:8])
        with Store(path) as old:
            _rollout_before_10(old, "r1")
            old.start_attempt("r1")
            with old._db.write() as conn:
                conn.execute(_CALL_BEFORE_9, ("r1",))
    with Store(path) as store:
        assert store._db.migrations_run == 3  # 9, 10 and 11
        store.record_call(
            Call(rollout_id="r1", seq=-1, prompt_ids=[1], completion_ids=[3], logprobs=[-0.5],
                 policy_version=0, role="critic")
        )  # fmt: skip
        calls = store.calls("r1")
        assert [(c.role, c.completion_ids, c.logprobs) for c in calls] == [
            (None, [2], [-0.5]),
            ("critic", [3], [-0.5]),
        ]


def test_migration_10_stores_each_rollouts_place_read_once_from_its_old_ids(tmp_path, monkeypatch):
    """A file made before migration 10: each rollout the training loop opened gets its
    phase, step, group and index from the ids the loop minted then (a run whose name holds
    "-eval" included); rollouts opened outside the loop get no place; new rollouts store
    the place they are given."""
    path = tmp_path / "v9.db"
    ids = {  # rollout id -> its place
        "calc-eval-s3-g1-2": Place(Phase.TRAIN, 3, 1, 2),
        "calc-eval-eval0-s-g4-0": Place(Phase.EVAL, 0, 4, 0),
        "calc-eval-eval5-g-g0-0": Place(Phase.EVAL, 5, 0, 0, greedy=True),
        "calc-eval-a-g7-1": Place(Phase.ASYNC, None, 7, 1),
        "calc-eval-s1-g0-x": Place(Phase.TRAIN, 1, 0, None),  # a group, an odd member name
        "calc-eval-s1-g0z-0": None,  # not a group id the loop minted
        "other-s1-g0-0": None,  # another run's name
        "r-admin": None,  # opened through the admin API: no group
    }
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:9])
        with Store(path) as old:
            old.create_run({}, run_id="calc-eval")
            for rid in ids:
                gid = rid.rsplit("-", 1)[0] if rid != "r-admin" else None
                _rollout_before_10(old, rid, "calc-eval", gid)
    with Store(path) as store:
        assert store._db.migrations_run == 2  # 10 and 11
        assert {rid: store.get_rollout(rid).place for rid in ids} == ids
        where = Place(Phase.ASYNC, 2, 3, 1)
        store.create_rollout(Rollout(id="new", run_id="calc-eval", place=where))
        assert store.get_rollout("new").place == where
        assert store.list_rollouts(run_id="calc-eval")[-1].place == where
    with closing(sqlite3.connect(path)) as conn:  # a re-run finds the columns: a no-op
        _migrations._m010_rollout_place(conn)
