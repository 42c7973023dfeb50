"""tether's durable trace store: runs, tasks, rollouts, calls, rewards, metrics.

One SQLite file in WAL mode (stdlib :mod:`sqlite3`), evolved by numbered
migrations. A write is durable when its method returns; every method is safe
to call from many threads. Token ids are kept as int32 blobs, logprobs as
float32 blobs, rewards as float64 (a reward that is not a finite number is
never stored as one)::

    from tether.store import Store

    with Store("runs/tether.db") as store:
        run = store.create_run({"algorithm": "grpo"})
        store.create_rollout(Rollout(id="r1", run_id=run.id, task={"q": "2+2"}))
        attempt = store.start_attempt("r1", token_hash=hash_of_token)
        seq = store.record_call(call)  # call.attempt == attempt
        store.finish_rollout(AttemptEnd("r1", attempt, RolloutStatus.SUCCEEDED), reward=1.0)

Errors (see ``_errors``)::

    TetherError
    └── StoreError
        ├── NotFound
        ├── AlreadyExists
        │   └── DuplicateReward
        ├── StaleAttempt
        ├── RolloutClosed
        ├── IllegalRolloutTransition   (also a records.IllegalTransition)
        └── InvalidRecord              (also a ValueError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports

#: The package's face: each name and the module it lives in, imported on first use
#: (importing the package opens nothing).
_EXPORTS = {
    "AlreadyExists": "._errors",
    "DuplicateReward": "._errors",
    "IllegalRolloutTransition": "._errors",
    "InvalidRecord": "._errors",
    "NotFound": "._errors",
    "RolloutClosed": "._errors",
    "StaleAttempt": "._errors",
    "Store": "._store",
    "StoreError": "._errors",
    "redact_secrets": "._codec",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the same names for type checkers (tests/test_public_api.py: they match)
    from ._codec import redact_secrets as redact_secrets
    from ._errors import AlreadyExists as AlreadyExists
    from ._errors import DuplicateReward as DuplicateReward
    from ._errors import IllegalRolloutTransition as IllegalRolloutTransition
    from ._errors import InvalidRecord as InvalidRecord
    from ._errors import NotFound as NotFound
    from ._errors import RolloutClosed as RolloutClosed
    from ._errors import StaleAttempt as StaleAttempt
    from ._errors import StoreError as StoreError
    from ._store import Store as Store
