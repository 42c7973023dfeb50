"""The trainer's weights to the engine (by the engine's ``weight_push``, which picks what
it sends), and a checkpoint's weights back into the trainer and the engine (``--resume``).

The run pushes after every update (``_loop.py``), and once at the start to a remote
engine that must serve the trainer's starting weights (``_parts.py``).
"""

from __future__ import annotations

from typing import Any

from tether.engine import Engine
from tether.run._rundir import ResumePoint
from tether.trainer.checkpoint import load_checkpoint
from tether.trainer.errors import TrainerError

__all__ = ["push_update", "restore"]


async def push_update(trainer: Any, engine: Engine) -> int:
    """Push an update's weights to ``engine``: its new policy version, which must be the
    one before + 1 (:class:`TrainerError` otherwise)."""
    before = engine.policy_version
    version = await engine.weight_push.push(trainer)
    if version != before + 1:
        raise TrainerError(f"engine policy version went {before} -> {version}, expected +1")
    return version


async def restore(trainer: Any, engine: Engine, at: ResumePoint) -> tuple[int, int]:
    """Load checkpoint ``at`` into ``trainer`` and push it to ``engine`` at the checkpoint's
    policy version (when it names one): the checkpoint's step and the engine's version."""
    step = load_checkpoint(at.path, trainer)
    version = await engine.weight_push.push(trainer, version=at.policy_version)
    return step, version
