"""The context of one rollout's page: its attempts with their calls (messages, reply,
tokens), its group and what became of it, its samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tether.dashboard._catalog import Catalog
from tether.dashboard._pages import NotFoundPage, duration, store_of, updates_recorded
from tether.dashboard._tokens import call_pieces, sample_views
from tether.dashboard._views import (
    group_fate,
    judgement,
    message_text,
    outcome,
    rollout_phase,
    run_header,
)
from tether.records import Call
from tether.store import NotFound
from tether.tracking import rollout_fates

__all__ = ["rollout_page"]


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
    store = store_of(catalog, key)
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
    recorded = run is None or updates_recorded(store, run.id, updates)
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
        "duration": duration(r),
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
