"""Per-rank memory and seconds per update of ``trainer.strategy: fsdp2`` against
``replicate``, at 1, 2 and 4 training processes (gloo, CPU), in one run.

A randomly initialised model of Qwen2.5-0.5B's shape (``_shapes.py``; ``--layers`` of its
24 decoder layers, the real 151,936-token tied embedding) is saved to a temporary folder
(config + safetensors: all ``tether.models.load_model`` needs). For each process count,
``replicate`` and then ``fsdp2`` each run in fresh processes: this script, started once
per rank with the launcher's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_*``, as
torchrun sets it), ``OMP_NUM_THREADS=1``. Rank 0 joins through ``RankGroup.start`` and
drives the update as a training run does; ranks 1.. run ``serve_rank``. The update:
full fine-tuning with AdamW, ``logprob_chunk_tokens`` 128, gradient checkpointing, on
``--rows`` × ``--tokens`` random tokens (``random_samples``), one warm-up update and then
``--updates`` timed ones, each followed by ``trainer.state_dict()`` as the run's push.

Per rank:

- **held MiB**: bytes of parameters, gradients and AdamW state on that rank, the sum of
  local sizes (``DTensor.to_local()`` for a shard), taken by a global optimizer step hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) right after the step,
  before the gradients are dropped;
- **peak GiB**: the kernel's peak resident memory of the rank's process (``VmHWM``) during
  each update, reset to the current RSS just before it (``/proc/PID/clear_refs`` 5, Linux):
  per update, not per process lifetime; the largest of the timed updates (**RSS before**:
  the median RSS just before them);
- **s/update** (rank 0): the median timed ``trainer.update``; sharded, that includes the
  gather of the full weights onto rank 0 at its end (**gather s**: from the last optimizer
  step to the return).

Then the **weight push**: one more ``trainer.state_dict()`` after the updates (sharded: a
fresh gather of the full weights onto rank 0's CPU; replicated: a CPU copy), its seconds
and rank 0's peak resident memory during it beyond its RSS just before it.

The defaults (2 layers, 4 × 64 tokens) fit a shared 2-core, 24 GB machine in ~10 minutes:
4 replicated ranks of the whole 24-layer model would need ~4 × 9 GiB, and one update of
it on one core several minutes. A configuration whose estimated peak does not fit
MemAvailable less ``--headroom-gib`` is not run; a watchdog kills the ranks if
MemAvailable falls below half the headroom.

    .venv/bin/python benchmarks/fsdp2_memory.py [--processes 1 2 4] [--layers 2]
        [--rows 4] [--tokens 64] [--updates 3] [--headroom-gib 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from _shapes import SHAPES, quiet_torchao, random_model, random_samples  # the script's folder

GIB, MIB = 2**30, 2**20
ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("replicate", "fsdp2")
TIMEOUT_S = 1800.0  # collectives: 4 ranks on 2 shared cores are slow
PIDS_ENV = "FSDP2_BENCH_PIDS"  # rank 0: the other ranks' process ids
FULL = 494_032_768  # Qwen2.5-0.5B's parameters (24 layers, the embedding counted once)

# -- measuring, in a rank ------------------------------------------------------------------


def _local_bytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def held_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the optimizer's parameters, their gradients and its state on this rank."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [v for p in params for v in optimizer.state.get(p, {}).values()]
    return {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "adamw": sum(_local_bytes(v) for v in state if isinstance(v, torch.Tensor)),
    }


class StepWatch:
    """A global optimizer step post-hook: when the last step ended, and what the rank
    held then (written to ``path``)."""

    def __init__(self, path: Path):
        self.path, self.at = path, 0.0

    def __call__(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.at = time.monotonic()
        self.path.write_text(json.dumps(held_bytes(optimizer)))


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def rss(pid: int, field: str = "VmRSS") -> float:
    """GiB resident now (``VmHWM``: the peak since the last :func:`reset_peak`)."""
    return _status_kib(pid, field) / 2**20


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _timed_update(trainer: Any, samples: list[Any], pids: list[int], watch: StepWatch) -> dict:
    gc.collect()
    before = [rss(p) for p in pids]
    for p in pids:
        reset_peak(p)
    t0 = time.monotonic()
    trainer.update(samples)
    t1 = time.monotonic()
    peaks = [rss(p, "VmHWM") for p in pids]
    trainer.state_dict()  # the run's push after an update (sharded: the copy just gathered)
    return {"s": t1 - t0, "gather_s": t1 - watch.at, "before": before, "peak": peaks}


def _timed_push(trainer: Any) -> dict:
    gc.collect()
    me = os.getpid()
    before = rss(me)
    reset_peak(me)
    t0 = time.monotonic()
    full = trainer.state_dict()
    seconds = time.monotonic() - t0
    size = sum(v.numel() * v.element_size() for v in full.values())
    return {"s": seconds, "before": before, "extra": rss(me, "VmHWM") - before, "gib": size / GIB}


def _drive(args: argparse.Namespace, watch: StepWatch) -> dict:
    """Rank 0: join the ranks, build the trainer, time the updates and the push."""
    from tether.models import load_model
    from tether.run import RankGroup
    from tether.trainer import PolicyTrainer, TrainerConfig

    cfg = TrainerConfig(
        strategy=args.strategy,
        logprob_chunk_tokens=128,
        gradient_checkpointing=True,
        collective_timeout_s=TIMEOUT_S,
    )
    group = RankGroup.start(args.world, cfg, "cpu")
    try:
        model = load_model(Path(args.model), dtype=torch.float32)
        trainer = PolicyTrainer(model, cfg, ranks=group.ranks if group else None)
        if group is not None:
            group.hello(trainer, Path(args.model), "float32")
            group.sync(trainer)
        del model
        pids = [os.getpid(), *map(int, filter(None, os.environ.get(PIDS_ENV, "").split(",")))]
        samples = random_samples(args.rows, args.tokens, SHAPES["qwen2.5-0.5b"]["vocab_size"])
        updates = [_timed_update(trainer, samples, pids, watch) for _ in range(1 + args.updates)]
        push = _timed_push(trainer)
        sharded = trainer.root is not None
    finally:
        if group is not None:
            group.close()
    return {"updates": updates[1:], "push": push, "sharded": sharded}


def _rank(args: argparse.Namespace) -> None:
    """One training process (started by :func:`_run_world`)."""
    quiet_torchao()
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    watch = StepWatch(out / f"held{rank}.json")
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(watch)
    if rank:
        from tether.run import serve_rank

        sys.exit(serve_rank(TIMEOUT_S, "cpu"))
    (out / "main.json").write_text(json.dumps(_drive(args, watch)))


# -- the parent: one world of processes per (processes, strategy) ------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch(procs: list[subprocess.Popen], floor_gib: float, killed: list[float]) -> None:
    import psutil

    while any(p.poll() is None for p in procs):
        free = psutil.virtual_memory().available / GIB
        if free < floor_gib:
            killed.append(free)
            for p in procs:
                p.kill()
            return
        time.sleep(0.2)


def _run_world(args: argparse.Namespace, strategy: str, world: int, model: Path) -> dict:
    """Start ``world`` ranks (ranks 1.. first, so that rank 0 knows their pids); their
    figures, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix=f"fsdp2-bench-{strategy}-{world}-") as tmp:
        out = Path(tmp)
        cmd = [
            sys.executable, __file__, "--rank", "--out", tmp, "--model", str(model),
            "--strategy", strategy, "--world", str(world), "--rows", str(args.rows),
            "--tokens", str(args.tokens), "--updates", str(args.updates),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        if world > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
            env.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        procs: list[subprocess.Popen] = []
        for rank in [*range(1, world), 0]:
            extra = {"RANK": str(rank), "LOCAL_RANK": str(rank)} if world > 1 else {}
            if rank == 0:
                extra[PIDS_ENV] = ",".join(str(p.pid) for p in procs)
            with open(out / f"stderr{rank}.txt", "w") as err:
                procs.append(subprocess.Popen(cmd, env={**env, **extra}, stderr=err))
        killed: list[float] = []
        threading.Thread(target=_watch, args=(procs, args.headroom_gib / 2, killed)).start()
        codes = [p.wait() for p in procs]
        if killed:
            return {"error": f"killed: MemAvailable fell to {killed[0]:.1f} GiB"}
        if not (out / "main.json").exists():
            tail = (out / "stderr0.txt").read_text().strip().splitlines() or ["no output"]
            return {"error": f"failed (exit {codes}): {tail[-1][:160]}"}
        result = json.loads((out / "main.json").read_text())
        result["held"] = [json.loads((out / f"held{r}.json").read_text()) for r in range(world)]
        return result


# -- the parent: planning and printing -----------------------------------------------------


def estimate_gib(params: int, strategy: str, world: int) -> float:
    """The world's peak: 16 B/param per replica (1/N sharded, plus the full model each rank
    loads first), a full copy for the push, ~1.2 GiB a process (imports, activations)."""
    state = 16 * params / (world if strategy == "fsdp2" and world > 1 else 1)
    load = 4 * params if strategy == "fsdp2" and world > 1 else 0
    return (world * (state + load) + 4 * params) / GIB + 1.2 * world


def _available_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / GIB


HEAD = (
    f"{'procs':>5} {'strategy':9} {'rank':>4} {'params MiB':>10} {'grads MiB':>9} "
    f"{'AdamW MiB':>9} {'held MiB':>9} {'vs 1 proc':>9} {'RSS before':>10} {'peak GiB':>8} "
    f"{'s/update':>8} {'gather s':>8}"
)


def print_world(world: int, strategy: str, r: dict, one_proc_held: float | None) -> float:
    """The world's rows, one per rank; returns rank 0's held bytes."""
    for rank, held in enumerate(r["held"]):
        total = sum(held.values())
        ratio = f"{total / one_proc_held:9.3f}" if one_proc_held else f"{'':>9}"
        before = statistics.median(u["before"][rank] for u in r["updates"])
        top = max(u["peak"][rank] for u in r["updates"])
        timing = ""
        if rank == 0:
            secs = statistics.median(u["s"] for u in r["updates"])
            gather = statistics.median(u["gather_s"] for u in r["updates"])
            timing = f"{secs:8.2f} {gather:8.2f}"
        print(
            f"{world:>5} {strategy:9} {rank:>4} {held['params'] / MIB:10.1f} "
            f"{held['grads'] / MIB:9.1f} {held['adamw'] / MIB:9.1f} {total / MIB:9.1f} "
            f"{ratio} {before:10.2f} {top:8.2f} {timing}",
            flush=True,
        )
    return sum(r["held"][0].values())


def print_pushes(pushes: list[tuple[int, str, dict]]) -> None:
    print("\nweight push onto rank 0 (one more trainer.state_dict() after the updates)")
    print(f"{'procs':>5} {'strategy':9} {'push s':>7} {'RSS before':>10} {'peak beyond':>11} "
          f"{'full weights GiB':>16}")  # fmt: skip
    for world, strategy, p in pushes:
        print(
            f"{world:>5} {strategy:9} {p['s']:7.2f} {p['before']:10.2f} {p['extra']:11.2f} "
            f"{p['gib']:16.2f}"
        )


def _model_folder(layers: int, where: Path) -> tuple[int, int]:
    """Write the model to ``where``; (its parameters, of which the tied embedding)."""
    model = random_model("qwen2.5-0.5b", "cpu", num_hidden_layers=layers)
    model.save_pretrained(where)
    counts = sum(p.numel() for p in model.parameters()), model.get_input_embeddings().weight
    del model
    gc.collect()
    return counts[0], counts[1].numel()


def _largest(r: dict, key: str) -> float:
    return max(max(u[key]) for u in r["updates"])


def print_summary(done: dict[tuple[int, str], dict]) -> None:
    """fsdp2 against replicate (the baseline) at each process count both ran at."""
    print("\nfsdp2 / replicate, same process count (held and peak: the largest rank)")
    for world in sorted({w for w, _ in done}):
        rep, sh = done.get((world, "replicate")), done.get((world, "fsdp2"))
        if rep is None or sh is None:
            continue
        held = [max(sum(h.values()) for h in r["held"]) for r in (rep, sh)]
        peaks = [_largest(r, "peak") for r in (rep, sh)]
        secs = [statistics.median(u["s"] for u in r["updates"]) for r in (rep, sh)]
        print(
            f"{world} processes: held {held[1] / held[0]:.3f}x (ideal 1/N = {1 / world:.3f}); "
            f"peak RSS {peaks[1] / peaks[0]:.2f}x ({peaks[0]:.2f} -> {peaks[1]:.2f} GiB); "
            f"s/update {secs[1] / secs[0]:.2f}x ({secs[0]:.2f} -> {secs[1]:.2f} s)"
        )


def run_all(args: argparse.Namespace, folder: Path, params: int) -> dict[tuple[int, str], dict]:
    """Each process count, replicate then fsdp2, printed as they finish."""
    print(HEAD, flush=True)
    done: dict[tuple[int, str], dict] = {}
    one_proc: float | None = None
    for world in args.processes:
        for strategy in STRATEGIES:
            need = estimate_gib(params, strategy, world)
            if need > _available_gib() - args.headroom_gib:
                print(f"{world:>5} {strategy:9} not run: needs ~{need:.1f} GiB", flush=True)
                continue
            r = _run_world(args, strategy, world, folder)
            if "error" in r:
                print(f"{world:>5} {strategy:9} {r['error']}", flush=True)
                continue
            r["label"] = strategy + ("*" if strategy == "fsdp2" and not r["sharded"] else "")
            held = print_world(world, r["label"], r, one_proc)
            one_proc = one_proc or (held if world == 1 else None)
            done[(world, strategy)] = r
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the 24 (2)")
    ap.add_argument("--rows", type=int, default=4, help="sequences per update (4)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per sequence (64)")
    ap.add_argument("--updates", type=int, default=3, help="timed updates after 1 warm-up")
    ap.add_argument("--headroom-gib", type=float, default=2.0)
    for name in ("--out", "--model", "--strategy"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return _rank(args)
    quiet_torchao()
    with tempfile.TemporaryDirectory(prefix="fsdp2-bench-model-") as tmp:
        params, embedding = _model_folder(args.layers, Path(tmp))
        print(
            f"trainer.strategy fsdp2 vs replicate: the Qwen2.5-0.5B shape with {args.layers} of "
            f"its 24 decoder layers ({params / 1e6:.0f}M parameters, {embedding / 1e6:.0f}M of "
            f"them the tied embedding), random fp32 weights; full fine-tuning, AdamW, "
            f"logprob_chunk_tokens 128, gradient checkpointing; {args.rows} x {args.tokens} "
            f"tokens per update; {args.updates} timed updates after 1 warm-up; gloo, "
            f"{os.cpu_count()} CPUs, OMP_NUM_THREADS=1 per rank, torch {torch.__version__}"
        )
        print(
            "(fewer layers and tokens than the issue's 24 layers and 4 x 512, so that 4 "
            "replicated ranks fit this machine's memory and the run takes ~10 min: all 24 "
            f"layers are {FULL / 1e6:.0f}M parameters, {16 * FULL / GIB:.1f} GiB of weights, "
            f"gradients and AdamW state per replicated rank; load {os.getloadavg()[0]:.1f}, "
            f"available {_available_gib():.1f} GiB)\n"
        )
        done = run_all(args, Path(tmp), params)
    print_pushes([(w, r["label"], r["push"]) for (w, _), r in done.items()])
    print_summary(done)
    print(
        "\n* not sharded: tether shards only with several processes (one process holds the "
        f"whole model either way).\nload {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
