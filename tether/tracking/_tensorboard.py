"""``tether tensorboard``: TensorBoard's own command, also where setuptools has no pkg_resources.

TensorBoard 2.20 (the newest release that runs on protobuf 5.x, see
pyproject.toml) imports ``pkg_resources`` for two things: the plugins' entry
points and version parsing. setuptools 82 removed that module, so the plain
``tensorboard`` command fails with "No module named 'pkg_resources'" in a
fresh environment. :func:`run_tensorboard` gives it a stand-in built on
:mod:`importlib.metadata` when the real one is missing, then runs
TensorBoard's ``main`` with the given arguments (``--logdir runs/`` unless
one is given). With an older setuptools, or TensorBoard >= 2.21, the stand-in
is not used.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["pkg_resources_stand_in", "run_tensorboard"]


class _EntryPoint:
    def __init__(self, ep: importlib.metadata.EntryPoint):
        self._ep = ep
        self.name = ep.name

    def resolve(self) -> Any:
        return self._ep.load()

    load = resolve


def pkg_resources_stand_in() -> types.ModuleType:
    """The two ``pkg_resources`` functions TensorBoard 2.20 calls, on importlib.metadata."""
    from packaging.version import parse

    module = types.ModuleType("pkg_resources")
    module.iter_entry_points = lambda group, name=None: [  # type: ignore[attr-defined]
        _EntryPoint(ep)
        for ep in importlib.metadata.entry_points(group=group)
        if name is None or ep.name == name
    ]
    module.parse_version = parse  # type: ignore[attr-defined]
    return module


def run_tensorboard(args: Sequence[str]) -> int:
    """Run TensorBoard with ``args`` (plus ``--logdir runs`` when none is given)."""
    args = list(args)
    if not any(a == "--logdir" or a.startswith(("--logdir=", "--logdir_spec")) for a in args):
        args = ["--logdir", "runs", *args]
    if importlib.util.find_spec("pkg_resources") is None:
        sys.modules["pkg_resources"] = pkg_resources_stand_in()
    from tensorboard.main import run_main

    argv, sys.argv = sys.argv, ["tensorboard", *args]
    try:
        run_main()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = argv
    return 0
