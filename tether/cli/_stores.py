"""Which trace store ``tether rollouts list|show`` reads.

``tether serve`` writes ``.tether/traces.sqlite``; a training run writes
``runs/<name>/traces.sqlite``. ``--store FILE`` names a file; a RUN argument
names a run (its folder under ``runs/``, or any run folder); with neither,
``list`` reads ``.tether/traces.sqlite`` and ``show`` looks for the rollout
in that store and in every run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.errors import UserError

__all__ = ["DEFAULT_STORE", "RUNS_DIR", "open_store", "store_for_rollout"]

DEFAULT_STORE = Path(".tether/traces.sqlite")
RUNS_DIR = Path("runs")
STORE_FILE = "traces.sqlite"


def _run_stores() -> list[Path]:
    return sorted(RUNS_DIR.glob(f"*/{STORE_FILE}")) if RUNS_DIR.is_dir() else []


def _hint() -> str:
    runs = [p.parent.name for p in _run_stores()]
    if runs:
        shown = ", ".join(runs[:5]) + (", …" if len(runs) > 5 else "")
        return f"runs here: {shown}; e.g. tether rollouts list {runs[0]}"
    return f"tether serve writes {DEFAULT_STORE}, tether train writes {RUNS_DIR}/NAME/{STORE_FILE}"


def store_path(store: Path | None, run: str | None) -> Path:
    """The store file ``--store`` or RUN names (``--store`` wins), else the default."""
    if store is not None:
        if not store.is_file():
            raise UserError(
                f"no trace store at {store}: pass --store FILE or a run name ({_hint()})"
            )
        return store
    if run is not None:
        folder = Path(run)
        candidates = [folder / STORE_FILE] if folder.is_dir() else []
        candidates.append(RUNS_DIR / run / STORE_FILE)
        for path in candidates:
            if path.is_file():
                return path
        raise UserError(f"no run {run!r}: {RUNS_DIR / run / STORE_FILE} does not exist ({_hint()})")
    if not DEFAULT_STORE.is_file():
        raise UserError(
            f"no trace store at {DEFAULT_STORE}: pass a run name or --store FILE ({_hint()})"
        )
    return DEFAULT_STORE


def open_store(store: Path | None, run: str | None) -> Any:
    from tether.store import Store

    return Store(store_path(store, run))


def store_for_rollout(rollout_id: str, store: Path | None, run: str | None) -> Any:
    """The store holding ``rollout_id``: the one named, else the first of the default
    store and the runs' stores that has it."""
    from tether.store import Store

    if store is not None or run is not None:
        return open_store(store, run)
    for path in [DEFAULT_STORE, *_run_stores()]:
        if not path.is_file():
            continue
        db = Store(path)
        if db.get_rollout(rollout_id) is not None:
            return db
        db.close()
    raise UserError(
        f"no rollout {rollout_id!r} in {DEFAULT_STORE} or {RUNS_DIR}/*/{STORE_FILE}: "
        f"pass its run or --store FILE ({_hint()})"
    )
