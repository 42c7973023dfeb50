"""The context of a run's rollouts page: its query checked, one page of rollouts, their
groups and what became of them."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlencode

from tether.dashboard._catalog import Catalog
from tether.dashboard._pages import BadQuery, duration, run_of, store_of, updates_recorded
from tether.dashboard._views import group_fate, outcome, rollout_phase, run_header
from tether.records import RolloutStatus, Run
from tether.store import Store
from tether.tracking import Fate, credit_label, rollout_fates

__all__ = ["rollouts_page"]

PER_PAGE = 50
SORTS = ("created", "reward", "status", "task", "calls", "tokens", "duration")


def _number(query: dict[str, str], name: str, kind: type) -> Any:
    raw = (query.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise BadQuery(f"{name} ({raw!r}) must be a {kind.__name__}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise BadQuery(f"{name} ({raw!r}) must be a finite number")
    return value


def _filters(query: dict[str, str]) -> dict[str, Any]:
    """The rollouts page's query, checked: phase, status, sort, step, page, per, desc."""
    phase = query.get("phase") or ""
    if phase not in ("", "train", "eval", "async"):
        raise BadQuery(f"phase ({phase!r}) must be train, eval or async")
    status = query.get("status") or None
    if status is not None and status not in {s.value for s in RolloutStatus}:
        raise BadQuery(
            f"status ({status!r}) must be one of {', '.join(s.value for s in RolloutStatus)}"
        )
    sort = query.get("sort") or "created"
    if sort not in SORTS:
        raise BadQuery(f"sort ({sort!r}) must be one of {', '.join(SORTS)}")
    step = _number(query, "step", int)
    return {
        "phase": phase or ("train" if step is not None else ""),
        "status": status,
        "sort": sort,
        "step": step,
        "page": max(_number(query, "page", int) or 1, 1),
        "per": min(max(_number(query, "per", int) or PER_PAGE, 1), 500),
        "descending": query.get("desc") == "1",
    }


def _page_groups(
    store: Store, found: list[Any], fates: dict[str, Fate], recorded: bool
) -> dict[str, Any]:
    """The groups of a page's rollouts: their members, the advantages their update trained
    (None: not trained, an eval's never) and what became of them, from the run's records."""
    groups: dict[str, dict[str, Any]] = {}
    for r, _, _ in found:
        if r.group_id and r.group_id not in groups:
            members = store.list_rollouts(group_id=r.group_id)
            if rollout_phase(r)[0].startswith("eval"):  # evals teach nothing
                adv, fate = None, "a held-out eval: never trained on"
            else:
                adv, fate = group_fate(members, fates, recorded)
            groups[r.group_id] = {"id": r.group_id, "members": members, "adv": adv, "fate": fate}
    return groups


def _rows(store: Store, run: Run, found: list[Any], groups: dict[str, Any]) -> list[Any]:
    ends = store.current_ends([r.id for r, _, _ in found])
    rows = []
    for r, n_calls, n_tokens in found:
        adv = (groups.get(r.group_id or "") or {}).get("adv")
        ph, st = rollout_phase(r)
        rows.append(
            {
                "r": r,
                "calls": n_calls,
                "tokens": n_tokens,
                "phase": ph,
                "step": st,
                "adv": None if adv is None else adv.get(r.id),
                "duration": duration(r),
                "outcome": outcome(r, ends.get(r.id)),
            }
        )
    return rows


def rollouts_page(catalog: Catalog, key: str, run_id: str, query: dict[str, str]) -> dict[str, Any]:
    store = store_of(catalog, key)
    run = run_of(store, run_id)
    f = _filters(query)
    page, per, sort, descending = f["page"], f["per"], f["sort"], f["descending"]
    total, found = store.rollout_page(
        run.id,
        phase=f["phase"] or None,
        step=f["step"],
        task_id=query.get("task") or None,
        status=f["status"],
        reward_min=_number(query, "rmin", float),
        reward_max=_number(query, "rmax", float),
        sort=sort,
        descending=descending,
        offset=(page - 1) * per,
        limit=per,
    )
    updates = store.updates(run.id)
    recorded = updates_recorded(store, run.id, updates)
    groups = _page_groups(store, found, rollout_fates(updates), recorded)
    keep = {k: v for k, v in query.items() if v and k != "page"}
    pages = max(math.ceil(total / per), 1)

    def link(**change: Any) -> str:
        q = {**keep, **{k: str(v) for k, v in change.items() if v is not None}}
        return "?" + urlencode(q)

    return {
        "title": "rollouts",
        "key": key,
        "run": run_header(store, run),
        "rows": _rows(store, run, found, groups),
        "groups": list(groups.values()),
        "estimator": credit_label(updates[-1].credit if updates else None),
        "total": total,
        "page": page,
        "pages": pages,
        "prev": link(page=page - 1) if page > 1 else None,
        "next": link(page=page + 1) if page < pages else None,
        "sort_link": lambda name: link(sort=name, desc="0" if sort == name and descending else "1"),
        "q": {k: query.get(k, "") for k in ("phase", "step", "task", "status", "rmin", "rmax")},
        "statuses": [s.value for s in RolloutStatus],
        "sort": sort,
        "descending": descending,
    }
