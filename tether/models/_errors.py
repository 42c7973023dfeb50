"""Errors of :mod:`tether.models`.

::

    TetherError
    └── ModelError           finding or loading a model failed
        └── ModelNotFound    a model is neither a local folder nor on the Hub (also a UserError)
"""

from __future__ import annotations

from tether.errors import TetherError, UserError

__all__ = ["ModelError", "ModelNotFound"]


class ModelError(TetherError):
    """Base of the model-loading errors."""


class ModelNotFound(ModelError, UserError):
    """``model.path`` / ``--model`` names no local folder and nothing the Hub can serve."""
