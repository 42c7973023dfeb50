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

from ._codec import redact_secrets
from ._errors import (
    AlreadyExists,
    DuplicateReward,
    IllegalRolloutTransition,
    InvalidRecord,
    NotFound,
    RolloutClosed,
    StaleAttempt,
    StoreError,
)
from ._store import Store

__all__ = [
    "AlreadyExists",
    "DuplicateReward",
    "IllegalRolloutTransition",
    "InvalidRecord",
    "NotFound",
    "RolloutClosed",
    "StaleAttempt",
    "Store",
    "StoreError",
    "redact_secrets",
]
