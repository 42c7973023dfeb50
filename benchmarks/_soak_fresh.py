"""``soak.py --vs-fresh K``: is the run's end slower than a fresh run, on the same machine
at the same time?

Time per update at the end of one run against its start cannot tell a run that slows
from a machine that slows: on a shared virtual machine the same work, token for token,
took from -5% to +23% longer at the end of a 300-update run than at its start, with every
thread slowed by about the same share (benchmarks/README.md). So this compares the run's
last updates with a fresh run of the same config, taking turns on the cores:

- the aged run (``soak.py`` in a child process) runs up to ``--updates`` - K·B, where B
  is ``--block``; the fresh run (another child, the same config and seed) runs its first
  W updates, W past ``--warmup`` and chosen so that its blocks meet the same evals and
  checkpoints as the aged run's (W ≡ ``--updates`` - K·B modulo both periods);
- then they take turns, one block of B updates at a time, in the order A F F A A F …
  (each pair's order flipped, so that a machine that slows or speeds up steadily favours
  neither); the one not running is stopped (SIGSTOP: none of its threads runs). Short
  turns meet the machine in the same state: here its speed moved by up to 50% within
  minutes;
- each block reports its sums (``soak.BLOCK_SUMS``), and the comparison takes each piece
  of work's own time: wall and ``step_s`` per update, the rollouts' milliseconds per
  generated token, and ``update_s`` per rollout trained on (the trainer skips the samples
  of a group without signal, and how many groups have it varies from block to block:
  the blocks' updates do not do the same work, their time per rollout is comparable);
  and at the end of each block, outside its time, ``model_probe_s``: one forward and
  backward pass of the run's policy over a fixed batch, the same work in both runs.

Then the fresh run is ended and the aged run finishes and prints its soak report.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: One worker's sums over a block (``soak.BLOCK_SUMS``).
Block = dict[str, float]


class Worker:
    """One ``soak.py --pause-at …`` child: its lines go to this stdout (prefixed)."""

    def __init__(self, name: str, argv: list[str], pause_at: list[int]):
        self.name = name
        cmd = [sys.executable, str(Path(__file__).with_name("soak.py")), *argv, "--pause-at"]
        self.proc = subprocess.Popen(
            [*cmd, *map(str, pause_at)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def pause(self) -> tuple[int, Block]:
        """Read its lines up to its next ``@pause``, then stop it."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@pause "):
                _, step, sums = line.split(maxsplit=2)
                os.kill(self.proc.pid, signal.SIGSTOP)
                return int(step), {**json.loads(sums), "one": 1.0}
            print(f"[{self.name}] {line}", end="", flush=True)
        raise SystemExit(f"error: the {self.name} run ended early (exit {self.proc.wait()})")

    def go(self) -> None:
        assert self.proc.stdin is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Let it run to its end, its lines passed through."""
        self.go()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            print(f"[{self.name}] {line}", end="", flush=True)
        return self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL ends a stopped process too
        self.proc.wait()


def fresh_start(aged_start: int, warmup: int, *periods: int) -> int:
    """W: where the fresh run's first block starts, past ``warmup`` and at the same place
    as ``aged_start`` in each of ``periods`` (of evals, of checkpoints; 0: none)."""
    period = math.lcm(*(p for p in periods if p > 0))  # lcm() of nothing is 1
    start = aged_start % period
    while start < warmup:
        start += period
    return start


def order(pairs: int) -> list[str]:
    """``['aged', 'fresh', 'fresh', 'aged', …]``: each pair's order flipped."""
    turns = (["aged", "fresh"], ["fresh", "aged"])
    return [name for k in range(pairs) for name in turns[k % 2]]


def vs_fresh(args: Any, argv: list[str]) -> None:
    k, b = args.vs_fresh, args.block
    if b <= 0:
        raise SystemExit(f"error: --block is {b}: the updates per turn must be > 0")
    aged_start = args.updates - k * b
    w = fresh_start(aged_start, args.warmup, args.eval_every, args.checkpoint_every)
    if w + k * b > aged_start:
        raise SystemExit(
            f"error: --updates {args.updates} is too short for --vs-fresh {k} --block {b}: "
            f"the run's last {k * b} updates must come after a fresh run's warm-up and its "
            f"{k * b} (updates {w + 1}-{w + k * b}); raise --updates or lower --vs-fresh"
        )
    ends = [aged_start + j * b for j in range(k + 1)], [w + j * b for j in range(k + 1)]
    argv = [*argv, "--vs-fresh", "0"]  # the workers' own: argparse takes the last one
    blocks: dict[str, list[Block]] = {"aged": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="tether-soak-fresh-") as tmp:
        workers: dict[str, Worker] = {}
        try:
            for name, pauses in zip(("aged", "fresh"), ends, strict=True):  # one, then the other
                workers[name] = Worker(name, [*argv, "--out", f"{tmp}/{name}"], pauses)
                at, _ = workers[name].pause()
                print(f"[{name}] at update {at}: waits its turn", flush=True)
            for name in order(k):
                workers[name].go()
                at, block = workers[name].pause()
                blocks[name].append(block)
                per_update = block["wall_s"] / block["updates"]
                print(f"[{name}] to update {at}: {per_update:.3f} s/update", flush=True)
            workers.pop("fresh").kill()
            code = workers["aged"].finish()
        except BaseException as exc:  # Ctrl-C, a worker that failed: none is left, stopped or not
            for worker in workers.values():
                worker.kill()
            if isinstance(exc, KeyboardInterrupt):
                print("interrupted: both runs ended, their folders removed", file=sys.stderr)
                raise SystemExit(130) from None
            raise
    print_blocks(blocks, aged_start, w, b)
    if code:
        raise SystemExit(code)


#: The figures of a block, each the time of one piece of work (a ratio of two sums):
#: ``(name, numerator, denominator, scale)``.
FIGURES: tuple[tuple[str, str, str, float], ...] = (
    ("wall s per update", "wall_s", "updates", 1.0),
    ("step_s per update", "step_s", "updates", 1.0),
    ("rollout ms per generated token", "rollout_s", "tokens", 1000.0),
    ("update ms per rollout trained on", "update_s", "trained_rollouts", 1000.0),
    ("the same forward and backward (model_probe_s)", "model_probe_s", "one", 1.0),
    ("seconds per eval", "eval_s", "evals", 1.0),
)


def figure(block: Block, num: str, den: str, scale: float) -> float:
    return scale * block[num] / block[den] if block[den] else math.nan


def print_blocks(blocks: dict[str, list[Block]], aged: int, fresh: int, b: int) -> None:
    print(f"\nblocks of {b} updates, taking turns (aged from update {aged + 1}, fresh from "
          f"{fresh + 1}):")  # fmt: skip
    print(f"{'':6} {'s/update':>9} {'step_s':>7} {'gen ms/token':>12} {'train ms/rollout':>16} "
          f"{'trained':>8} {'tokens':>7}")  # fmt: skip
    for name, rows in blocks.items():
        for r in rows:
            cells = [figure(r, num, den, x) for _, num, den, x in FIGURES]
            print(f"{name:<6} {cells[0]:9.3f} {cells[1]:7.3f} {cells[2]:12.3f} {cells[3]:16.2f} "
                  f"{r['trained']:4.0f}/{r['updates']:<3.0f} {r['tokens'] / r['updates']:7.1f}")  # fmt: skip
    print("aged against fresh (over all their blocks; and block against block):")
    sums = {n: {k: sum(r.get(k, 0.0) for r in rows) for k in rows[0]} for n, rows in blocks.items()}
    for what, num, den, x in FIGURES:
        aged_v, fresh_v = figure(sums["aged"], num, den, x), figure(sums["fresh"], num, den, x)
        pairs = [figure(a, num, den, x) / figure(f, num, den, x) - 1
                 for a, f in zip(blocks["aged"], blocks["fresh"], strict=True)]  # fmt: skip
        pairs = sorted(p for p in pairs if not math.isnan(p))
        spread = "no pair"
        if pairs:
            spread = f"pairs: median {statistics.median(pairs):+.1%}, "
            spread += f"{pairs[0]:+.1%} to {pairs[-1]:+.1%}"
        print(f"  {what}: aged {aged_v:.4g}, fresh {fresh_v:.4g} ({aged_v / fresh_v - 1:+.1%}; "
              f"{spread})")  # fmt: skip
    print_eval_threads(blocks)


def print_eval_threads(blocks: dict[str, list[Block]]) -> None:
    """CPU seconds per eval by thread, aged against fresh: which thread's work grew."""
    per_eval: dict[str, dict[str, float]] = {}
    for name, rows in blocks.items():
        evals = sum(r["evals"] for r in rows)
        keys = {k for r in rows for k in r if k.startswith("eval_cpu:")}
        per_eval[name] = (
            {k[9:]: sum(r.get(k, 0.0) for r in rows) / evals for k in keys} if evals else {}
        )
    print("CPU seconds per eval by thread (aged, fresh):")
    for thread in sorted(set(per_eval["aged"]) | set(per_eval["fresh"])):
        a, f = per_eval["aged"].get(thread, 0.0), per_eval["fresh"].get(thread, 0.0)
        print(f"  {thread:<28} {a:8.3f} {f:8.3f} ({a - f:+.3f})")
