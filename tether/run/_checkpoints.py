"""A run's checkpoints: a step's, written from the run's parts and recorded in its
store, and the one kept when a training process fails mid-update.

Loading one back (``--resume``) is :func:`tether.run._weights.restore`; which
checkpoint a resume continues from is ``_rundir.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tether.records import Checkpoint
from tether.trainer.checkpoint import checkpoint_state, save_checkpoint
from tether.trainer.errors import RankFailed

if TYPE_CHECKING:
    from tether.run._parts import RunParts

__all__ = ["rank_failed", "save_step"]


def save_step(parts: RunParts, folder: Path, step: int, keep: int) -> Path:
    """Write the checkpoint of ``step`` (``folder/step-{step:06d}``, keeping the run's
    newest ``keep``) from the run's ``parts``, and record it in the run's store."""
    path = save_checkpoint(
        folder,
        step,
        trainer=parts.model.trainer,
        tokenizer=parts.model.tokenizer,
        base_model_dir=parts.model.path,
        config=parts.records.config,
        keep=keep,
        run=parts.records.lineage,
        run_id=parts.records.run_record.id,
        policy_version=parts.model.engine.policy_version,
    )
    parts.records.store.add_checkpoint(
        Checkpoint(run_id=parts.records.run_record.id, step=step, path=str(path))
    )
    return path


def rank_failed(
    exc: RankFailed,
    parts: RunParts,
    step: int,
    last: Path | None,
    clean_steps: int,
    save: Callable[[int], Path],
) -> RankFailed:
    """A training process died or hung during update ``step``: keep a checkpoint of the
    last finished step (with ``save``, unless ``last`` is it), as rank 0's weights and
    optimizer are that step's unless an optimizer step of the failed update already ran
    (the trainer's count is past ``clean_steps``), and say how to go on. Sharded, rank 0
    alone cannot write one (the other shards went with their ranks): the line names the
    last one written."""
    exits = parts.ranks.exits() if parts.ranks else ""
    where = f"{exc}; {exits}" if exits else str(exc)
    ckpt, finished = last, step - 1
    done = ckpt is not None and ckpt.name == f"step-{finished:06d}"
    # sharded (trainer.strategy fsdp2), rank 0 holds 1/N of the weights: nothing to save alone
    alone = parts.model.trainer.root is None
    if not done and alone and parts.model.trainer.optimizer_steps == clean_steps:
        ckpt = save(finished)
    if ckpt is None:  # sharded, before the first checkpoint.every steps
        return RankFailed(f"{where}; no checkpoint yet: start the run again")
    kept = f"checkpoint of step {checkpoint_state(ckpt).get('step')}: {ckpt}"
    return RankFailed(f"{where}; {kept}; continue it with --resume")
