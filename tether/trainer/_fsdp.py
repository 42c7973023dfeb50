"""``trainer.strategy: fsdp2``: the policy sharded across the training ranks.

With ``replicate`` (the default) every rank holds the whole model, its gradients
and its AdamW state (``distributed.py``). With ``fsdp2`` each rank holds 1/N of
each (PyTorch's ``fully_shard``, FSDP2): parameters are gathered a decoder layer
at a time for the forward and backward passes, and gradients are reduce-scattered
back to their owners, so parameters, gradients and optimizer state per rank fall as
1/N.

**Wrapping.** ``fully_shard`` goes on every decoder layer, then on :class:`ShardedPolicy`,
a root module around the whole (plain or peft) model whose forward is the trainer's
:func:`~tether.trainer._forward.forward_logprobs`. The root unit holds what the layers
leave: the embedding, the final norm and the LM head (tied or not), gathered once per
micro-batch and kept until its backward, however many times the chunked head or the
shared-prefix forward call them. Each layer's full weights are freed after its forward
and gathered again for its backward, except the last layer's, whose backward comes
first. This is how prime-rl wraps Hugging Face models (``setup_fsdp``: per decoder
layer, bf16 parameters with fp32 reduction, the last layer not resharded, then the
root); the root here is a module of our own because the trainer calls the decoder and
the head itself (chunked head).

**Every rank runs the same collectives.** A layer's all-gather and reduce-scatter are
collectives, so all ranks must run as many micro-batches, and the shared-prefix
forward (which runs every layer twice) on the same ones: :func:`agree` makes the
ranks agree on both, and a rank with fewer micro-batches runs an idle one
(``PolicyTrainer._idle_micro_batch``: two tokens, weight 0) for its collectives only.
The shared-prefix forward's KV cache carries gradients back into the prefix's layers
around FSDP2's backward hooks, which sit on each layer's output; ``_forward._hidden``
therefore adds the prefix's output × 0, so that the backward passes those hooks.

**Gradients are summed, not averaged** (``set_gradient_divide_factor(1.0)``, with a plain
SUM reduce-scatter, which gloo has and PREMUL_SUM it has not): the loss
of each rank is already divided by the whole batch's counts (``distributed.py``), so
the ranks' gradients add up to the one-process gradient.

**Weights for the engines** (:func:`gather_full`): every parameter is gathered in turn
and copied to rank 0's CPU memory (``get_model_state_dict(full_state_dict=True,
cpu_offload=True)``), so no rank ever holds more than one parameter's full tensor on
its device beyond its shards; rank 0 ends up with one CPU copy, as the embedded
engine already has.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tether.trainer._forward import forward_logprobs, split_head

__all__ = ["ShardedPolicy", "agree", "gather_full", "load_shards", "save_shards", "shard_policy"]

log = logging.getLogger(__name__)


class ShardedPolicy(nn.Module):
    """The FSDP2 root: the trainer's forward (decoder + chunked head) as one module call,
    so that the root unit's parameters are gathered once per micro-batch."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: torch.Tensor,
        *,
        cut: int,
        chunk_tokens: int,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return forward_logprobs(
            self.model,
            ids,
            attention_mask,
            temperature,
            cut=cut,
            chunk_tokens=chunk_tokens,
            entropy=entropy,
        )


def _layers(model: nn.Module) -> list[nn.Module]:
    parts = split_head(model)
    layers = getattr(parts[0], "layers", None) if parts else None
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(
            f"trainer.strategy=fsdp2 needs a transformers decoder with .layers "
            f"({type(model).__name__} has none): use trainer.strategy=replicate"
        )
    return list(layers)


def shard_policy(
    model: nn.Module, world: int, device: torch.device, *, bf16: bool, offload: bool
) -> ShardedPolicy:
    """``model`` sharded over the ``world`` ranks of the default process group: one FSDP2
    unit per decoder layer and a :class:`ShardedPolicy` root for the rest. On a GPU with
    ``bf16`` the layers compute in bf16 and reduce gradients in fp32 (the shards stay
    fp32); ``offload`` keeps parameters, gradients and optimizer state in CPU memory."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    # An explicit mesh of the model's device type (a CPU mesh on CPU: gloo), never a default.
    mesh = init_device_mesh(device.type, (world,))
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": mixed if bf16 else MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")
        if offload
        else OffloadPolicy(),
    }
    layers = _layers(model)
    for i, layer in enumerate(layers):  # the last layer's backward comes first: kept whole
        fully_shard(layer, reshard_after_forward=i < len(layers) - 1, **kwargs)
    root = ShardedPolicy(model)
    fully_shard(root, **kwargs)
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)  # a sum: each rank's loss is pre-divided
            unit.set_force_sum_reduction_for_comms(True)  # SUM, not PREMUL_SUM (gloo has none)
    return root


def agree(counts: int, prefix: Sequence[bool], device: torch.device) -> tuple[int, list[bool]]:
    """The micro-batch count every rank runs (the largest) and, per micro-batch index,
    whether every rank may use the shared-prefix forward there (only where all do)."""
    n = torch.tensor([counts], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    total = int(n.item())
    flags = torch.zeros(max(total, 1), dtype=torch.int64, device=device)
    flags[: len(prefix)] = torch.tensor([int(p) for p in prefix], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return total, [bool(f) for f in flags.tolist()[:total]]


def gather_full(root: ShardedPolicy, *, main: bool) -> dict[str, torch.Tensor]:
    """Every rank: the full weights of ``root``'s model, gathered a parameter at a time;
    rank 0 (``main``) gets them on the CPU under the model's own names, the others ``{}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(root, options=options)
    if not main:
        return {}
    return {k.removeprefix("model."): v for k, v in full.items() if isinstance(v, torch.Tensor)}


def save_shards(root: ShardedPolicy, optimizer: torch.optim.Optimizer, path: Any) -> None:
    """Every rank: its shards of the weights and of the optimizer state into the folder
    ``path`` (``torch.distributed.checkpoint``: one file per rank plus the metadata that
    lets any world size load it back)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    model, optim = get_state_dict(root, optimizer)
    save({"model": model, "optim": optim}, checkpoint_id=str(path))


def load_shards(root: ShardedPolicy, optimizer: torch.optim.Optimizer, path: Any) -> None:
    """Every rank: :func:`save_shards`' folder back into ``root`` and ``optimizer``,
    resharded to this world size."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    model, optim = get_state_dict(root, optimizer)
    state = {"model": model, "optim": optim}
    load(state, checkpoint_id=str(path))
    set_state_dict(
        root, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
