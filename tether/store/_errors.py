"""The store's errors.

::

    TetherError                          (tether.errors)
    └── StoreError                       the store failed or was used after close
        ├── NotFound                     no run / task / rollout / call with that id
        ├── AlreadyExists                an id that is already taken
        │   └── DuplicateReward          a second final reward for one attempt
        ├── StaleAttempt                 a write from an attempt that is no longer current
        ├── RolloutClosed                a call for a rollout that is not running
        ├── IllegalRolloutTransition     a state change the state machine forbids
        │                                (also a records.IllegalTransition)
        └── InvalidRecord                a record that cannot be stored as given
                                         (token id outside int32, logprobs count
                                         != completion tokens, JSON that is not JSON)

The store never picks HTTP status codes; the gateway maps these classes.
"""

from __future__ import annotations

from tether.errors import TetherError
from tether.records import IllegalTransition

__all__ = [
    "AlreadyExists",
    "DuplicateReward",
    "IllegalRolloutTransition",
    "InvalidRecord",
    "NotFound",
    "RolloutClosed",
    "StaleAttempt",
    "StoreError",
]


class StoreError(TetherError):
    """Base of every error the store raises on purpose."""


class NotFound(StoreError, LookupError):
    """No record with that id."""


class AlreadyExists(StoreError):
    """A record with that id (and different content) is already stored."""


class DuplicateReward(AlreadyExists):
    """The attempt already has its final reward; a second one is refused."""


class StaleAttempt(StoreError):
    """The write names an attempt that is not the rollout's current one; nothing was stored."""


class RolloutClosed(StoreError):
    """The rollout is not running (queued or finished), so it takes no calls."""


class IllegalRolloutTransition(StoreError, IllegalTransition):
    """The rollout state machine forbids this change (wraps :class:`IllegalTransition`)."""


class InvalidRecord(StoreError, ValueError):
    """The record cannot be stored as given; the message names the field and the rule."""
