"""Training processes: starting them, what rank 0 tells them, and what ranks 1.. do.

``run.processes: N`` (N > 1) makes the run's process rank 0 of N: it
picks a free loopback port, starts N − 1 copies of this module
(``python -m tether.run._ranks``) with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and ``LOCAL_RANK`` in their environment, and
joins them (``trainer/distributed.py``). Under torchrun or ``accelerate
launch`` the launcher starts every rank; each runs ``tether train``, and
every rank but 0 ends up in :func:`serve_rank` too.

The ranks it starts die with it: each asks the kernel for SIGKILL when its
parent goes (``PR_SET_PDEATHSIG``, Linux), and sits in its own session, so a
Ctrl-C at the terminal reaches only rank 0, which stops the run as it always
does (``tether/cli/_interrupt.py``) and then tells them to stop, or, if it is
forced out, takes them with it.

Rank 0 → the others, in order: ``hello`` (the model folder and the trainer's
config: they load the same model), ``sync`` (rank 0's weights and optimizer
state, after a resume too; not when sharded), then ``update`` per step
(``PolicyTrainer.update``) and finally ``stop``. Sharded (``trainer.strategy: fsdp2``),
rank 0 also sends ``gather`` (the full weights onto rank 0), ``save`` and ``load`` (a
checkpoint's shards), which every rank runs together.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tether.trainer import PolicyTrainer, RankFailed, TrainerConfig
from tether.trainer.distributed import Ranks, join_ranks, world_from_env

__all__ = ["RankGroup", "rank_from_env", "rank_main", "serve_rank"]

log = logging.getLogger(__name__)

TIMEOUT_ENV = "TETHER_COLLECTIVE_TIMEOUT_S"
DEVICE_ENV = "TETHER_RANK_DEVICE"
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
STOP_GRACE_S = 10.0  # how long a started rank may take to leave after "stop"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclasses.dataclass
class RankGroup:
    """Rank 0's view of the training processes: the process group and the ranks it started."""

    ranks: Ranks
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, processes: int, trainer: TrainerConfig, device: str) -> RankGroup | None:
        """Join (or start, then join) the training processes; None for one process.

        ``processes`` is ``run.processes``; ``device`` is the model's (``model.device``):
        cpu trains over gloo, cuda over nccl.
        """
        timeout, cpu = trainer.collective_timeout_s, device == "cpu"
        if world_from_env() > 1:  # torchrun / accelerate launch started every rank
            if processes not in (1, world_from_env()):
                log.warning(
                    "run.processes (%d) is ignored: the launcher started %d processes",
                    processes,
                    world_from_env(),
                )
            return cls(join_ranks(timeout, cpu=cpu))
        if processes <= 1 and not trainer.sharded:
            return None
        n = max(processes, 1)  # fsdp2 alone: a group of one (CPU offload on one GPU)
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n),
            TIMEOUT_ENV: str(timeout),
            DEVICE_ENV: device,
        }
        procs = []
        for rank in range(1, n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tether.run._rank_main"],
                    env={**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                    start_new_session=True,
                )
            )
        log.info("started %d training processes on port %s", n - 1, env["MASTER_PORT"])
        saved = {k: os.environ.get(k) for k in {*_DIST_ENV, *env}}
        os.environ.update({**env, "RANK": "0", "LOCAL_RANK": "0"})
        group = cls(Ranks(0, n, 0, timeout), procs)  # so that close() reaps them if joining fails
        try:
            group.ranks = join_ranks(timeout, cpu=cpu)
        except BaseException:
            group.close(clean=False)
            raise
        finally:  # the agents this process starts must not see a torch.distributed rank
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        return group

    def hello(self, trainer: PolicyTrainer, model_path: Path, train_dtype: str) -> None:
        """Tell the other ranks what to build: the same model and trainer as rank 0's."""
        info = {
            "model_path": str(model_path),
            "trainer": trainer.cfg,
            "device": trainer.device.type,
            "train_dtype": train_dtype,
            "pad_id": trainer.pad_id,
        }
        self.ranks.send(("hello", info))

    def sync(self, trainer: PolicyTrainer) -> None:
        """Every rank takes rank 0's weights and optimizer state (at the start, after a resume).

        Not when sharded (``trainer.strategy: fsdp2``): each rank built its shards from the
        same model folder and the same LoRA seed, and a resume loads every rank's own.
        """
        if trainer.root is not None:
            return
        self.ranks.send(("sync",))
        self.ranks.sync_from_main(trainer.model, trainer.optimizer)

    def exits(self) -> str:
        """How the started ranks ended so far, e.g. ``rank 1 was killed by SIGKILL``."""
        said = []
        for rank, p in enumerate(self.procs, start=1):
            code = p.poll()
            if code is not None and code < 0:
                said.append(f"rank {rank} was killed by {signal.Signals(-code).name}")
            elif code:
                said.append(f"rank {rank} exited with status {code}")
        return ", ".join(said)

    def close(self, clean: bool = True) -> None:
        """End the training processes and reap the ones started here.

        ``clean`` (the run ended normally): tell them to stop and give them
        :data:`STOP_GRACE_S`. Otherwise (a failure, an interrupt: a rank may be
        inside a collective that rank 0 left) kill the started ones at once; they
        hold nothing that is not in rank 0's checkpoints. Under a launcher, rank 0's
        exit makes it end the others.
        """
        if clean and self.ranks.failure is None and self.ranks.control is not None:
            with contextlib.suppress(RankFailed):
                self.ranks.send(("stop",))
        elif not clean:
            for p in self.procs:
                p.kill()
        self.ranks.close()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def rank_from_env() -> int:
    """This process's ``RANK`` under torchrun / ``accelerate launch`` (0 if unset)."""
    try:
        return int(os.environ.get("RANK", "0")) if world_from_env() > 1 else 0
    except ValueError:
        return 0


def serve_rank(timeout_s: float, device: str = "cpu") -> int:
    """Ranks 1..: build the trainer rank 0 describes, train on each update's share, return
    the exit status (0 after ``stop``; 1 with one line on stderr when a peer failed)."""
    try:
        ranks = join_ranks(timeout_s, cpu=device == "cpu")
    except RankFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        _serve(ranks)
        return 0
    except RankFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        ranks.close()


def _serve(ranks: Ranks) -> None:
    from tether.models import load_model

    trainer: PolicyTrainer | None = None
    while True:
        command = ranks.receive()
        if command[0] == "stop":
            return
        if command[0] == "hello":  # a new trainer (once per run; a test may send several)
            trainer = _build(ranks, command[1], load_model)
        elif trainer is None:
            raise RankFailed(f"rank {ranks.rank}: got {command[0]!r} from rank 0 before its hello")
        elif command[0] == "sync":
            ranks.sync_from_main(trainer.model, trainer.optimizer)
        elif command[0] == "update":
            _, parts, stats = command
            with contextlib.suppress(FloatingPointError):  # rank 0 reports it; same on every rank
                trainer.train_on(parts[ranks.rank], stats)
        elif command[0] == "gather":  # sharded: the full weights onto rank 0
            trainer.gather()
        elif command[0] == "save":  # sharded: every rank writes its shards
            trainer.save_sharded(Path(command[1]))
        elif command[0] == "load":
            trainer.load_sharded(Path(command[1]))
        else:
            raise RankFailed(f"rank {ranks.rank}: unknown command {command[0]!r} from rank 0")


def _build(ranks: Ranks, info: dict[str, Any], load_model: Any) -> PolicyTrainer:
    """The trainer rank 0's hello describes, on this rank's device."""
    cfg: TrainerConfig = info["trainer"]
    device = f"cuda:{ranks.local_rank}" if info["device"] == "cuda" else info["device"]
    torch.manual_seed(cfg.seed)
    where = "cpu" if cfg.sharded else device  # sharded: fully_shard moves the shards
    model = load_model(Path(info["model_path"]), dtype=torch.float32, device=where)
    return PolicyTrainer(
        model,
        cfg,
        device=device,
        train_dtype=info["train_dtype"],
        pad_id=info["pad_id"],
        ranks=ranks,
    )


def rank_main() -> None:
    """A started rank's process (``python -m tether.run._rank_main``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when the run stops
    logging.basicConfig(level=logging.WARNING, format=f"rank {os.environ.get('RANK')}: %(message)s")
    timeout = float(os.environ.get(TIMEOUT_ENV, "300"))
    sys.exit(serve_rank(timeout, os.environ.get(DEVICE_ENV, "cpu")))
