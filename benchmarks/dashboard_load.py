"""Page loads of ``tether dashboard`` on a 100k-call store, against a 1k-call store.

Builds two stores shaped like a training run (groups of 8 rollouts, 4 calls each with a
growing multi-turn prompt, per-step metrics): one group through the store's own API,
then copied row by row (new ids, random rewards) in one transaction per store. Starts
``tether dashboard --store FILE`` for each (real servers, as a user runs them), logs in,
and times each page several times, the two stores interleaved (small, big, small, ...).
Target: every page under 1 s on the big store.

    .venv/bin/python benchmarks/dashboard_load.py [--calls 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tether.records import AttemptEnd, Call, Rollout
from tether.store import Store

KEY = "bench-admin-key-0123456789"
GROUP, CALLS_PER_ROLLOUT = 8, 4


def _template(path: Path, run_id: str) -> None:
    """One run with metrics, and one group built through the store's API."""
    rng = random.Random(0)
    with Store(path) as s:
        s.create_run({"name": run_id, "model": {"path": "none"}, "trainer": {"steps": 400}}, run_id)
        for i in range(GROUP):
            rid = f"{run_id}-s0-g0-{i}"
            s.create_rollout(Rollout(id=rid, run_id=run_id, group_id=f"{run_id}-s0-g0",
                                     task_id="t0", task={"question": "12 * 7"}))  # fmt: skip
            a = s.start_attempt(rid)
            prompt = [rng.randrange(50, 500) for _ in range(200)]
            for _ in range(CALLS_PER_ROLLOUT):
                completion = [rng.randrange(50, 500) for _ in range(30)]
                s.record_call(Call(rid, 0, list(prompt), completion,
                                   [-rng.random() for _ in completion], 0, attempt=a,
                                   request={"messages": [{"role": "user", "content": "q" * 400}]},
                                   response={"choices": [{"message": {"content": "a" * 80}}]}))  # fmt: skip
                prompt += completion + [rng.randrange(50, 500) for _ in range(20)]
            s.finish_rollout(
                AttemptEnd(rid, a, "succeeded"), reward=float(i % 2), reward_source="grader"
            )


def _swap(row: tuple, cols: list[str], column: str, old: str, new: str) -> tuple:
    """``row`` with ``old`` replaced by ``new`` in its ``column``."""
    out = list(row)
    out[cols.index(column)] = row[cols.index(column)].replace(old, new)
    return tuple(out)


def build(path: Path, calls: int) -> str:
    """A store at ``path`` with ``calls`` calls; returns its run id."""
    run_id = "bench"
    _template(path, run_id)
    groups = max(calls // (GROUP * CALLS_PER_ROLLOUT), 1)
    rng = random.Random(1)
    conn = sqlite3.connect(path, isolation_level=None)
    r_cols = [r[1] for r in conn.execute("PRAGMA table_info(rollouts)")]
    c_cols = [r[1] for r in conn.execute("PRAGMA table_info(calls)")]
    a_cols = [r[1] for r in conn.execute("PRAGMA table_info(attempts)")]
    w_cols = [r[1] for r in conn.execute("PRAGMA table_info(rewards)") if r[1] != "id"]
    t_rollouts = conn.execute(f"SELECT {','.join(r_cols)} FROM rollouts").fetchall()
    t_calls = conn.execute(f"SELECT {','.join(c_cols)} FROM calls").fetchall()
    t_attempts = conn.execute(f"SELECT {','.join(a_cols)} FROM attempts").fetchall()
    t_rewards = conn.execute(f"SELECT {','.join(w_cols)} FROM rewards").fetchall()
    conn.execute("BEGIN")
    for g in range(1, groups):
        old, new = f"{run_id}-s0-g0", f"{run_id}-s{g // 8}-g{g % 8}"
        reward = {r[0]: float(rng.random() < 0.5) for r in t_rollouts}

        rows = []
        for row in t_rollouts:
            row = list(_swap(row, r_cols, "id", old, new))
            row[r_cols.index("group_id")] = new
            row[r_cols.index("task_id")] = f"t{g % 500}"
            row[r_cols.index("reward")] = reward[t_rollouts[len(rows)][0]]
            rows.append(tuple(row))
        conn.executemany(f"INSERT INTO rollouts VALUES ({','.join('?' * len(r_cols))})", rows)
        for table, cols, found in (("calls", c_cols, t_calls), ("attempts", a_cols, t_attempts)):
            conn.executemany(
                f"INSERT INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                [_swap(r, cols, "rollout_id", old, new) for r in found],
            )
        conn.executemany(
            f"INSERT INTO rewards ({','.join(w_cols)}) VALUES ({','.join('?' * len(w_cols))})",
            [_swap(r, w_cols, "rollout_id", old, new) for r in t_rewards],
        )
    names = ["reward_mean", "success", "loss", "approx_kl", "clip_frac", "grad_norm",
             "entropy", "logprob_gap", "step_s", "rollout_s", "update_s", "gen_tokens_per_s",
             "rss_mb", "groups_dropped", "zero_variance_groups"]  # fmt: skip
    conn.executemany(
        "INSERT INTO metrics (run_id, step, name, value, created_at) VALUES (?,?,?,?,?)",
        [(run_id, step, n, rng.random(), time.time()) for step in range(groups // 8 + 1)
         for n in names],
    )  # fmt: skip
    conn.execute("COMMIT")
    total = conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
    conn.close()
    assert total >= calls * 0.99, total
    return run_id


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dashboard:
    """``tether dashboard --store FILE`` on a free port, logged in."""

    def __init__(self, store: Path):
        self.port = _port()
        env = {**os.environ, "TETHER_ADMIN_KEY": KEY}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "dashboard", "--store", str(store),
             "--port", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.client.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
            assert time.monotonic() < deadline and self.proc.poll() is None
        r = self.client.post("/ui/login", data={"key": KEY}, headers={"Origin": self.base})
        assert r.status_code == 303, r.text

    def get(self, url: str) -> float:
        t0 = time.perf_counter()
        r = self.client.get(url)
        dt = time.perf_counter() - t0
        assert r.status_code == 200, (url, r.status_code, r.text[:200])
        return dt

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)


def pages(run_id: str, key: str) -> dict[str, str]:
    run = f"/ui/s/{key}/run/{run_id}"
    return {
        "runs": "/ui/",
        "run": run,
        "run: metrics.json (all)": f"{run}/metrics.json",
        "rollouts p1 (newest 50)": f"{run}/rollouts",
        "rollouts sorted by reward": f"{run}/rollouts?sort=reward&desc=1",
        "rollouts p200": f"{run}/rollouts?page=200",
        "rollouts step 300 + status": f"{run}/rollouts?step=300&status=succeeded",
        "rollout (4 calls)": f"/ui/s/{key}/rollout/{run_id}-s300-g3-5",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        stores = {}
        for name, n in (("small", args.small), ("big", args.calls)):
            path = Path(tmp) / name / "traces.sqlite"
            build(path, n)
            stores[name] = path
        mb = stores["big"].stat().st_size / 2**20
        print(f"built {args.small:,} and {args.calls:,} call stores in "
              f"{time.perf_counter() - t0:.1f} s (big: {mb:.0f} MiB)")  # fmt: skip
        servers = {name: Dashboard(path) for name, path in stores.items()}
        try:
            times: dict[tuple[str, str], list[float]] = {}
            urls = pages("bench", "small"), pages("bench", "big")
            small_ok = {k: v for k, v in urls[0].items() if "300" not in v and "p200" not in k}
            for _ in range(args.repeat):
                for label in urls[1]:
                    for name, table in (("small", urls[0]), ("big", urls[1])):
                        if name == "small" and label not in small_ok:
                            continue
                        times.setdefault((label, name), []).append(servers[name].get(table[label]))
        finally:
            for s in servers.values():
                s.close()
    load = os.getloadavg()
    print(f"median (max) of {args.repeat} loads each, interleaved; load average "
          f"{load[0]:.1f} {load[1]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'page':30} {f'{args.small:,} calls':>16} {f'{args.calls:,} calls':>18}  < 1 s")
    worst = 0.0
    for label in urls[1]:
        row = []
        for name in ("small", "big"):
            t = times.get((label, name))
            row.append(f"{statistics.median(t) * 1000:7.0f} ({max(t) * 1000:.0f}) ms" if t else "-")
        big = times[(label, "big")]
        worst = max(worst, max(big))
        print(f"{label:30} {row[0]:>16} {row[1]:>18}  {'yes' if max(big) < 1 else 'NO'}")
    print(f"slowest load on the big store: {worst * 1000:.0f} ms")


if __name__ == "__main__":
    main()
