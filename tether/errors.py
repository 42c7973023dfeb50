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
:class:`TetherError` into one readable line, and its class into the exit status
(``tether.cli._app.exit_status``): 2 for a :class:`UserError` (the config, a flag, a
missing file: what click exits with for a bad flag), 1 for any other error (a runtime
failure: every rollout failed, the engine went away). A package's error that is the
user's mistake derives from :class:`UserError` too (``ModelNotFound``, ``AgentLoadError``).
"""

from __future__ import annotations

import signal

__all__ = ["Interrupted", "TetherError", "UserError"]


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class UserError(TetherError, ValueError):
    """Something the user gave is wrong; the message names the value, the rule and the fix."""


class Interrupted(BaseException):
    """The command was stopped by a signal. A BaseException, like ``KeyboardInterrupt``,
    so that no ``except Exception`` on the way out swallows it. Raised by the CLI's
    ``tether.cli._interrupt.Interrupts``; defined here so that :mod:`tether.run` can name it
    without importing the CLI layer."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
