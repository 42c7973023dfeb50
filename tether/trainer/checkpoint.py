"""Checkpoints: written to a temporary name, fsynced, then renamed.

A checkpoint folder ``step-000010/`` holds

- ``model/``      the policy as ``save_pretrained`` writes it (LoRA merged) plus
                  its tokenizer: ``tether serve --model .../model`` serves it;
- ``trainer.pt``  trainable weights, optimizer state and RNG states — what
                  resuming needs to continue exactly as if never stopped;
- ``state.json``  the step and the run's config.

A crash mid-write leaves only a ``*.tmp-*`` folder, which is ignored and
removed by the next save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(
    directory: Path,
    step: int,
    *,
    trainer: Any,
    tokenizer: Any,
    base_model_dir: Path | None,
    config: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write ``directory/step-{step:06d}`` atomically and keep the newest ``keep``."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = directory / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f"step-{step:06d}.tmp-", dir=directory))
    model = trainer.model
    if trainer.cfg.lora is not None:
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    if base_model_dir is not None:
        for marker in ("tether_starter.json",):
            if (base_model_dir / marker).exists():
                shutil.copy2(base_model_dir / marker, tmp / "model" / marker)
    torch.save(
        {
            "step": step,
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        },
        tmp / "trainer.pt",
    )
    (tmp / "state.json").write_text(
        json.dumps({"step": step, "config": config}, indent=2, default=str)
    )
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    done = sorted(p for p in directory.glob("step-*") if p.is_dir() and ".tmp-" not in p.name)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    if not directory.is_dir():
        return None
    done = sorted(p for p in directory.glob("step-*") if p.is_dir() and ".tmp-" not in p.name)
    return done[-1] if done else None


def load_checkpoint(path: Path, trainer: Any) -> int:
    """Restore weights, optimizer and RNG states into ``trainer``; return the step."""
    state = torch.load(path / "trainer.pt", weights_only=False)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])
