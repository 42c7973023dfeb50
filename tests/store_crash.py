"""Crash-safety harness: a store writer killed with SIGKILL at random moments.

Test machinery, outside the library: the store knows nothing of it. Each
round starts a writer process (``python tests/store_crash.py PATH MODE PREFIX``) on the same file. The writer creates rollouts, records calls of
known content (a function of rollout, attempt and seq), retries some
rollouts, finishes them with a reward, and prints one line after each write
returns (``call RID ATTEMPT SEQ`` / ``finish RID ATTEMPT STATUS``), flushed to
a file. The harness kills it at a random moment, then checks the file:

- ``PRAGMA integrity_check`` is ``ok`` and the store reopens;
- every acknowledged write is there, whole;
- every stored call of the round is whole (content as written), seqs are
  gap-free from 0, and no acknowledged finish was lost.

``tests/test_store.py`` runs a few dozen rounds; ``benchmarks/store_crash.py``
runs hundreds per ``synchronous`` mode.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tether.records import AttemptEnd, Call, RewardSource, Rollout, RolloutStatus
from tether.store import AlreadyExists, Store

__all__ = ["CrashStats", "crash_loop", "expected_call", "verify"]

RUN_ID = "crash-run"
_ROOT = Path(__file__).resolve().parents[1]  # the directory holding the tether package


def _int32s(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 4}i", blob))


def expected_call(rollout_id: str, attempt: int, seq: int) -> Call:
    """The call the writer records as ``seq`` of ``attempt``: random int32 ids
    (any value, edges included), float32-exact logprobs, prompts up to 20 KB."""
    rng = random.Random(f"{rollout_id}/{attempt}/{seq}")
    n_prompt = rng.randint(1, 300) if rng.random() < 0.8 else rng.randint(1000, 5000)
    n_completion = rng.randint(0, 200)
    return Call(
        rollout_id=rollout_id,
        seq=seq,
        prompt_ids=_int32s(rng.randbytes(4 * n_prompt)),
        completion_ids=_int32s(rng.randbytes(4 * n_completion)),
        logprobs=[-b / 64.0 for b in rng.randbytes(n_completion)],
        policy_version=seq,
        attempt=attempt,
        request={"messages": [{"role": "user", "content": f"{rollout_id}/{attempt}/{seq}"}]},
        response={"n": n_completion},
        finish_reason="stop",
    )


def expected_reward(rollout_id: str) -> float:
    return random.Random(rollout_id).uniform(-1.0, 1.0)


def _writer(path: str, mode: str, prefix: str) -> None:
    """Write forever, acknowledging each returned write on stdout (flushed)."""
    store = Store(path, synchronous=mode)
    with contextlib.suppress(AlreadyExists):
        store.create_run({"crash": True}, run_id=RUN_ID)
    rng = random.Random(prefix)
    for k in range(10**9):
        rid = f"{prefix}-{k}"
        store.create_rollout(Rollout(id=rid, run_id=RUN_ID, task={"k": k}))
        tries = 2 if rng.random() < 0.25 else 1
        for i in range(tries):
            attempt = store.start_attempt(rid, token_hash=f"hash-{i}")
            for n in range(rng.randint(1, 6)):
                seq = store.record_call(expected_call(rid, attempt, n))
                assert seq == n, (seq, n)
                print(f"call {rid} {attempt} {seq}", flush=True)
            status = "failed" if i < tries - 1 else "succeeded"
            reward = expected_reward(rid) if status == "succeeded" else None
            store.finish_rollout(
                AttemptEnd(rid, attempt, status), reward=reward, reward_source=RewardSource.GRADER
            )
            print(f"finish {rid} {attempt} {status}", flush=True)


def verify(path: str | Path, acks: list[str], prefix: str) -> list[str]:
    """Check the file after a kill; return the problems found (empty when all is well)."""
    conn = sqlite3.connect(path)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    finally:
        conn.close()
    if integrity != ["ok"]:
        return [f"integrity_check: {integrity[:5]}"]
    problems: list[str] = []
    with Store(path) as store:
        stored: set[tuple[str, int, int]] = set()
        rollouts = {r.id: r for r in store.list_rollouts(run_id=RUN_ID) if r.id.startswith(prefix)}
        for rollout in rollouts.values():
            for attempt in range(1, rollout.attempt + 1):
                calls = store.calls(rollout.id, attempt)
                if [c.seq for c in calls] != list(range(len(calls))):
                    problems.append(f"{rollout.id}/{attempt}: seqs {[c.seq for c in calls]}")
                for c in calls:
                    want = expected_call(rollout.id, attempt, c.seq)
                    got = (c.prompt_ids, c.completion_ids, c.logprobs, c.request, c.response)
                    if got != (
                        want.prompt_ids, want.completion_ids, want.logprobs, want.request,
                        want.response,
                    ):  # fmt: skip
                        problems.append(f"{rollout.id}/{attempt}/{c.seq}: call is not whole")
                    stored.add((rollout.id, attempt, c.seq))
        for line in acks:
            kind, rid, attempt, what = line.split()
            rollout = rollouts.get(rid)
            if kind == "call" and (rid, int(attempt), int(what)) not in stored:
                problems.append(f"acknowledged call lost: {line}")
            elif kind == "finish" and not _finish_kept(rollout, int(attempt), what):
                problems.append(f"acknowledged finish lost: {line} (now {rollout})")
    return problems


def _finish_kept(rollout: Rollout | None, attempt: int, status: str) -> bool:
    if rollout is None:
        return False
    if status == "failed":  # the retry may already have started
        return rollout.attempt > attempt or rollout.status is RolloutStatus.FAILED
    return (
        rollout.status is RolloutStatus.SUCCEEDED
        and rollout.attempt == attempt
        and rollout.reward == expected_reward(rollout.id)
    )


@dataclass
class CrashStats:
    """What :func:`crash_loop` saw."""

    mode: str
    rounds: int = 0
    acked_calls: int = 0
    acked_finishes: int = 0
    early_kills: int = 0  # killed before the first acknowledgement
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def crash_loop(
    path: str | Path, mode: str, rounds: int, *, seed: int = 0, max_delay_s: float = 0.05
) -> CrashStats:
    """Run ``rounds`` kill-and-verify rounds on ``path``; a final pass re-checks every round.

    Most rounds wait for the writer's first acknowledgement and then kill it
    after a uniform random delay in ``[0, max_delay_s]``; one in ten kills it at
    a random moment from its start (opening, migrating, first writes).
    """
    rng = random.Random(seed)
    stats = CrashStats(mode=mode)
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    every_ack: list[str] = []
    for n in range(rounds):
        prefix = f"{mode.lower()}{n}"
        acks_path = Path(f"{path}.acks")
        with open(acks_path, "wb") as out, open(f"{path}.stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, __file__, str(path), mode, prefix],
                stdout=out, stderr=err, env=env, cwd=_ROOT,
            )  # fmt: skip
        try:
            if rng.random() < 0.1:
                stats.early_kills += 1
                time.sleep(rng.uniform(0, 0.15))
            else:
                deadline = time.monotonic() + 30
                while acks_path.stat().st_size == 0 and proc.poll() is None:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, max_delay_s))
            exited = proc.poll()
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        if exited is not None:
            stats.problems.append(
                f"round {n}: writer exited by itself ({exited}): "
                + Path(f"{path}.stderr").read_text()[-2000:]
            )
        text = acks_path.read_text()
        acks = text.splitlines()[: text.count("\n")]  # complete lines only
        every_ack += acks
        stats.acked_calls += sum(line.startswith("call ") for line in acks)
        stats.acked_finishes += sum(line.startswith("finish ") for line in acks)
        stats.problems += [f"round {n}: {p}" for p in verify(path, acks, prefix + "-")]
        stats.rounds += 1
    stats.problems += [f"final pass: {p}" for p in verify(path, every_ack, "")]
    stats.seconds = time.perf_counter() - started
    return stats


if __name__ == "__main__":
    _writer(*sys.argv[1:4])
