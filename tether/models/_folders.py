"""Which model folder a local path names: a model folder, a checkpoint, or a run.

:func:`model_folder` accepts, wherever a model path is taken (``tether serve
--model``, ``model.path`` in a run config, ``tether eval --checkpoint``, ``tether demo
--model``):

- a model folder: one with ``config.json`` (``save_pretrained``'s), as it is;
- a checkpoint folder (``runs/NAME/checkpoints/step-NNNNNN``): its ``model/``;
- a run folder (``runs/NAME``): its newest checkpoint's ``model/``.

The checkpoint layout is recognised by its files (``model/config.json`` inside
``step-NNNNNN``), so this leaf needs nothing of :mod:`tether.trainer`. A model
folder whose ``config.json`` has no weights beside it is one line naming the
files it looks for (:func:`check_weights`), not a traceback from ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

from tether.models._errors import ModelNotFound

__all__ = ["WEIGHTS", "check_weights", "model_folder"]

#: The weight files ``from_pretrained`` loads (one file, a sharded index, or a peft adapter).
WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def _newest_checkpoint(run_dir: Path) -> Path | None:
    """The highest ``checkpoints/step-N`` with a ``model/config.json`` (unfinished
    ``*.tmp-*`` folders ignored)."""
    steps = sorted(
        p
        for p in (run_dir / "checkpoints").glob("step-*")
        if ".tmp-" not in p.name and (p / "model" / "config.json").is_file()
    )
    return steps[-1] if steps else None


def model_folder(path: Path) -> Path:
    """The model folder that the local folder ``path`` names (itself, a checkpoint's
    ``model/``, or a run's newest checkpoint's ``model/``); ``path`` itself when it is
    none of these (the caller says what is missing)."""
    if (path / "config.json").is_file():
        return path
    if (path / "model" / "config.json").is_file():  # a checkpoint folder
        return path / "model"
    if (path / "checkpoints").is_dir():  # a run folder
        newest = _newest_checkpoint(path)
        if newest is None:
            raise ModelNotFound(
                f"run folder {path} has no checkpoint yet: pass a model folder, or train "
                "the run until it saves one (checkpoint.every)"
            )
        return newest / "model"
    return path


def check_weights(folder: Path) -> None:
    """One line when a model folder has ``config.json`` but none of :data:`WEIGHTS`."""
    if any((folder / name).is_file() for name in WEIGHTS):
        return
    raise ModelNotFound(
        f"{folder} has config.json but no weights (model.safetensors, pytorch_model.bin or "
        "their sharded index): copy the weights in or point --model at the folder that has them"
    )
