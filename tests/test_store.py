"""tether.store: schema, round-trips, state machine, rewards, concurrency, crash safety.

Every test uses a real SQLite file under ``tmp_path``.
"""

from __future__ import annotations

import math
import sqlite3
import struct
import threading
from contextlib import closing
from dataclasses import asdict
from types import SimpleNamespace

import pytest

import tether.store as store_pkg
from tests.store_crash import crash_loop, verify
from tether.errors import TetherError, UserError
from tether.records import (
    AttemptEnd,
    Call,
    CallStatus,
    Checkpoint,
    GroupFate,
    IllegalTransition,
    Reward,
    RewardSource,
    Rollout,
    RolloutStatus,
    RunStatus,
    Split,
    Task,
    UpdateGroup,
    UpdateRecord,
)
from tether.store import (
    AlreadyExists,
    DuplicateReward,
    IllegalRolloutTransition,
    InvalidRecord,
    NotFound,
    RolloutClosed,
    StaleAttempt,
    Store,
    StoreError,
)

I32_MIN, I32_MAX = -(2**31), 2**31 - 1


@pytest.fixture
def db(tmp_path):
    with Store(tmp_path / "t.db") as store:
        yield store


def running(store: Store, rid: str = "r1", run_id: str | None = None) -> int:
    """Create rollout ``rid`` and start its first attempt; return the attempt."""
    store.create_rollout(Rollout(id=rid, run_id=run_id, task={"q": rid}))
    return store.start_attempt(rid, token_hash="h1")


def raw(store: Store, sql: str) -> list[tuple]:
    """Rows straight from the file, bypassing the store."""
    with closing(sqlite3.connect(store.path)) as conn:
        return conn.execute(sql).fetchall()


def call(attempt: int = 1, rid: str = "r1", n: int = 3, **kw) -> Call:
    fields = dict(
        rollout_id=rid,
        seq=-1,
        prompt_ids=list(range(50)),
        completion_ids=list(range(100, 100 + n)),
        logprobs=[-0.5] * n,
        policy_version=7,
        attempt=attempt,
    )
    return Call(**{**fields, **kw})


# -- the package face (the schema and migrations: test_store_migrations.py) ----------


def test_exports_and_error_tree():
    assert sorted(store_pkg.__all__) == sorted(
        n for n in dir(store_pkg) if not n.startswith("_") and n != "annotations"
    )
    for name in store_pkg.__all__:
        if name not in ("Store", "redact_secrets"):
            assert issubclass(getattr(store_pkg, name), StoreError)
    assert issubclass(StoreError, TetherError)
    assert issubclass(DuplicateReward, AlreadyExists)
    assert issubclass(IllegalRolloutTransition, IllegalTransition)


def test_add_tasks_stores_a_runs_4000_tasks_and_re_adding_them_is_a_no_op(db):
    db.create_run({}, run_id="big")
    tasks = [
        Task(f"calc-{i}", {"q": f"{i}+1", "a": i + 1}, Split.TRAIN if i % 8 else Split.VAL, "big")
        for i in range(4000)
    ]
    db.add_tasks(tasks)
    db.add_tasks(tasks)  # again: all identical, a no-op (speed is not asserted here)
    assert db.list_tasks(run_id="big") == tasks
    assert len(db.list_tasks(run_id="big", split="val")) == 500


@pytest.mark.parametrize(("mode", "level"), [("NORMAL", 1), ("full", 2)])
def test_connection_pragmas(tmp_path, mode, level):
    with Store(tmp_path / "p.db", synchronous=mode, busy_timeout_s=2.5) as store:
        conn = store._db._writer
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500


def test_bad_synchronous_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"synchronous \('OFF'\) must be one of NORMAL, FULL"):
        Store(tmp_path / "x.db", synchronous="OFF")


def test_closed_store_refuses(tmp_path):
    store = Store(tmp_path / "c.db")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.create_run({})
    with pytest.raises(StoreError, match="closed"):
        store.get_rollout("r1")


# -- round-trips --------------------------------------------------------------------


def test_every_record_round_trips(db):
    run = db.create_run({"lr": 1e-6, "nested": {"k": [1, "ü"]}}, run_id="run1")
    assert db.get_run("run1") == run
    db.set_run_status("run1", RunStatus.FINISHED)
    assert db.get_run("run1").status is RunStatus.FINISHED
    assert [r.id for r in db.list_runs()] == ["run1"]

    tasks = [
        Task("t1", {"q": "2+2", "a": 4}, Split.TRAIN, "run1"),
        Task("t2", {"q": "x"}, Split.VAL),
    ]
    db.add_tasks(tasks)
    assert db.get_task("t1") == tasks[0]
    assert db.list_tasks() == tasks
    assert db.list_tasks(run_id="run1") == [tasks[0]]
    assert db.list_tasks(split="val") == [tasks[1]]

    given = Rollout(id="r1", run_id="run1", task_id="t1", group_id="g1", task={"q": "2+2"})
    assert db.create_rollout(given) == given
    assert db.get_rollout("r1") == given
    attempt = db.start_attempt("r1", token_hash="abc")
    assert db.rollout_auth("r1") == (RolloutStatus.RUNNING, 1, "abc")

    full = Call(
        rollout_id="r1", seq=99, prompt_ids=[1, 2, 3], completion_ids=[I32_MAX, I32_MIN, 0],
        logprobs=[-0.25, -1.5, -0.0], policy_version=4, attempt=attempt,
        request={"messages": [{"role": "user", "content": "hi"}], "tools": [], "temperature": 0.7},
        response={"choices": [{"finish_reason": "length"}]}, finish_reason="length",
        temperature=0.7, status=CallStatus.FAILED, error="engine died", latency_s=0.125,
        created_at=1234.5, constraint="tool_choice:required",
    )  # fmt: skip
    assert db.record_call(full) == 0
    assert db.calls("r1") == [Call(**{**asdict(full), "seq": 0})]

    db.record_reward(Reward("r1", 0.5, RewardSource.GRADER, attempt, call_seq=0, created_at=9.0))
    done = db.finish_rollout(
        AttemptEnd("r1", attempt, "succeeded"),
        reward=0.1 + 0.2,
        reward_source="agent",
        final_answer="4",
    )
    assert done.reward == 0.1 + 0.2  # float64, bit for bit
    assert (done.status, done.reward_source, done.final_answer) == (
        RolloutStatus.SUCCEEDED, RewardSource.AGENT, "4",
    )  # fmt: skip
    assert done.usable and done.finished_at is not None and done.error is None
    assert db.get_rollout("r1") == done
    rewards = db.rewards("r1")
    assert [(r.value, r.source, r.call_seq) for r in rewards] == [
        (0.5, RewardSource.GRADER, 0), (0.1 + 0.2, RewardSource.AGENT, None),
    ]  # fmt: skip
    assert rewards[0].created_at == 9.0

    db.log_metrics("run1", 1, {"loss": 0.5, "kl": float("nan")})
    db.log_metrics("run1", 0, {"loss": 0.75})
    assert [(m.step, m.name, m.value) for m in db.metrics("run1", "loss")] == [
        (0, "loss", 0.75), (1, "loss", 0.5),
    ]  # fmt: skip
    assert math.isnan(db.metrics("run1", "kl")[0].value)
    db.add_checkpoint(Checkpoint("run1", 5, "/ck/5", created_at=1.0))
    db.add_checkpoint(Checkpoint("run1", 10, "/ck/10", created_at=2.0))
    db.add_checkpoint(Checkpoint("run1", 2, "/ck/2"))
    assert db.latest_checkpoint("run1") == Checkpoint("run1", 10, "/ck/10", created_at=2.0)
    assert db.latest_checkpoint("none") is None

    kept = UpdateGroup(0, ("r1", "r2"), GroupFate.KEPT, (0.5, {0: -0.25, 3: 1.0}))
    flat = UpdateGroup(1, ("r3",), GroupFate.NO_SIGNAL)
    update = UpdateRecord("run1", 2, 7, {"advantage": "grpo", "gamma": 0.9}, [kept, flat], 3.0)
    db.add_update(UpdateRecord("run1", 1, None, {}, [UpdateGroup(0, ("r0",), GroupFate.LAG)]))
    db.add_update(update)
    assert [u.step for u in db.updates("run1")] == [1, 2]
    assert db.updates("run1")[1] == update  # per-call advantages keep their int seqs
    assert db.updates("run1")[0].version is None and db.updates("none") == []
    with pytest.raises(AlreadyExists, match="update 2"):
        db.add_update(update)
    with pytest.raises(NotFound):
        db.add_update(UpdateRecord("nope", 1, None, {}, []))


def test_blobs_round_trip_exactly(db):
    attempt = running(db)
    ids = [I32_MIN, I32_MIN + 1, -1, 0, 1, 151_643, I32_MAX - 1, I32_MAX]
    logprobs = [0.0, -0.0, -1e-45, -3.4028234663852886e38, -float("inf"), -0.1, -2.5, -1e-8]
    seq = db.record_call(
        call(prompt_ids=ids, completion_ids=ids, logprobs=logprobs, attempt=attempt)
    )
    stored = db.calls("r1")[seq]
    assert stored.prompt_ids == ids and stored.completion_ids == ids
    as_f32 = list(struct.unpack("<8f", struct.pack("<8f", *logprobs)))
    assert stored.logprobs == as_f32
    assert math.copysign(1, stored.logprobs[1]) == -1  # -0.0 keeps its sign
    [(prompt_blob, logprob_blob, n_prompt)] = raw(
        db, "SELECT prompt_ids, logprobs, n_prompt FROM calls"
    )
    assert prompt_blob == struct.pack("<8i", *ids) and n_prompt == 8
    assert logprob_blob == struct.pack("<8f", *logprobs)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"prompt_ids": [2**31]}, "prompt_ids must be integers in int32 range"),
        ({"completion_ids": [1, I32_MIN - 1], "logprobs": [0.0, 0.0]}, "completion_ids"),
        ({"logprobs": [-0.1]}, r"logprobs \(1\) must have one value per completion token \(3\)"),
        ({"request": {"x": object()}}, "request must be JSON"),
        ({"response": {"x": float("nan")}}, "response must be JSON"),
    ],
)
def test_invalid_call_is_refused_and_nothing_stored(db, kw, match):
    attempt = running(db)
    with pytest.raises(InvalidRecord, match=match):
        db.record_call(call(attempt=attempt, **kw))
    assert db.calls("r1") == []
    assert db.record_call(call(attempt=attempt)) == 0


def test_data_survives_close_and_reopen(tmp_path):
    path = tmp_path / "r.db"
    with Store(path, synchronous="FULL") as store:
        attempt = running(store, run_id=store.create_run({"x": 1}, run_id="run").id)
        for _ in range(3):
            store.record_call(call(attempt=attempt))
        store.finish_rollout(AttemptEnd("r1", attempt, RolloutStatus.SUCCEEDED), reward=-2.0)
        before = (store.get_rollout("r1"), store.calls("r1"), store.rewards("r1"))
    with Store(path) as store:
        assert (store.get_rollout("r1"), store.calls("r1"), store.rewards("r1")) == before
        assert [c.seq for c in store.calls("r1")] == [0, 1, 2]


# -- the rollout state machine --------------------------------------------------------


def test_every_attempt_keeps_its_end_and_output_tail(db):
    """A retry clears the rollout's error, not the failed attempt's record; tails are bounded."""
    db.create_rollout(Rollout(id="r1"))
    first = db.start_attempt("r1")
    flood = "x" * 10_000 + "\nImportError: no module named 'openai'\n"
    db.finish_rollout(
        AttemptEnd(
            "r1",
            first,
            "failed",
            error="agent exited with code 1; retried",
            exit_code=1,
            output_tail=flood,
        )
    )
    second = db.start_attempt("r1")
    assert db.get_rollout("r1").error is None
    db.finish_rollout(
        AttemptEnd("r1", second, "succeeded", output_tail="ok", success=False), reward=0.5
    )
    one, two = db.attempts("r1")
    assert (one.attempt, one.status, one.exit_code, one.success) == (
        1, RolloutStatus.FAILED, 1, None,
    )  # fmt: skip
    assert one.error == "agent exited with code 1; retried"
    assert one.output_tail.endswith("ImportError: no module named 'openai'\n")
    assert one.output_tail.startswith("[... ") and len(one.output_tail.encode()) < 4096 + 40
    assert (two.attempt, two.status, two.output_tail, two.success) == (
        2, RolloutStatus.SUCCEEDED, "ok", False,
    )  # fmt: skip
    assert db.attempts("ghost") == []


def test_each_attempt_keeps_its_own_start_and_end(db, monkeypatch):
    """Rollouts of one batch share ``created_at``; each attempt's own time runs from its
    agent's start (``mark_running``, or a running ``start_attempt``) to its end."""
    from tether.store import _store

    clock = iter(range(100, 200))
    monkeypatch.setattr(_store, "time", SimpleNamespace(time=lambda: float(next(clock))))
    for rid in ("r1", "r2"):
        db.create_rollout(Rollout(id=rid, run_id=None, created_at=1.0))
    a = db.start_attempt("r1", queued=True)
    assert db.get_rollout("r1").started_at is None  # waiting for a runner
    db.mark_running("r1", a)  # 100
    db.finish_rollout(AttemptEnd("r1", a, "succeeded"), reward=1.0)  # 101
    a = db.start_attempt("r2")  # 102
    db.finish_rollout(AttemptEnd("r2", a, "failed"))  # 103
    a = db.start_attempt("r2")  # 104
    assert db.get_rollout("r2").finished_at is None
    db.finish_rollout(AttemptEnd("r2", a, "succeeded"), reward=0.0)  # 105
    r1, r2 = db.get_rollout("r1"), db.get_rollout("r2")
    assert (r1.created_at, r1.started_at, r1.finished_at) == (1.0, 100.0, 101.0)
    assert (r2.created_at, r2.started_at, r2.finished_at) == (1.0, 104.0, 105.0)
    assert [(e.started_at, e.finished_at) for e in db.attempts("r1")] == [(100.0, 101.0)]
    assert [(e.started_at, e.finished_at) for e in db.attempts("r2")] == [
        (102.0, 103.0), (104.0, 105.0),
    ]  # fmt: skip
    _, page = db.rollout_page(None, sort="duration", descending=True)
    assert [r.id for r, _, _ in page] == ["r1", "r2"]  # 1 s each: creation order


def test_latest_rollouts_says_how_many_it_left_out(db):
    db.create_run({}, run_id="a")
    for i in range(7):
        db.create_rollout(Rollout(id=f"a{i}", run_id="a"))
    db.create_rollout(Rollout(id="x", run_id=None))
    a = db.start_attempt("a5")
    db.record_call(call(rid="a5", attempt=a))
    total, rows = db.latest_rollouts(run_id="a", limit=3)
    assert total == 7 and [(r.id, n) for r, n in rows] == [("a4", 0), ("a5", 1), ("a6", 0)]
    assert db.latest_rollouts(limit=0)[0] == 8 and len(db.latest_rollouts(limit=0)[1]) == 8
    assert db.latest_rollouts(status="running") == (1, [(db.get_rollout("a5"), 1)])


def test_state_machine_and_retry(db):
    db.create_rollout(Rollout(id="r1"))
    assert db.rollout_auth("r1") == (RolloutStatus.QUEUED, 0, None)
    assert db.rollout_auth("nope") is None and db.get_rollout("nope") is None
    with pytest.raises(IllegalRolloutTransition, match="'queued' to 'succeeded'"):
        db.finish_rollout(AttemptEnd("r1", 0, "succeeded"))
    with pytest.raises(RolloutClosed, match="queued"):
        db.record_call(call(attempt=0))
    assert db.start_attempt("r1", token_hash="h1") == 1
    with pytest.raises(IllegalRolloutTransition, match="'running' to 'running'"):
        db.start_attempt("r1")
    with pytest.raises(IllegalRolloutTransition, match="needs a final status"):
        db.finish_rollout(AttemptEnd("r1", 1, "queued"))
    db.record_call(call(attempt=1))
    db.record_call(call(attempt=1))
    db.finish_rollout(AttemptEnd("r1", 1, "timeout", error="agent hung"))

    assert db.start_attempt("r1", token_hash="h2") == 2  # the retry
    retried = db.get_rollout("r1")
    assert (retried.status, retried.attempt, retried.error) == (RolloutStatus.RUNNING, 2, None)
    assert db.rollout_auth("r1") == (RolloutStatus.RUNNING, 2, "h2")
    with pytest.raises(StaleAttempt, match="attempt 2; a write from attempt 1"):
        db.record_call(call(attempt=1))
    with pytest.raises(StaleAttempt):
        db.finish_rollout(AttemptEnd("r1", 1, "succeeded"), reward=1.0)
    with pytest.raises(StaleAttempt):
        db.record_reward(Reward("r1", 1.0, RewardSource.AGENT, attempt=1))
    assert db.calls("r1") == [] and db.rewards("r1") == []  # nothing stored by the stale writes
    assert db.get_rollout("r1").status is RolloutStatus.RUNNING

    assert db.record_call(call(attempt=2)) == 0  # seq restarts per attempt
    assert [c.seq for c in db.calls("r1", attempt=1)] == [0, 1]
    db.finish_rollout(AttemptEnd("r1", 2, "succeeded"), reward=1.0)
    with pytest.raises(RolloutClosed, match="succeeded, not running"):
        db.record_call(call(attempt=2))
    for bad in ("running", "failed"):
        with pytest.raises(IllegalRolloutTransition):
            db.finish_rollout(AttemptEnd("r1", 2, bad)) if bad != "running" else db.start_attempt(
                "r1"
            )
    db.create_rollout(Rollout(id="r2"))
    assert db.finish_rollout(AttemptEnd("r2", 0, "cancelled")).status is RolloutStatus.CANCELLED
    with pytest.raises(IllegalRolloutTransition):
        db.start_attempt("r2")


def test_unknown_ids_and_duplicates(db):
    with pytest.raises(NotFound):
        db.record_call(call(rid="ghost"))
    with pytest.raises(NotFound):
        db.start_attempt("ghost")
    with pytest.raises(NotFound):
        db.finish_rollout(AttemptEnd("ghost", 1, "failed"))
    with pytest.raises(NotFound):
        db.get_run("ghost")
    with pytest.raises(NotFound):
        db.get_task("ghost")
    with pytest.raises(NotFound):
        db.set_run_status("ghost", RunStatus.FAILED)
    with pytest.raises(NotFound, match="run 'ghost'"):
        db.create_rollout(Rollout(id="r1", run_id="ghost"))
    with pytest.raises(NotFound):
        db.log_metrics("ghost", 0, {"x": 1.0})
    with pytest.raises(NotFound):
        db.add_tasks([Task("t", {}, run_id="ghost")])
    assert db.calls("ghost") == []

    db.create_run({}, run_id="run")
    with pytest.raises(AlreadyExists):
        db.create_run({}, run_id="run")
    db.create_rollout(Rollout(id="r1"))
    with pytest.raises(AlreadyExists):
        db.create_rollout(Rollout(id="r1"))
    db.add_tasks([Task("t", {"q": 1})])
    db.add_tasks([Task("t", {"q": 1})])  # identical: a no-op
    with pytest.raises(AlreadyExists, match="other content"):
        db.add_tasks([Task("t", {"q": 2}), Task("u", {})])
    assert [t.id for t in db.list_tasks()] == ["t"]  # all or nothing


# -- rewards --------------------------------------------------------------------------


def test_duplicate_final_reward_refused(db):
    attempt = running(db)
    db.record_call(call(attempt=attempt))
    for value in (0.1, 0.2, 0.3):  # intermediate rewards may be many
        db.record_reward(Reward("r1", value, RewardSource.GRADER, attempt, call_seq=0))
    with pytest.raises(NotFound, match="no call 5"):
        db.record_reward(Reward("r1", 1.0, RewardSource.GRADER, attempt, call_seq=5))
    db.record_reward(Reward("r1", 1.0, RewardSource.AGENT, attempt))
    assert db.get_rollout("r1").reward == 1.0
    with pytest.raises(DuplicateReward):
        db.record_reward(Reward("r1", 0.0, RewardSource.GRADER, attempt))
    with pytest.raises(DuplicateReward):
        db.finish_rollout(AttemptEnd("r1", attempt, "succeeded"), reward=0.0)
    assert db.get_rollout("r1").status is RolloutStatus.RUNNING  # the refused finish left no trace
    done = db.finish_rollout(AttemptEnd("r1", attempt, "succeeded"))  # keeps the agent's reward
    assert (done.reward, done.reward_source, done.usable) == (1.0, RewardSource.AGENT, True)
    db.record_reward(Reward("r1", 0.0, RewardSource.GRADER, attempt, call_seq=0))
    assert len(db.rewards("r1")) == 5


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), "1.0", True, 10**400],
    ids=["nan", "inf", "-inf", "str", "bool", "huge-int"],
)
@pytest.mark.parametrize("via", ["finish", "record"])
def test_unusable_reward_is_never_a_number(db, value, via):
    attempt = running(db)
    if via == "finish":
        done = db.finish_rollout(AttemptEnd("r1", attempt, "succeeded", error="late"), reward=value)
    else:
        db.record_reward(Reward("r1", value, RewardSource.AGENT, attempt))
        done = db.finish_rollout(AttemptEnd("r1", attempt, "succeeded", error="late"))
    assert done.reward is None and not done.usable
    assert "late" in done.error and "reward" in done.error
    assert raw(db, "SELECT reward FROM rollouts") == [(None,)]
    assert raw(db, "SELECT value, typeof(value) FROM rewards") == [(None, "null")]
    (stored,) = db.rewards("r1")
    assert not (isinstance(stored.value, float) and math.isfinite(stored.value))
    if isinstance(value, float):
        assert math.isnan(stored.value) if math.isnan(value) else stored.value == value
    counts = db.counts()
    assert (counts["usable"], counts["unusable_reward"]) == (0, 1)


def test_counts_and_listing(db):
    db.create_run({}, run_id="a")
    db.create_run({}, run_id="b")
    for i in range(5):
        db.create_rollout(Rollout(id=f"a{i}", run_id="a", group_id=f"g{i % 2}"))
    db.create_rollout(Rollout(id="b0", run_id="b"))
    for rid in ("a0", "a1", "a2", "b0"):
        attempt = db.start_attempt(rid)
        db.record_call(call(rid=rid, attempt=attempt))
    db.finish_rollout(AttemptEnd("a0", 1, "succeeded"), reward=1.0)
    db.finish_rollout(AttemptEnd("a1", 1, "succeeded"))
    db.finish_rollout(AttemptEnd("a2", 1, "failed"))
    assert [r.id for r in db.list_rollouts(run_id="a")] == ["a0", "a1", "a2", "a3", "a4"]
    assert [r.id for r in db.list_rollouts(group_id="g0")] == ["a0", "a2", "a4"]
    assert [r.id for r in db.list_rollouts(status="running")] == ["b0"]
    assert [r.id for r in db.list_rollouts(run_id="a", status="queued", limit=1)] == ["a3"]
    counts = db.counts("a")
    assert counts["rollouts"] == {"queued": 2, "running": 0, "succeeded": 2, "failed": 1,
                                  "timeout": 0, "cancelled": 0}  # fmt: skip
    assert (counts["calls"], counts["usable"], counts["unusable_reward"]) == (3, 1, 1)
    assert db.counts()["calls"] == 4 and db.counts()["rollouts"]["running"] == 1


# -- concurrency ----------------------------------------------------------------------


def test_gap_free_seq_under_32_threads(tmp_path):
    store = Store(tmp_path / "c.db")
    other = Store(tmp_path / "c.db")  # a second writer on the same file (as another process)
    rollouts = [f"r{i}" for i in range(4)]
    for rid in rollouts:
        running(store, rid)
    per_thread, errors, seen = 25, [], {rid: [] for rid in rollouts}
    torn: list[str] = []
    stop = threading.Event()

    def write(k: int) -> None:
        try:
            for i in range(per_thread):
                rid = rollouts[(k + i) % len(rollouts)]
                target = other if k % 8 == 0 else store
                seen[rid].append(target.record_call(call(rid=rid, n=1 + i % 5)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    def read() -> None:
        while not stop.is_set():
            for rid in rollouts:
                got = store.calls(rid)
                if [c.seq for c in got] != list(range(len(got))) or any(
                    len(c.logprobs) != len(c.completion_ids) for c in got
                ):
                    torn.append(rid)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(32)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == [] and torn == []
    for rid in rollouts:
        assert sorted(seen[rid]) == list(range(len(seen[rid])))
        assert [c.seq for c in store.calls(rid)] == sorted(seen[rid])
    assert store.counts()["calls"] == 32 * per_thread
    other.close()
    store.close()


# -- crash safety ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["NORMAL", "FULL"])
def test_sigkilled_writer_loses_no_acknowledged_write(tmp_path, mode):
    stats = crash_loop(tmp_path / "crash.db", mode, rounds=20, seed=7)
    assert stats.problems == []
    assert stats.rounds == 20 and stats.acked_calls > 20 and stats.acked_finishes > 0


def test_crash_check_notices_a_lost_write(tmp_path):
    path = tmp_path / "v.db"
    Store(path).close()
    assert verify(path, [], "") == []
    assert verify(path, ["call x-0 1 0"], "x-") == ["acknowledged call lost: call x-0 1 0"]


def test_a_judged_attempt_reads_the_prompt_its_group_stores_once(tmp_path) -> None:
    prompt = [{"role": "user", "content": "<task>...</task>"}]
    with Store(tmp_path / "t.db") as s:
        for i in range(3):
            s.create_rollout(Rollout(id=f"g-{i}", group_id="g", task={}))
            s.start_attempt(f"g-{i}")
        s.finish_rollout(
            AttemptEnd("g-0", 1, "succeeded", grade_detail={"candidate": "1", "messages": prompt})
        )
        ref = {"rollout_id": "g-0", "attempt": 1}
        s.finish_rollout(
            AttemptEnd("g-1", 1, "succeeded", grade_detail={"candidate": "2", "prompt_from": ref})
        )
        gone = {"rollout_id": "nowhere", "attempt": 1}
        s.finish_rollout(
            AttemptEnd("g-2", 1, "succeeded", grade_detail={"candidate": "3", "prompt_from": gone})
        )
        (one,), (two,), (three,) = (s.attempts(f"g-{i}") for i in range(3))
    assert two.grade_detail == {"candidate": "2", "prompt_from": ref, "messages": prompt}
    assert one.grade_detail == {"candidate": "1", "messages": prompt}
    assert three.grade_detail == {"candidate": "3", "prompt_from": gone}  # the rest still reads
