"""The context of each page (and the live metrics feed), read from the catalog's stores."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from tether.dashboard._catalog import Catalog
from tether.dashboard._render import head_fields
from tether.dashboard._tokens import call_pieces, sample_views
from tether.dashboard._views import (
    NOT_RECORDED,
    chart_layout,
    events,
    group_fate,
    judgement,
    message_text,
    outcome,
    rollout_phase,
    run_header,
    sparkline,
    update_rows,
)
from tether.records import Call, RolloutStatus, Run, RunStatus, UpdateRecord
from tether.store import NotFound, Store, StoreError
from tether.tracking import Fate, credit_label, rollout_fates

__all__ = [
    "BadQuery",
    "Forbidden",
    "NotFoundPage",
    "metrics_feed",
    "rollout_page",
    "rollouts_page",
    "run_page",
    "runs_page",
]

PER_PAGE = 50
SORTS = ("created", "reward", "status", "task", "calls", "tokens", "duration")


class NotFoundPage(Exception):
    pass


class BadQuery(Exception):
    pass


class Forbidden(Exception):
    pass


def _store(catalog: Catalog, key: str) -> Store:
    store = catalog.store(key)
    if store is None:
        raise NotFoundPage(f"no trace store {key!r} here")
    return store


def _run(store: Store, run_id: str) -> Run:
    try:
        return store.get_run(run_id)
    except NotFound:
        raise NotFoundPage(f"no run {run_id!r} in this store") from None


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v


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
    store = _store(catalog, key)
    run = _run(store, run_id)
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
        "not_recorded": None if _recorded(store, run.id, updates) else NOT_RECORDED,
    }


def _recorded(store: Store, run_id: str, updates: list[UpdateRecord]) -> bool:
    """Whether what the run's updates trained is known: it recorded them, or made none (a
    run stored before tether kept update records logged updates but recorded none)."""
    return bool(updates) or not store.metrics(run_id, "policy_version")


def metrics_feed(catalog: Catalog, key: str, run_id: str, after: int) -> dict[str, Any]:
    """The run's metrics stored after row ``after``: ``{"last": id, "status": ...,
    "head": {field: text}, "points": [[step, name, value or null], ...], "events": [...]}``.
    The header fields and the events (all of them, as the run page lists them) come only
    when there are new points or the run has ended, so a poll between steps costs one
    indexed query."""
    store = _store(catalog, key)
    run = _run(store, run_id)
    found = store.metrics_after(run.id, max(after, 0), limit=50_000)
    changed = bool(found) or run.status is not RunStatus.RUNNING
    return {
        "last": found[-1][0] if found else max(after, 0),
        "status": run.status.value,
        "head": head_fields(run_header(store, run)) if found else {},
        "points": [[m.step, m.name, _finite(m.value)] for _, m in found],
        "events": events(store, run) if changed else None,
    }


# -- rollouts of a run -----------------------------------------------------------------


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


def _duration(r: Any) -> float | None:
    """The current attempt's own time: from its agent's start (its batch's creation in a
    store from before tether recorded starts) to its end."""
    if r.finished_at is None:
        return None
    return r.finished_at - (r.created_at if r.started_at is None else r.started_at)


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
                "duration": _duration(r),
                "outcome": outcome(r, ends.get(r.id)),
            }
        )
    return rows


def rollouts_page(catalog: Catalog, key: str, run_id: str, query: dict[str, str]) -> dict[str, Any]:
    store = _store(catalog, key)
    run = _run(store, run_id)
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
    recorded = _recorded(store, run.id, updates)
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


# -- one rollout -------------------------------------------------------------------------


def _tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            out.append({"name": str(fn.get("name", "")), **message_text(fn.get("arguments"))})
    return out


def _message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        return {"role": "?", **message_text(m), "tool_calls": [], "tool_call_id": None}
    return {
        "role": str(m.get("role", "?")),
        **message_text(m.get("content")),
        "tool_calls": _tool_calls(m),
        "tool_call_id": m.get("tool_call_id"),
    }


def _reply(response: dict[str, Any]) -> dict[str, Any] | None:
    try:
        choice = (response.get("choices") or [])[0]
    except (AttributeError, IndexError):
        return None
    if not isinstance(choice, dict):
        return None
    if isinstance(choice.get("message"), dict):
        return _message(choice["message"])
    if "text" in choice:
        return _message({"role": "assistant", "content": choice.get("text")})
    return None


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str] | None:
    if tokenizer is None:
        return None
    cache: dict[int, str] = {}

    def decode(ids: Sequence[int]) -> str:
        if len(ids) == 1:
            if ids[0] not in cache:
                cache[ids[0]] = tokenizer.decode([ids[0]], skip_special_tokens=False)
            return cache[ids[0]]
        return tokenizer.decode(list(ids), skip_special_tokens=False)

    return decode


def _call(call: Call, decode: Any, rewards: dict[int, list[Any]]) -> dict[str, Any]:
    request = call.request if isinstance(call.request, dict) else {}
    messages = request.get("messages")
    pieces, cut = call_pieces(call, decode)
    return {
        "c": call,
        "messages": [_message(m) for m in messages] if isinstance(messages, list) else [],
        "prompt": None if "prompt" not in request else message_text(request.get("prompt")),
        "tools": [
            str((t.get("function") or {}).get("name", "?"))
            for t in request.get("tools") or []
            if isinstance(t, dict)
        ],
        "reply": _reply(call.response if isinstance(call.response, dict) else {}),
        "pieces": pieces,
        "cut": cut,
        "rewards": rewards.get(call.seq, []),
    }


def rollout_page(
    catalog: Catalog, key: str, rollout_id: str, tokenizers: Callable[[str, Any], Any]
) -> dict[str, Any]:
    store = _store(catalog, key)
    r = store.get_rollout(rollout_id)
    if r is None:
        raise NotFoundPage(f"no rollout {rollout_id!r} in this store")
    run = None
    if r.run_id is not None:
        try:
            run = store.get_run(r.run_id)
        except NotFound:
            run = None
    decode = _decoder(tokenizers(key, run) if run is not None else None)
    rewards = store.rewards(r.id)
    ends = {a.attempt: a for a in store.attempts(r.id)}
    attempts = []
    for n in range(1, r.attempt + 1):
        mine: dict[int, list[Any]] = {}
        for w in rewards:
            if w.attempt == n and w.call_seq is not None:
                mine.setdefault(w.call_seq, []).append(w)
        calls = store.calls(r.id, attempt=n)
        end = ends.get(n)
        attempts.append(
            {
                "n": n,
                "end": end,
                "judge": judgement(end.grade_detail if end else None),
                "calls": [_call(c, decode, mine) for c in calls],
            }
        )
    members = store.list_rollouts(group_id=r.group_id) if r.group_id else [r]
    phase, step = rollout_phase(r)
    evaluated = phase.startswith("eval")  # an eval's rollouts are never trained on
    updates = store.updates(run.id) if run is not None else []
    recorded = run is None or _recorded(store, run.id, updates)
    adv_map, fate = (
        (None, "") if evaluated else group_fate(members, rollout_fates(updates), recorded)
    )
    adv = None if adv_map is None else adv_map.get(r.id)
    current = store.calls(r.id) if r.attempt else []
    samples, (stats, skipped) = sample_views(current, adv or 0.0, decode)
    return {
        "title": f"rollout {r.id}",
        "key": key,
        "r": r,
        "run": None if run is None else run_header(store, run),
        "phase": phase,
        "step": step,
        "usable": r.usable,
        "outcome": outcome(r, ends.get(r.attempt)),
        "duration": _duration(r),
        "evaluated": evaluated,
        "adv": adv,
        "fate": fate,
        "members": members,
        "adv_map": adv_map or {},
        "rewards": rewards,
        "attempts": attempts,
        "samples": samples,
        "stats": stats,
        "skipped": skipped,
        "has_tokenizer": decode is not None,
    }
