"""Checkpoints: written to a temporary name, fsynced, then renamed.

A checkpoint folder ``step-000010/`` holds

- ``model/``      the policy as ``save_pretrained`` writes it (LoRA merged) plus
                  its tokenizer: ``tether serve --model .../model`` serves it;
- ``adapters/``   with roles that have their own LoRA adapter: every adapter as
                  peft's ``save_pretrained`` writes them (the policy's ``default``
                  at the top, each role's in ``adapters/{role}/``);
- ``trainer.pt``  trainable weights (every adapter), optimizer state and RNG states — what
                  resuming needs to continue exactly as if never stopped; with
                  ``trainer.strategy: fsdp2`` only the step and RNG states, and
- ``sharded/``    (fsdp2) every rank's shards of the weights and of the optimizer state
                  (``torch.distributed.checkpoint``), loadable at any number of ranks;
                  ``model/`` is then the full model gathered onto rank 0;
- ``state.json``  the step, the engine's policy version, the run it belongs to
                  (``run``: the id of the run's first record, the same across
                  ``--resume``; ``run_id``: the record that wrote it) and the
                  run's config (secret-named values redacted).

Pruning (``keep``) only ever removes checkpoints of the same ``run``: another
run's checkpoint in the same folder, or one without a ``run`` (written before
tether recorded it), is never deleted.

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
from typing import TYPE_CHECKING, Any

import torch

from tether._hf import merged_weights
from tether.errors import UserError
from tether.store import redact_secrets
from tether.trainer.errors import CheckpointConflict

if TYPE_CHECKING:
    from tether.trainer._update import PolicyTrainer

__all__ = [
    "checkpoint_state",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
]


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
    trainer: PolicyTrainer,
    tokenizer: Any,
    base_model_dir: Path | None,
    config: dict[str, Any],
    keep: int = 2,
    run: str | None = None,
    run_id: str | None = None,
    policy_version: int | None = None,
) -> Path:
    """Write ``directory/step-{step:06d}`` atomically and keep run ``run``'s newest ``keep``.

    Refuses (:class:`CheckpointConflict`) to replace another run's checkpoint of the same step.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:06d}"
    if final.is_dir() and checkpoint_state(final).get("run") not in (None, run):
        raise CheckpointConflict(
            f"{final} belongs to another run ({checkpoint_state(final)['run']}): "
            "give this run its own name, or continue that one with --resume"
        )
    for stale in directory.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"step-{step:06d}.tmp-", dir=directory))
    rng = {"step": step, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    sharded = trainer.root is not None  # trainer.strategy fsdp2
    _save_model(tmp / "model", trainer, trainer.full_weights() if sharded else None)
    if sharded:
        trainer.save_sharded(tmp / "sharded")
        torch.save(rng, tmp / "trainer.pt")
    else:
        if trainer.adapters:  # roles with their own adapter: every adapter
            peft_model: Any = trainer.model
            peft_model.save_pretrained(tmp / "adapters", safe_serialization=True)
        optimizer = trainer.optimizer.state_dict()
        torch.save(
            {**rng, "model": trainer.model.state_dict(), "optimizer": optimizer}, tmp / "trainer.pt"
        )
    tokenizer.save_pretrained(tmp / "model")
    if base_model_dir is not None:
        for marker in ("tether_starter.json",):
            if (base_model_dir / marker).exists():
                shutil.copy2(base_model_dir / marker, tmp / "model" / marker)
    (tmp / "state.json").write_text(
        json.dumps(
            {
                "step": step,
                "run": run,
                "run_id": run_id,
                "policy_version": policy_version,
                "config": redact_secrets(config),
            },
            indent=2,
            default=str,
        )
    )
    _fsync_tree(tmp)
    old = None
    if final.exists():  # moved aside, not deleted in place: a crash never leaves half a folder
        old = Path(tempfile.mkdtemp(prefix=f"step-{step:06d}.tmp-old-", dir=directory))
        os.replace(final, old / final.name)
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    prune_checkpoints(directory, run, keep)
    return final


def _save_model(folder: Path, trainer: PolicyTrainer, weights: dict[str, Any] | None) -> None:
    """The policy as ``save_pretrained`` writes it, LoRA merged (tensor by tensor, no copy
    of the model): from ``weights`` (an FSDP2 trainer's, gathered onto rank 0) or the
    trainer's own."""
    model: Any = trainer.model  # a transformers (or peft) model
    own: dict[str, Any] = model.state_dict() if weights is None else weights
    if trainer.cfg.lora is not None:
        own, model = merged_weights(model, own), model.get_base_model()
    save: Any = model.save_pretrained  # a transformers model's method
    save(folder, state_dict=own, safe_serialization=True)


def _complete(directory: Path) -> list[Path]:
    """The finished checkpoint folders in ``directory``, by step."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("step-*") if p.is_dir() and ".tmp-" not in p.name)


def prune_checkpoints(directory: Path, run: str | None, keep: int) -> list[Path]:
    """Delete run ``run``'s checkpoints but its newest ``keep``; return what was deleted.

    Only folders whose ``state.json`` names ``run`` count: another run's checkpoints, and
    any without a recorded run, are left alone. ``keep`` <= 0 or ``run`` None deletes nothing.
    """
    if keep <= 0 or run is None:
        return []
    mine = [p for p in _complete(directory) if checkpoint_state(p).get("run") == run]
    gone = mine[:-keep]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint with the highest step in ``directory`` (temporary folders ignored)."""
    done = _complete(directory)
    return done[-1] if done else None


def checkpoint_state(path: Path) -> dict[str, Any]:
    """A checkpoint's ``state.json`` (``{}`` when missing or unreadable)."""
    try:
        state = json.loads((Path(path) / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def load_checkpoint(path: Path, trainer: PolicyTrainer) -> int:
    """Restore weights, optimizer and RNG states into ``trainer``; return the step.

    Loads with ``weights_only=True``: a checkpoint holds tensors and plain
    values only, so a tampered file cannot run code. An FSDP2 trainer loads the
    ``sharded/`` folder on every rank, resharded to the current number of processes.
    """
    state = torch.load(path / "trainer.pt", weights_only=True)
    sharded = (path / "sharded").is_dir()
    if trainer.root is not None:
        if not sharded:
            raise UserError(
                f"{path} holds one process's weights (trainer.strategy=replicate): resume it "
                "with trainer.strategy=replicate, or start a new run from its model/ folder"
            )
        trainer.load_sharded(path / "sharded")
    elif sharded:
        raise UserError(
            f"{path} holds FSDP2 shards: resume it with trainer.strategy=fsdp2 and "
            f"run.processes >= 2, or start a new run from {path / 'model'} (model.path=...)"
        )
    else:
        _load_whole(path, state, trainer)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def _load_whole(path: Path, state: dict[str, Any], trainer: PolicyTrainer) -> None:
    extra = sorted(set(state["model"]) ^ set(trainer.model.state_dict()))
    if extra:
        raise UserError(
            f"{path} does not fit this run's model ({len(extra)} weights differ, e.g. "
            f"{extra[0]}): resume with the config it was written with (trainer.lora, roles)"
        )
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
