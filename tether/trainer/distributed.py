"""One policy update over several processes (torch.distributed): the trainer's side.

Rank 0 runs the whole run (gateway, engine, runners, store) and builds each
step's samples; ranks 1..N-1 only train (their loop is ``tether/run/_ranks.py``).
Per update:

1. rank 0 splits the trained samples across the ranks by token count
   (:func:`shard_by_tokens`, balanced) and sends every rank its shard together
   with the whole batch's :class:`~tether.trainer.algorithms.AggregateStats`;
2. each rank runs forward/backward over its own micro-batches with the loss
   normalised by the *whole batch's* counts (global token count for
   ``token_mean``, global rows for ``seq_mean``, each rollout's global token
   count for ``rollout_mean``, the global longest completion for
   ``seq_mean_token_sum_norm``), so the ranks' losses sum to the 1-process loss;
3. one all-reduce (SUM) of the gradients and of the metrics' sums: the
   all-reduce DDP makes, once per optimizer step, after local accumulation;
4. every rank clips and steps its own optimizer on the same summed gradient,
   so weights and optimizer state stay replicated (as with DDP). Rank 0 alone
   pushes the new weights to the engine and writes checkpoints.

Why not ``DistributedDataParallel`` itself (see docs/distributed.md): ranks
hold different numbers of micro-batches (token-balanced shards; a rank may
hold none), the shared-prefix forward calls the model twice per backward, and
the embedded engine decodes with rank 0's module; a hand-placed all-reduce per
step gives DDP's arithmetic without its one-forward-one-backward contract.

Two process groups. The *training* group (gloo on CPU, nccl on GPUs, set up
by ``accelerate``'s :class:`PartialState`) carries gradients and parameters;
every collective on it fails after ``trainer.collective_timeout_s``. The
*control* group (gloo) carries rank 0's commands; ranks 1.. wait on it for as
long as the rollouts take. A rank that dies closes its sockets, which ends
any wait on either group at once; one that hangs is caught by the timeout.
Any failed collective raises :class:`~tether.trainer.errors.RankFailed`.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tether.errors import UserError
from tether.trainer.errors import RankFailed

__all__ = ["Ranks", "join_ranks", "shard_by_tokens", "world_from_env"]

log = logging.getLogger(__name__)

#: The control group's wait for rank 0's next command (rollouts may take hours).
CONTROL_TIMEOUT = timedelta(days=7)
#: Elements per all-reduce bucket (≈100 MB of fp32).
BUCKET = 25_000_000


def shard_by_tokens(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Indices of ``lengths`` split into ``world`` shards of balanced token totals.

    Longest first, each to the shard with the fewest tokens so far (ties to the
    lowest rank): the greedy LPT rule, within the longest item of the optimum.
    Each shard keeps its indices in input order. Deterministic.
    """
    if world < 1:
        raise ValueError(f"world ({world}) must be >= 1")
    heap = [(0, r) for r in range(world)]
    shards: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        total, r = heapq.heappop(heap)
        shards[r].append(i)
        heapq.heappush(heap, (total + lengths[i], r))
    return [sorted(s) for s in shards]


def world_from_env() -> int:
    """``WORLD_SIZE`` as torchrun / ``accelerate launch`` / ``run.processes`` set it (1 if unset)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


@dataclass
class Ranks:
    """This process's place among the training ranks, and the collectives of an update."""

    rank: int
    world: int
    local_rank: int
    timeout_s: float
    control: Any = field(repr=False, default=None)  # the gloo group for commands
    #: What went wrong, once a collective failed; no collective is tried after that.
    failure: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def collective(self, what: str, *, mixed: bool = False) -> Iterator[None]:
        """Run collectives: a failed one (or any after a failure) raises :class:`RankFailed`
        naming ``what``. ``mixed``: the block also computes (a sharded forward and backward),
        so only a backend's error is taken for a peer's failure; others pass unchanged."""
        if self.failure is not None:
            raise RankFailed(self.failure)
        try:
            yield
        except Exception as exc:  # gloo/nccl report a dead or silent peer as RuntimeError & co
            if mixed and not _backend_error(exc):
                raise
            first = _first_line(exc)
            self.failure = (
                f"rank {self.rank} of {self.world}: {what} failed: another training process "
                f"exited or did not answer within trainer.collective_timeout_s "
                f"({self.timeout_s:g} s) ({first})"
            )
            raise RankFailed(self.failure) from exc

    # -- commands (rank 0 → every rank), on the control group -------------------------

    def send(self, command: tuple[Any, ...]) -> None:
        """Rank 0: broadcast ``command`` (a picklable tuple whose first item names it)."""
        with self.collective(f"sending {command[0]!r}"):
            dist.broadcast_object_list([command], src=0, group=self.control)

    def receive(self) -> tuple[Any, ...]:
        """Ranks 1..: wait (as long as it takes) for rank 0's next command."""
        box: list[Any] = [None]
        with self.collective("waiting for rank 0"):
            dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    # -- the update's collectives, on the training group -----------------------------

    def sync_from_main(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every rank: rank 0's parameters and optimizer state (a start or a resume)."""
        with self.collective("copying rank 0's weights"):
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
            box: list[Any] = [optimizer.state_dict() if self.is_main else None]
            dist.broadcast_object_list(box, src=0, group=self.control)
        if not self.is_main:
            optimizer.load_state_dict(box[0])

    def reduce_step(
        self,
        params: list[torch.nn.Parameter],
        sums: list[float],
        peak: float,
        device: torch.device | None = None,
    ) -> tuple[list[float], float]:
        """Sum every parameter's gradient and ``sums`` over the ranks, ``peak`` by max
        (on ``device``, by default the parameters' or the CPU).

        A parameter without a gradient on every rank keeps none (as in one
        process, where the optimizer then skips it); with one on any rank, the
        ranks without one add zeros. Sharded ranks (FSDP2 reduced the gradients
        already) pass no ``params``.
        """
        device = device or (params[0].device if params else torch.device("cpu"))
        with self.collective("the gradient all-reduce"):
            head = [float(p.grad is not None) for p in params]
            scalars = torch.tensor([*head, *sums], dtype=torch.float64, device=device)
            dist.all_reduce(scalars)
            top = torch.tensor([peak], dtype=torch.float64, device=device)
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            has = scalars[: len(params)].tolist()
            live = [p for p, h in zip(params, has, strict=True) if h > 0]
            for p in live:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            for bucket in _buckets(live):
                grads = [_grad(p) for p in bucket]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat)
                offset = 0
                for g in grads:
                    n = g.numel()
                    g.copy_(flat[offset : offset + n].view_as(g))
                    offset += n
        return scalars[len(params) :].tolist(), float(top.item())

    def close(self) -> None:
        """Leave the process groups (quietly: after a failure, peers may be gone)."""
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


#: What gloo and nccl say when a peer died or hung (they raise RuntimeError or DistError).
_BACKEND = re.compile(r"gloo|nccl|connection|timed out|timeout|peer|socket", re.IGNORECASE)


def _backend_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure rather than a local one (an OOM, a bug)."""
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and bool(_BACKEND.search(str(exc)))
    )


def _first_line(exc: BaseException) -> str:
    """The gist of a backend's error: its first line without gloo's ``[file.cc:123]`` tags."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"\[[^\]]*\]\s*", "", text).strip().split(". ")[0]
    return text[:200] or type(exc).__name__


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    """``p.grad``, which the caller made sure is set."""
    assert p.grad is not None, "every live parameter has a gradient by now"
    return p.grad


def _buckets(params: list[torch.nn.Parameter]) -> Iterator[list[torch.nn.Parameter]]:
    """Parameters in order, grouped by dtype into lists of at most :data:`BUCKET` elements."""
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        if bucket and (size + p.numel() > BUCKET or _grad(p).dtype != _grad(bucket[0]).dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel()
    if bucket:
        yield bucket


def _join_alone(timeout_s: float, *, cpu: bool) -> Ranks:
    """A process group of this process alone (accelerate makes none for one process)."""
    dist.init_process_group(
        backend="gloo" if cpu else "nccl",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=timeout_s),
    )
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Ranks(rank=0, world=1, local_rank=0, timeout_s=timeout_s, control=control)


def join_ranks(timeout_s: float, *, cpu: bool = True) -> Ranks:
    """Join the process group the environment describes (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun, ``accelerate launch`` and
    ``run.processes`` set them), through ``accelerate``: gloo on CPU, nccl on
    GPUs (``cpu`` False). Every collective of the training group times out after
    ``timeout_s``.
    """
    try:
        from accelerate import PartialState
    except ModuleNotFoundError as exc:
        raise UserError(
            "more than one training process needs accelerate: pip install 'tether[distributed]'"
        ) from exc

    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
    try:
        if world_from_env() == 1:  # a group of one (trainer.strategy fsdp2 alone)
            return _join_alone(timeout_s, cpu=cpu)
        state = PartialState(cpu=cpu, timeout=timedelta(seconds=timeout_s))
        if state.num_processes < 2 or not dist.is_initialized():
            raise RuntimeError(f"accelerate saw {state.num_processes} process, no process group")
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    except Exception as exc:
        first = _first_line(exc)
        raise RankFailed(
            f"could not join the {world_from_env()} training processes at "
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} ({first})"
        ) from exc
    ranks = Ranks(
        rank=state.process_index,
        world=state.num_processes,
        local_rank=state.local_process_index,
        timeout_s=timeout_s,
        control=control,
    )
    log.info("joined the training ranks: %s, backend %s", ranks, state.backend)
    return ranks
