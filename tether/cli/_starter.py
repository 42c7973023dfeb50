"""The starter model on first use: a one-time build that says what it is doing.

With an empty cache (``TETHER_CACHE``), ``tether serve``, ``tether train`` (``model.path:
starter``) and ``tether demo`` build the warm starter first: a tokenizer and an untrained
model (seconds), then a supervised warm-up of a few hundred to a few thousand steps.
:func:`starter_model` says so before it starts (:func:`building_line`: once, how long,
where it is cached) and prints the warm-up's progress every ``eval_every`` steps as
indented lines, instead of raw ``INFO tether.starter._warmup`` log records.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from tether.starter import Recipe

__all__ = ["building_line", "echo_logs", "starter_model"]

#: What a full warm-up took on the project's 2-core machine (the default recipe).
WARMUP_MINUTES = "6–8"


def building_line(folder: Path, max_steps: int, every: int) -> str:
    """What a cold start prints before the build."""
    return (
        f"building the starter model (once, about {WARMUP_MINUTES} minutes on 2 CPU cores; "
        f"cached in {folder.parent}): a tokenizer, then a supervised warm-up of up to "
        f"{max_steps} steps, a progress line every {every}"
    )


@contextlib.contextmanager
def echo_logs(name: str, console: Console) -> Iterator[None]:
    """Show logger ``name``'s INFO lines on ``console``, indented, for the duration (and
    not through the root handler: no ``INFO name:`` prefix, no line twice)."""

    class Echo(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            console.print(f"  {record.getMessage()}", highlight=False, markup=False)

    logger, handler = logging.getLogger(name), Echo(logging.INFO)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def starter_model(
    console: Console,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    recipe: Recipe | None = None,
) -> Path:
    """The warm starter's folder, built first (saying so) when it is not cached."""
    from tether.starter import Recipe, build_starter, is_starter, starter_path

    recipe = recipe or Recipe()
    folder = starter_path(cache_dir, warm=True, recipe=recipe)
    if is_starter(folder):
        return folder
    console.print(
        building_line(folder, recipe.warmup.max_steps, recipe.warmup.eval_every),
        highlight=False,
        soft_wrap=True,
    )
    with echo_logs("tether.starter", console):
        return Path(build_starter(cache_dir, warm=True, recipe=recipe))
