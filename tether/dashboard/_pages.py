"""The context of the runs page and a run's page (and its live metrics feed), read from
the catalog's stores, and what every page shares: its errors and finding its store and run.
The rollouts page is ``_rollouts_page``, a rollout's page ``_rollout_page``."""

from __future__ import annotations

import math
from typing import Any

from tether.dashboard._catalog import Catalog
from tether.dashboard._render import head_fields
from tether.dashboard._views import (
    NOT_RECORDED,
    chart_layout,
    events,
    run_header,
    sparkline,
    update_rows,
)
from tether.records import Run, RunStatus, UpdateRecord
from tether.store import NotFound, Store, StoreError

__all__ = [
    "BadQuery",
    "Forbidden",
    "NotFoundPage",
    "duration",
    "metrics_feed",
    "run_of",
    "run_page",
    "runs_page",
    "store_of",
    "updates_recorded",
]


class NotFoundPage(Exception):
    pass


class BadQuery(Exception):
    pass


class Forbidden(Exception):
    pass


def store_of(catalog: Catalog, key: str) -> Store:
    store = catalog.store(key)
    if store is None:
        raise NotFoundPage(f"no trace store {key!r} here")
    return store


def run_of(store: Store, run_id: str) -> Run:
    try:
        return store.get_run(run_id)
    except NotFound:
        raise NotFoundPage(f"no run {run_id!r} in this store") from None


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v


def duration(r: Any) -> float | None:
    """The current attempt's own time: from its agent's start (its batch's creation in a
    store from before tether recorded starts) to its end."""
    if r.finished_at is None:
        return None
    return r.finished_at - (r.created_at if r.started_at is None else r.started_at)


# -- runs ----------------------------------------------------------------------------


def runs_page(catalog: Catalog) -> dict[str, Any]:
    rows, broken = [], []
    for key, path in catalog.paths().items():
        store = catalog.store(key)
        if store is None:
            broken.append({"key": key, "path": str(path)})
            continue
        try:
            for run in store.list_runs():
                row = run_header(store, run)
                row["key"] = key
                row["spark"] = sparkline([m.value for m in store.metrics(run.id, "reward_mean")])
                rows.append(row)
        except StoreError as e:
            broken.append({"key": key, "path": f"{path}: {e}"})
    rows.sort(key=lambda r: -r["created_at"])
    return {"title": "runs", "runs": rows, "broken": broken, "catalog_dir": catalog.runs_dir}


# -- one run ---------------------------------------------------------------------------


def run_page(catalog: Catalog, key: str, run_id: str) -> dict[str, Any]:
    store = store_of(catalog, key)
    run = run_of(store, run_id)
    header = run_header(store, run)
    updates = store.updates(run.id)
    return {
        "title": header["name"],
        "key": key,
        "run": header,
        "has_metrics": bool(store.metrics_after(run.id, 0, limit=1)),
        "layout": chart_layout(),
        "config": run.config,
        "events": events(store, run),
        "counts": store.counts(run.id),
        "updates": update_rows(updates),
        "not_recorded": None if updates_recorded(store, run.id, updates) else NOT_RECORDED,
    }


def updates_recorded(store: Store, run_id: str, updates: list[UpdateRecord]) -> bool:
    """Whether what the run's updates trained is known: it recorded them, or made none (a
    run stored before tether kept update records logged updates but recorded none)."""
    return bool(updates) or not store.metrics(run_id, "policy_version")


def metrics_feed(catalog: Catalog, key: str, run_id: str, after: int) -> dict[str, Any]:
    """The run's metrics stored after row ``after``: ``{"last": id, "status": ...,
    "head": {field: text}, "points": [[step, name, value or null], ...], "events": [...]}``.
    The header fields and the events (all of them, as the run page lists them) come only
    when there are new points or the run has ended, so a poll between steps costs one
    indexed query."""
    store = store_of(catalog, key)
    run = run_of(store, run_id)
    found = store.metrics_after(run.id, max(after, 0), limit=50_000)
    changed = bool(found) or run.status is not RunStatus.RUNNING
    return {
        "last": found[-1][0] if found else max(after, 0),
        "status": run.status.value,
        "head": head_fields(run_header(store, run)) if found else {},
        "points": [[m.step, m.name, _finite(m.value)] for _, m in found],
        "events": events(store, run) if changed else None,
    }
