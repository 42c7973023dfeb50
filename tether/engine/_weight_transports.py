"""The trainer's side of a weight push to remote servers: files on disk, or a broadcast.

- :func:`save_full` writes full weights as a model folder a server can load
  (``model.safetensors`` plus the model's ``config.json`` and friends);
- :func:`save_adapter` writes a peft LoRA adapter folder (``adapter_model.safetensors``
  and ``adapter_config.json``) for the servers' runtime LoRA loading;
- :class:`BroadcastGroup` is rank 0 of a process group that the servers join (the
  ``nccl`` transport): a ``TCPStore`` served by the trainer and a process group built on
  it directly (``ProcessGroupNCCL`` on CUDA, ``ProcessGroupGloo`` for tensors on the CPU),
  never the global ``init_process_group`` a distributed trainer may already hold.

:func:`prune` keeps the newest folders of pushed weights and deletes the rest.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from tether.engine._server_api import TensorMeta

__all__ = ["BroadcastGroup", "prune", "save_adapter", "save_full", "tensor_metas"]

#: Files of a model folder that a server needs beside the weights (copied when present).
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def _unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each storage once (tied embeddings are cloned, as
    safetensors refuses two names over one storage)."""
    seen: set[int] = set()
    out = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def save_full(state_dict: Mapping[str, torch.Tensor], folder: Path, model_dir: Path | None) -> Path:
    """Write ``state_dict`` as a loadable model folder (the config files from ``model_dir``)."""
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(_unshared(state_dict), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in MODEL_FILES if model_dir else ():
        src = Path(model_dir) / name  # type: ignore[arg-type]
        if src.is_file():
            shutil.copy2(src, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # a server never sees a half-written folder
    return folder


def save_adapter(
    state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any], folder: Path
) -> Path:
    """Write a peft adapter folder: ``state_dict`` as peft saves it (``base_model.model.``
    names, no adapter name) and ``config`` (``LoraConfig.to_dict()``, JSON-safe)."""
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(_unshared(state_dict), str(tmp / "adapter_model.safetensors"))
    (tmp / "adapter_config.json").write_text(json.dumps(dict(config), indent=2, default=list))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def prune(root: Path, prefix: str, keep: int) -> None:
    """Delete all but the newest ``keep`` folders ``root/{prefix}{N}`` (by N)."""
    found = []
    for p in root.glob(f"{prefix}*"):
        tail = p.name[len(prefix) :]
        if p.is_dir() and tail.isdigit():
            found.append((int(tail), p))
    for _, p in sorted(found)[:-keep] if keep > 0 else sorted(found):
        shutil.rmtree(p, ignore_errors=True)


def tensor_metas(state_dict: Mapping[str, torch.Tensor]) -> list[TensorMeta]:
    """What the servers are told of each tensor, in broadcast order."""
    return [
        TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for name, t in state_dict.items()
    ]


class BroadcastGroup:
    """Rank 0 of the weight-broadcast group (see the module docstring), its process
    group built on the store under ``prefix`` when given (as the server's side is).

    :meth:`join` blocks until every server rank has joined (run it in a thread while the
    servers are told to join); :meth:`broadcast` sends tensors in order.
    """

    def __init__(
        self,
        address: str,
        port: int,
        world_size: int,
        *,
        backend: str,
        group_name: str,
        prefix: str | None = None,
        timeout_s: float = 300.0,
    ):
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"engine.nccl_backend ({backend!r}) must be nccl or gloo")
        self.address, self.port, self.world_size = address, port, world_size
        self.backend, self.group_name, self.prefix = backend, group_name, prefix
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._pg: Any = None
        self._store: Any = None

    def join(self) -> None:
        dist: Any = torch.distributed  # TCPStore and the process groups: not in its __all__

        self._store = dist.TCPStore(
            self.address,
            self.port,
            self.world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=self.timeout,
        )
        store = self._store if self.prefix is None else dist.PrefixStore(self.prefix, self._store)
        if self.backend == "gloo":
            self._pg = dist.ProcessGroupGloo(store, 0, self.world_size, self.timeout)
        else:
            self._pg = dist.ProcessGroupNCCL(store, 0, self.world_size)

    def broadcast(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Send every tensor (in ``state_dict``'s order) from rank 0 to all ranks."""
        dist: Any = torch.distributed

        if self._pg is None:
            raise RuntimeError("BroadcastGroup.broadcast before join")
        device = "cuda" if self.backend == "nccl" else "cpu"
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        for t in state_dict.values():
            self._pg.broadcast([t.detach().to(device).contiguous()], opts).wait()

    def close(self) -> None:
        self._pg = None
        self._store = None
