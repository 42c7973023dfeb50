"""What each page shows, read from one store: plain dicts for the templates.

A rollout's phase and step are its stored place (``records.Place``), never read from its
ids. Steps are the run's one numbering: update N at step N (from 1), the evals at step 0
(before training) and N (after update N); so the reward chart runs 1..N and the held-out
chart 0..N.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from tether.records import AttemptEnd, GroupFate, Rollout, Run, UpdateRecord
from tether.store import Store
from tether.tracking import Fate, place_kind

__all__ = [
    "CHARTS",
    "NOT_RECORDED",
    "chart_layout",
    "events",
    "fate_text",
    "group_fate",
    "judgement",
    "message_text",
    "outcome",
    "rollout_phase",
    "run_header",
    "sparkline",
    "update_rows",
]

#: The run page's charts: title → metric names, in this order; a metric named in none
#: gets a chart of its own after these.
CHARTS: list[tuple[str, list[str]]] = [
    ("reward", ["reward_mean", "success"]),
    ("held-out success", ["eval/sampled_success", "eval/greedy_success"]),
    ("held-out mean reward", ["eval/sampled_reward_mean", "eval/greedy_reward_mean"]),
    ("loss", ["loss"]),
    ("KL", ["approx_kl", "kl_ref"]),
    ("clip fraction", ["clip_frac", "clip_frac_low", "clip_frac_high"]),
    ("grad norm", ["grad_norm"]),
    ("entropy", ["entropy"]),
    ("logprob gap (engine vs trainer)", ["logprob_gap", "logprob_gap_max"]),
    ("policy lag", ["policy_lag_max", "call_lag_mean"]),
    ("step time (s)", ["step_s", "rollout_s", "update_s", "wait_s", "drain_s", "paused_s"]),
    ("tokens/s", ["gen_tokens_per_s"]),
    ("memory (MiB)", ["rss_mb"]),
    ("groups", ["groups_dropped", "zero_variance_groups", "groups_dropped_lag"]),
]
_HIDDEN = {
    "eval/tasks",
    "eval/rollouts",
    "eval/wall_s",
    "policy_version",
    "rollouts",
    "micro_batches",
}
MAX_TEXT = 20_000  # characters of one message shown; the rest is counted


def chart_layout() -> dict[str, Any]:
    """What the run page's script draws: ``charts`` (:data:`CHARTS`; a chart appears once
    one of its metrics has a point, a metric named in none gets its own) and ``hidden``
    (counters not drawn)."""
    return {
        "charts": [{"title": t, "series": list(s)} for t, s in CHARTS],
        "hidden": sorted(_HIDDEN),
    }


def rollout_phase(r: Rollout) -> tuple[str, int | None]:
    """``(phase, step)`` of a rollout as a page shows it: ``train``, ``eval sampled``,
    ``eval greedy``, ``async`` or ``other`` (opened outside the training loop)."""
    return place_kind(r).replace("_", " "), None if r.place is None else r.place.step


def run_header(store: Store, run: Run) -> dict[str, Any]:
    """Name, status, model, steps, start, last activity and best held-out success."""
    cfg = run.config or {}
    model = cfg.get("model")
    if isinstance(model, dict):
        model = model.get("path")
    activity = store.run_activity(run.id)
    best = activity["best"]
    return {
        "id": run.id,
        "name": str(cfg.get("name") or cfg.get("command") or run.id),
        "status": run.status.value,
        "model": "" if model is None else str(model),
        "steps": activity["steps"],
        "total_steps": (cfg.get("trainer") or {}).get("steps")
        if isinstance(cfg.get("trainer"), dict)
        else None,
        "created_at": run.created_at,
        "last_at": activity["last_at"],
        "rollouts": activity["rollouts"],
        "calls": activity["calls"],
        "best_sampled": best.get("eval/sampled_success"),
        "best_greedy": best.get("eval/greedy_success"),
    }


def sparkline(values: list[float], width: int = 120, height: int = 28) -> str:
    """SVG polyline points of ``values`` (NaN skipped), scaled into ``width × height``."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    step = width / (len(vals) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 2 - (v - lo) / span * (height - 4):.1f}"
        for i, v in enumerate(vals)
    )


def events(store: Store, run: Run) -> list[dict[str, Any]]:
    """What happened, by step: evals, checkpoints, dropped groups, failed calls, rewards of
    0 for ``collapse_patience`` steps in a row, and how the run ended."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for m in store.metrics(run.id):
        by_step[m.step][m.name] = m.value
    out: list[dict[str, Any]] = []
    streak, gained = 0, False
    sections = (run.config.get(k) for k in ("run", "trainer"))  # trainer: recorded before run
    section = next((s for s in sections if isinstance(s, dict) and "collapse_patience" in s), {})
    patience = int(section.get("collapse_patience") or 0)
    for step in sorted(by_step):
        m = by_step[step]
        if "eval/sampled_success" in m:
            greedy = m.get("eval/greedy_success")
            text = f"held-out success: sampled {_pct(m['eval/sampled_success'])}"
            if greedy is not None:
                text += f", greedy {_pct(greedy)}"
            reward = m.get("eval/sampled_reward_mean")
            if reward is not None:
                text += f"; mean reward {_num(reward)}"
            out.append({"step": step, "kind": "eval", "text": text})
        for name, what in (
            ("groups_dropped", "group(s) dropped: an unusable reward"),
            ("groups_dropped_lag", "group(s) dropped: policy lag"),
            ("failed_calls", "call(s) failed in the engine"),
        ):
            if m.get(name, 0) and m[name] > 0:
                out.append({"step": step, "kind": "dropped", "text": f"{m[name]:.0f} {what}"})
        if "reward_mean" in m:
            streak = streak + 1 if m["reward_mean"] <= 0 else 0
            gained = gained or m["reward_mean"] > 0
            if patience and streak == patience:
                why = (
                    "the policy collapsed"
                    if gained
                    else "no learning signal since the start (check the grader and the agent)"
                )
                text = f"reward 0 for {patience} steps in a row: {why}"
                out.append({"step": step, "kind": "collapse", "text": text})
    for c in store.checkpoints(run.id):
        out.append({"step": c.step, "kind": "checkpoint", "text": f"checkpoint {c.path}"})
    out.sort(key=lambda e: e["step"])
    if run.status is not run.status.RUNNING:
        out.append({"step": None, "kind": "end", "text": f"run {run.status.value}"})
    return out


def _pct(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.0%}"


def _num(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3g}"


def outcome(r: Rollout, end: AttemptEnd | None) -> str | None:
    """The task's outcome, the badge a reader looks at first: ``success``, ``fail`` or
    ``no reward`` (none, or not a finite number); None while the attempt runs. The
    grader's verdict (``end.success``) when it gave one, else the run's default rule,
    reward > 0. The process status (``succeeded``: the agent exited cleanly) is apart:
    an agent that ran fine and answered wrong is a ``fail``."""
    if not r.status.is_final:
        return None
    if r.reward is None or not math.isfinite(r.reward):
        return "no reward"
    verdict = end.success if end is not None and end.attempt == r.attempt else None
    if verdict is None:
        verdict = r.reward > 0
    return "success" if verdict else "fail"


#: Why an update dropped a group, in words.
DROPPED = {
    GroupFate.UNUSABLE: "a rollout has no usable reward",
    GroupFate.NO_SIGNAL: "no signal, every advantage 0 (rollout.filter_groups)",
    GroupFate.SURPLUS: "the batch was full (rollout.filter_groups)",
    GroupFate.LAG: "too old for run.max_policy_lag",
}
NOT_RECORDED = "not recorded: this store was written before tether kept what each update trained"


def fate_text(fate: Fate | None, recorded: bool) -> str:
    """What became of a rollout's group, in words, from its run's update records
    (``recorded``: the run has some)."""
    if fate is None:
        return "not trained on: no update took its group" if recorded else NOT_RECORDED
    if fate.fate is not GroupFate.KEPT:
        return f"dropped at update {fate.step}: {DROPPED[fate.fate]}"
    if fate.version is None:
        return f"kept at update {fate.step}, which learned nothing (no group had signal)"
    return f"trained at update {fate.step}"


def group_fate(
    members: list[Rollout], fates: dict[str, Fate], recorded: bool
) -> tuple[dict[str, float | dict[int, float]] | None, str]:
    """(each member's advantage as its update trained it, None unless its group was kept;
    what became of the group, in words), from the run's update records."""
    found = [fates[m.id] for m in members if m.id in fates]
    fate = found[0] if found else None
    if fate is None or fate.fate is not GroupFate.KEPT:
        return None, fate_text(fate, recorded)
    adv = {m.id: a for m in members if (a := fates[m.id].advantage) is not None}
    return adv, fate_text(fate, recorded)


def update_rows(updates: list[UpdateRecord]) -> list[dict[str, Any]]:
    """The run page's updates: per step the policy version made, the groups trained (each
    group's number and first rollout) and those dropped, with why."""
    rows = []
    for u in updates:
        groups = [{"n": g.group, "first": g.rollouts[0] if g.rollouts else None} for g in u.groups]
        rows.append(
            {
                "step": u.step,
                "version": u.version,
                "kept": [
                    x for x, g in zip(groups, u.groups, strict=True) if g.fate is GroupFate.KEPT
                ],
                "dropped": [
                    {**x, "why": DROPPED[g.fate]}
                    for x, g in zip(groups, u.groups, strict=True)
                    if g.fate is not GroupFate.KEPT
                ],
            }
        )
    return rows


def message_text(value: Any) -> dict[str, Any]:
    """Message content as text (parts joined; other shapes as JSON), capped."""
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, list):
        text = "".join(
            p.get("text", "") if isinstance(p, dict) and isinstance(p.get("text"), str) else str(p)
            for p in value
        )
    else:
        text = str(value)
    return {"text": text[:MAX_TEXT], "cut": max(len(text) - MAX_TEXT, 0)}


def judgement(detail: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a judge saw and said for one attempt (its ``grade_detail``), for the page:
    the model, this rollout's candidate label and score, the group's scores and
    explanations (this one's marked), the raw answer and the prompt; None without one.
    Every value is the judge's text or from it: the template escapes it all."""
    if not detail:
        return None
    me = str(detail.get("candidate", ""))
    scores: dict[str, Any] = _of(detail, "scores", dict)
    why: dict[str, Any] = _of(detail, "explanations", dict)
    group = [
        {"label": str(k), "score": _number(v), "explanation": str(why.get(k, "")), "me": k == me}
        for k, v in scores.items()
    ]
    raw = detail.get("raw")
    messages: list[Any] = _of(detail, "messages", list)
    return {
        "model": str(detail.get("model", "?")),
        "candidate": me,
        "score": _number(scores.get(me)),
        "explanation": str(why.get(me, "")),
        "group": group,
        "raw": None if raw is None else message_text(str(raw)),
        "messages": [
            {"role": str(m.get("role", "?")), **message_text(m.get("content"))}
            for m in messages
            if isinstance(m, dict)
        ],
    }


def _of(detail: dict[str, Any], key: str, kind: type) -> Any:
    """``detail[key]`` when it is a ``kind`` (a dict or a list), else an empty one."""
    value = detail.get(key)
    return value if isinstance(value, kind) else kind()


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None
