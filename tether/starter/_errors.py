"""Errors of :mod:`tether.starter`.

::

    TetherError
    └── StarterError         building the starter model failed
        └── CalcError        a calculator expression was refused (also a ValueError)

A model that cannot be found or loaded is :mod:`tether.models`' ``ModelNotFound``.
"""

from __future__ import annotations

from tether.errors import TetherError

__all__ = ["CalcError", "StarterError"]


class StarterError(TetherError):
    """Base of the starter package's errors."""


class CalcError(StarterError, ValueError):
    """``safe_eval`` refused an expression; the message says why."""
