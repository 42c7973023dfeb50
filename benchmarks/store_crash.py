"""Crash-safety and write-latency check of tether's trace store.

    python benchmarks/store_crash.py [--rounds 300] [--seed 0] [--calls 3000]

1. For each ``synchronous`` mode (NORMAL, FULL): ``--rounds`` rounds of a
   store writer killed with SIGKILL at a random moment, each followed by
   ``PRAGMA integrity_check``, a check that every acknowledged write is there
   and whole, and no half-written call (``tests/store_crash.py``).
2. ``record_call`` latency, one thread, a 50-token prompt and a 20-token
   completion (what the gateway stores per call), per mode.

Prints two small tables; exits 1 if any crash round found a problem.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.store_crash import crash_loop
from tether.records import Call, Rollout
from tether.store import Store

MODES = ("NORMAL", "FULL")


def latency(path: Path, mode: str, n: int) -> dict[str, float]:
    """Time ``n`` record_call()s spread over 16 running rollouts; microseconds."""
    request = {
        "messages": [{"role": "user", "content": "What is 12 * 7? Use the calculator."}],
        "temperature": 1.0,
        "max_tokens": 64,
    }
    response = {"choices": [{"message": {"content": "84"}, "finish_reason": "stop"}]}
    with Store(path, synchronous=mode) as store:
        calls = []
        for i in range(16):
            store.create_rollout(Rollout(id=f"r{i}"))
            attempt = store.start_attempt(f"r{i}", token_hash="h")
            calls.append(
                Call(f"r{i}", 0, list(range(1000, 1050)), list(range(20)), [-0.5] * 20, 1,
                     attempt, request, response, "stop")
            )  # fmt: skip
        took = []
        started = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            store.record_call(calls[i % 16])
            took.append(time.perf_counter() - t)
        wall = time.perf_counter() - started
    took.sort()
    return {
        "mean": wall / n * 1e6,
        "p50": statistics.median(took) * 1e6,
        "p99": took[int(n * 0.99)] * 1e6,
        "per_s": n / wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="kill rounds per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=3000, help="calls for the latency run")
    args = parser.parse_args()

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'mode':<7} {'rounds':>6} {'early':>5} {'acked calls':>11} "
              f"{'finishes':>8} {'problems':>8} {'seconds':>7}")  # fmt: skip
        for mode in MODES:
            s = crash_loop(Path(tmp) / f"crash-{mode}.db", mode, args.rounds, seed=args.seed)
            print(f"{mode:<7} {s.rounds:>6} {s.early_kills:>5} {s.acked_calls:>11} "
                  f"{s.acked_finishes:>8} {len(s.problems):>8} {s.seconds:>7.1f}")  # fmt: skip
            for problem in s.problems[:10]:
                print("   ", problem)
            failed |= bool(s.problems)
        print()
        print(f"{'mode':<7} {'record_call mean':>16} {'p50':>7} {'p99':>7} {'calls/s':>8}")
        for mode in MODES:
            r = latency(Path(tmp) / f"lat-{mode}.db", mode, args.calls)
            print(f"{mode:<7} {r['mean']:>13.0f} us {r['p50']:>4.0f} us {r['p99']:>4.0f} us "
                  f"{r['per_s']:>8.0f}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
