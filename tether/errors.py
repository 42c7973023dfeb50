"""The root of tether's exception tree.

Every package defines its own base that derives from :class:`TetherError`,
so a caller can catch everything tether raises with one ``except``::

    TetherError
    ├── UserError            a mistake in what the user gave (config, CLI, input)
    ├── store.StoreError     (tether.store)
    ├── engine.EngineError   (tether.engine)
    ├── chat.ChatError       (tether.chat)
    ├── runner.RunnerError   (tether.runner)
    └── trainer.TrainerError (tether.trainer)

HTTP status codes are chosen only in :mod:`tether.gateway`; the CLI turns any
:class:`TetherError` into one readable line.
"""

from __future__ import annotations

__all__ = ["TetherError", "UserError"]


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class UserError(TetherError, ValueError):
    """Something the user gave is wrong; the message names the value, the rule and the fix."""
