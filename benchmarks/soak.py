"""A long run of the starter model on the calc task: does anything grow with the run?

One ``tether train`` of ``examples/calc/config.yaml`` in this process (the warm starter,
the embedded engine, the calc agent in-process), with evals as large and as frequent as
the demo's (``--eval-tasks`` × (``--eval-samples`` + greedy) every ``--eval-every``
updates). After every ``--every`` updates it samples:

- ``rss_mib``: resident memory after the run's own heap trim;
- ``objects``: live Python objects the garbage collector tracks (and, at the end, the
  types whose count grew most);
- ``fds``, ``threads``: open file descriptors, threads;
- ``store_mib``, ``wal_mib``: the trace store's SQLite file and its write-ahead log;
- ``tensorboard_mib``, ``checkpoints_mib``: those folders;
- ``step_s``: seconds per update (the mean of the updates since the last sample), and
  its two parts, ``rollout_s`` (collecting the groups) and ``update_s`` (the trainer);
- ``cpu_s``: CPU seconds the process spent per update (all its threads; an eval's
  excluded): unlike ``step_s`` it hardly moves when other programs share the cores;
- ``cpu:<thread>``: ``cpu_s`` by thread, summed by the Python thread's name without its
  number (``native`` for threads Python did not start: torch's, SQLite's, glibc's);
  printed at the end, start against end, to say which thread's work grew;
- ``probe_s``: seconds of a fixed piece of work (torch matmuls and a Python loop, the
  same at every sample): how fast the machine is right now. The same instructions take
  longer when another program or the host takes the cores; ``step_s`` drifting with
  ``probe_s`` is the machine, drifting alone is the run;
- ``tokens``: tokens the policy generated per update (async: those of the batch it
  trained); ``ms_per_token`` and
  ``cpu_ms_per_token``: ``step_s`` and ``cpu_s`` over them. A policy that learns to write
  longer answers makes its updates slower without anything in tether growing; the time
  per token tells the two apart (``cpu_ms_per_token`` also when the cores are shared).

Like the ``tether`` command, it caps glibc's heap arenas first (``limit_arenas``);
``--default-arenas`` keeps glibc's default, the baseline that grew (docs/memory.md).

Then, for each, the least-squares slope per update over the samples after
``--warmup`` updates, with its standard error, and the first and last values. The
targets (issue "Long runs stay healthy"): RSS ≤ 0.2 MiB per update over ≥ 300 updates,
and ``step_s`` at the end within 10% of the start.

    .venv/bin/python benchmarks/soak.py [--updates 300] [--mode sync|async] [--lora]
        [--every 10] [--warmup 20] [--eval-every 20] [--eval-tasks 100] [--eval-samples 4]
        [--batch-groups 2] [--n 4] [--held] [--default-arenas] [--json FILE]
        [--vs-fresh K] [--block 5]

``--held`` holds the policy still (``trainer.lr=1e-12``: every update, push, eval and
checkpoint still runs, but the weights move by about 1e-12): a learning policy changes the
length of its answers, and with them the work of an update, so only a held one shows
whether the run's length alone makes an update slower (``step_s`` at the start and the
end, with the same work).

``--vs-fresh K`` runs the soak in a child process and, for its last K blocks of
``--block`` updates, takes turns with a fresh run of the same config on the same
cores (``_soak_fresh.py``): the run's end against a run's start at the same moment, so
that a machine that slows down between the two shows in neither.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "calc" / "config.yaml"
FIGURES = ("rss_mib", "objects", "fds", "threads", "store_mib", "wal_mib",
           "tensorboard_mib", "checkpoints_mib", "probe_s", "step_s", "rollout_s", "update_s", "cpu_s",
           "tokens", "ms_per_token", "cpu_ms_per_token")  # fmt: skip
TIMES = ("step_s", "rollout_s", "update_s", "cpu_s", "tokens")  # per update, averaged over a sample


def overrides(args: argparse.Namespace, out: Path) -> list[str]:
    """The soak's run: the calc example with small updates and the demo's evals."""
    o = [
        f"dir={out}", "name=soak", f"trainer.steps={args.updates}", f"run.mode={args.mode}",
        f"rollout.n={args.n}", f"rollout.batch_groups={args.batch_groups}",
        "agent.mode=inprocess", "agent.entry=tether.starter.calc:agent",
        f"eval.every={args.eval_every}", f"eval.tasks={args.eval_tasks}",
        f"eval.samples={args.eval_samples}", "run.collapse_patience=0",
        f"checkpoint.every={args.checkpoint_every}", "checkpoint.keep=2",
    ]  # fmt: skip
    if args.lora:
        o += ["trainer.lora.r=16", "trainer.lr=1e-3"]
    if args.held:
        o += ["trainer.lr=1e-12"]  # every update still runs; the weights hardly move
    return o


def folder_mib(path: Path) -> float:
    if not path.exists():
        return 0.0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def file_mib(path: Path) -> float:
    return path.stat().st_size / 2**20 if path.exists() else 0.0


def probe() -> float:
    """Seconds of a fixed piece of work (module docstring, ``probe_s``): the mean of 3."""
    import torch

    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for _ in range(3):
        for _ in range(40):
            a = torch.tanh(a @ a)
        sum(i * i for i in range(100_000))
    return (time.perf_counter() - t0) / 3


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each thread of this process: its name (see the module docstring) and CPU seconds."""
    names = {t.native_id: re.sub(r"[-_]?\d+", "", t.name) for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        out[int(tid)] = (names.get(int(tid), "native"), cpu)
    return out


def by_thread(
    before: dict[int, tuple[str, float]], now: dict[int, tuple[str, float]]
) -> Counter[str]:
    """CPU seconds each thread name spent between two :func:`thread_cpu` snapshots."""
    spent: Counter[str] = Counter()
    for tid, (name, cpu) in now.items():
        spent[name] += cpu - before.get(tid, (name, 0.0))[1]
    return spent


def gen_span(m: dict[str, float]) -> float:
    """The seconds an update's ``gen_tokens_per_s`` is over: its ``rollout_s`` (sync), or
    (async, where the groups are collected beside the updates) its wait and pause."""
    return m.get("rollout_s", m.get("wait_s", math.nan) + m.get("paused_s", math.nan))


def tokens_of(m: dict[str, float]) -> float:
    """Tokens the policy generated for an update, from its metrics."""
    return m.get("gen_tokens_per_s", math.nan) * gen_span(m)


class Baton:
    """A ``--pause-at`` worker's side of ``--vs-fresh`` (``_soak_fresh.py``): after each
    listed update it prints ``@pause <update> <json>``, the sums of what it did since it
    last went on (``BLOCK_SUMS``), and waits for a line on stdin."""

    def __init__(self, at: set[int]):
        self.at = at
        self.model: Any = None  # the run's policy model, for model_probe (set by soak())
        self._since()

    def _since(self) -> None:
        self.t0 = time.perf_counter()
        self.sums: dict[str, float] = dict.fromkeys(BLOCK_SUMS, 0.0)
        self._eval_threads = thread_cpu()

    def on_event(self, event: Any) -> bool:
        """Add ``event`` up; True when it paused after it."""
        from tether.run._events import EvalDone, EvalStart, StepDone

        if isinstance(event, EvalStart):
            self._eval_threads = thread_cpu()
        if isinstance(event, EvalDone):  # its wall and each thread's CPU seconds
            self.sums["evals"] += 1
            self.sums["eval_s"] += event.result.wall_s
            for name, cpu in by_thread(self._eval_threads, thread_cpu()).items():
                self.sums[f"eval_cpu:{name}"] = self.sums.get(f"eval_cpu:{name}", 0.0) + cpu
        if not isinstance(event, StepDone):
            return False
        m, sums = event.report.metrics, self.sums
        sums["updates"] += 1
        sums["step_s"] += m["step_s"]
        sums["rollout_s"] += gen_span(m)
        sums["tokens"] += tokens_of(m)
        if "update_s" in m:  # it trained: every group without signal skips the update
            sums["trained"] += 1
            sums["update_s"] += m["update_s"]
            sums["trained_rollouts"] += m["rollouts"] * (1 - m["zero_variance_frac"])
        if event.report.step in self.at:
            sums["wall_s"] = time.perf_counter() - self.t0
            sums["model_probe_s"] = model_probe(self.model) if self.model is not None else 0.0
            print(f"@pause {event.report.step} {json.dumps(sums)}", flush=True)
            sys.stdin.readline()  # the driver stops this process meanwhile
            self._since()
            return True
        return False


def model_probe(model: Any, repeats: int = 3) -> float:
    """Seconds of one forward and backward pass of the run's policy ``model`` over a fixed
    batch (8 × 256 seeded token ids; the mean of ``repeats``), its gradients then dropped:
    exactly the same torch work in any process, whatever the run has trained on."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (8, 256),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    t0 = time.perf_counter()
    for _ in range(repeats):
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / repeats


#: What a :class:`Baton` adds up over a block: its wall seconds (evals, checkpoints and
#: the sampler included), updates, their ``step_s``, generated tokens and the seconds they
#: took (``rollout_s``; async: :func:`gen_span`),
#: and the updates that trained (``trained``) with their ``update_s`` and the rollouts of
#: their groups with signal (the trainer skips a sample without advantage: a group whose
#: rewards are all equal costs it nothing, so an update's work is those rollouts, each
#: one sequence of about the same length here).
#: And its evals: how many, their wall seconds and (``eval_cpu:<thread>``) each thread's
#: CPU seconds in them.
BLOCK_SUMS = ("wall_s", "updates", "step_s", "rollout_s", "tokens", "trained", "update_s",
              "trained_rollouts", "evals", "eval_s")  # fmt: skip


class Sampler:
    """The figures of the module docstring, taken at a StepDone every ``every`` updates."""

    def __init__(self, run_dir: Path, every: int):
        self.run_dir, self.every = run_dir, every
        self.rows: list[dict[str, float]] = []
        self.types_first: Counter[str] | None = None
        self.types_last: Counter[str] = Counter()
        self._steps: dict[str, list[float]] = {name: [] for name in TIMES}
        self._cpu = time.process_time()
        self._threads = thread_cpu()
        self._by_thread: list[Counter[str]] = []

    def on_event(self, event: Any) -> None:
        from tether.run._events import EvalDone, StepDone

        if isinstance(event, EvalDone):  # cpu_s: an update's, not the eval's before it
            self.restart()
        if not isinstance(event, StepDone):
            return
        report, m = event.report, event.report.metrics
        tokens = tokens_of(m)
        cpu, self._cpu = time.process_time() - self._cpu, time.process_time()
        threads = thread_cpu()
        self._by_thread.append(by_thread(self._threads, threads))
        self._threads = threads
        figures = (m.get("step_s"), m.get("rollout_s"), m.get("update_s"), cpu, tokens)
        for name, value in zip(TIMES, figures, strict=True):
            if value is not None and not math.isnan(value):  # no update_s: nothing trained
                self._steps[name].append(value)
        if report.step % self.every == 0:
            self.sample(report.step, report.metrics.get("rss_mb", math.nan))

    def restart(self) -> None:
        """Count CPU seconds from now (what ran since was not an update's)."""
        self._cpu, self._threads = time.process_time(), thread_cpu()

    def sample(self, step: int, rss: float) -> None:
        gc.collect()
        objects = gc.get_objects()
        types = Counter(type(o).__name__ for o in objects)
        del objects
        if self.types_first is None:
            self.types_first = types
        self.types_last = types
        db = self.run_dir / "traces.sqlite"
        row = {
            "update": float(step),
            "rss_mib": rss,
            "objects": float(sum(types.values())),
            "fds": float(len(os.listdir("/proc/self/fd"))),
            "threads": float(threading.active_count()),
            "store_mib": file_mib(db),
            "wal_mib": file_mib(db.with_name(db.name + "-wal")),
            "tensorboard_mib": folder_mib(self.run_dir / "tensorboard"),
            "checkpoints_mib": folder_mib(self.run_dir / "checkpoints"),
            "probe_s": probe(),
        }
        for name, values in self._steps.items():
            row[name] = sum(values) / len(values) if values else math.nan
            values.clear()
        spent = sum(self._by_thread, Counter())
        for name, seconds in spent.items():
            row[f"cpu:{name}"] = seconds / max(len(self._by_thread), 1)
        self._by_thread.clear()
        for name, seconds in (("ms_per_token", "step_s"), ("cpu_ms_per_token", "cpu_s")):
            row[name] = 1000 * row[seconds] / row["tokens"] if row["tokens"] else math.nan
        self.rows.append(row)
        print(" ".join(f"{k}={v:.6g}" for k, v in row.items()), flush=True)


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ys on xs and its standard error (NaN with < 3 points)."""
    n = len(xs)
    if n < 3:
        return math.nan, math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return b, math.sqrt(resid / (n - 2) / sxx)


def report(rows: list[dict[str, float]], warmup: int) -> dict[str, dict[str, float]]:
    kept = [r for r in rows if r["update"] >= warmup]
    out: dict[str, dict[str, float]] = {}
    for name in FIGURES:
        pairs = [(r["update"], r[name]) for r in kept if not math.isnan(r[name])]
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        b, se = slope(xs, ys)
        out[name] = {"first": ys[0] if ys else math.nan, "last": ys[-1] if ys else math.nan,
                     "per_update": b, "stderr": se}  # fmt: skip
    return out


def print_report(summary: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    arenas = "glibc's default arenas" if args.default_arenas else "arenas capped"
    what = f"{args.mode}, {'LoRA r=16' if args.lora else 'full'}, {arenas}"
    what += ", policy held" if args.held else ""
    print(f"\n{args.updates} updates ({what}); growth per update after update {args.warmup}:")
    print(f"{'figure':<16} {'first':>10} {'last':>10} {'per update':>12} {'± stderr':>10}")
    for name, s in summary.items():
        print(f"{name:<16} {s['first']:>10.4g} {s['last']:>10.4g} "
              f"{s['per_update']:>12.4g} {s['stderr']:>10.2g}")  # fmt: skip


def print_threads(rows: list[dict[str, float]], warmup: int, k: int = 3) -> None:
    """CPU seconds per update by thread name, the first and the last ``k`` samples."""
    kept = [r for r in rows if r["update"] >= warmup]
    if len(kept) < 2 * k:
        return
    names = sorted({n for r in kept for n in r if n.startswith("cpu:")})
    print("CPU seconds per update by thread, at the start and the end:")
    for name in names:
        first = sum(r.get(name, 0.0) for r in kept[:k]) / k
        last = sum(r.get(name, 0.0) for r in kept[-k:]) / k
        print(f"  {name[4:]:<28} {first:8.4f} {last:8.4f} ({last - first:+.4f})")


def print_drift(rows: list[dict[str, float]], warmup: int, k: int = 3) -> None:
    """Time per update at the start and the end: the mean of the first and the last ``k``
    samples past the warm-up (one sample averages ``--every`` updates)."""
    kept = [r for r in rows if r["update"] >= warmup]
    if len(kept) < 2 * k:
        return
    for name in FIGURES[FIGURES.index("probe_s") :]:
        values = [r[name] for r in kept if not math.isnan(r[name])]
        if len(values) < 2 * k:
            continue
        first, last = sum(values[:k]) / k, sum(values[-k:]) / k
        print(f"{name}: {first:.4g} at the start, {last:.4g} at the end ({last / first - 1:+.1%})")
    ratio = [r["step_s"] / r["probe_s"] for r in kept if not math.isnan(r["step_s"])]
    if len(ratio) >= 2 * k:
        first, last = sum(ratio[:k]) / k, sum(ratio[-k:]) / k
        print(
            f"step_s / probe_s (the run's time on the machine's speed): {first:.4g} at the "
            f"start, {last:.4g} at the end ({last / first - 1:+.1%})"
        )


async def soak(args: argparse.Namespace, out: Path) -> Sampler:
    from tether.configio import load_config
    from tether.run import TrainConfig, TrainingRun

    cfg = load_config(TrainConfig, CONFIG, overrides(args, out))
    sampler = Sampler(out / "soak", args.every)
    baton = Baton(set(args.pause_at))

    def on_event(event: Any) -> None:
        sampler.on_event(event)  # first: its figures are the update's, the pause after
        if baton.on_event(event):  # paused, and ran model_probe: not the next update's CPU
            sampler.restart()

    async with TrainingRun(cfg, on_event=on_event) as run:
        baton.model = run.trainer.model if args.pause_at else None
        await run.train()
    return sampler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--mode", choices=("sync", "async"), default="sync")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (r=16)")
    p.add_argument(
        "--held",
        action="store_true",
        help="hold the policy (lr 1e-12): the same work per update throughout",
    )
    p.add_argument("--every", type=int, default=10, help="sample every N updates")
    p.add_argument("--warmup", type=int, default=20, help="updates left out of the slopes")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--batch-groups", type=int, default=2)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--default-arenas", action="store_true", help="glibc's arenas (baseline)")
    p.add_argument("--json", type=Path, help="also write the samples and slopes here")
    p.add_argument(
        "--vs-fresh",
        type=int,
        default=0,
        metavar="K",
        help="then K blocks of --block updates each at the run's end against a fresh "
        "run's, taking turns (_soak_fresh.py)",
    )
    p.add_argument("--block", type=int, default=5, help="updates per turn with --vs-fresh")
    p.add_argument("--pause-at", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.vs_fresh:
        from _soak_fresh import vs_fresh

        vs_fresh(args, sys.argv[1:])
        return
    if not args.default_arenas:
        from tether._memory import limit_arenas

        limit_arenas()  # as the tether command does, before any thread starts
    t0 = time.perf_counter()
    if args.out:  # a --vs-fresh worker: the driver removes it
        sampler = asyncio.run(soak(args, args.out))
    else:
        with tempfile.TemporaryDirectory(prefix="tether-soak-") as tmp:
            sampler = asyncio.run(soak(args, Path(tmp)))
    summary = report(sampler.rows, args.warmup)
    print_report(summary, args)
    print_drift(sampler.rows, args.warmup)
    print_threads(sampler.rows, args.warmup)
    first = sampler.types_first or Counter()
    grown = (sampler.types_last - first).most_common(8)
    print("object types that grew most:", ", ".join(f"{t} +{n}" for t, n in grown) or "none")
    print(f"wall: {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"samples": sampler.rows, "slopes": summary}, indent=1))


if __name__ == "__main__":
    main()
