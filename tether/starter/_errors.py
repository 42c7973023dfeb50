"""Errors of :mod:`tether.starter`.

::

    TetherError
    └── StarterError         building or loading the starter model failed
        ├── CalcError        a calculator expression was refused (also a ValueError)
        └── ModelNotFound    a model is neither a local folder nor on the Hub (also a UserError)
"""

from __future__ import annotations

from tether.errors import TetherError, UserError

__all__ = ["CalcError", "ModelNotFound", "StarterError"]


class StarterError(TetherError):
    """Base of the starter package's errors."""


class CalcError(StarterError, ValueError):
    """``safe_eval`` refused an expression; the message says why."""


class ModelNotFound(StarterError, UserError):
    """``model.path`` / ``--model`` names no local folder and nothing the Hub can serve."""
