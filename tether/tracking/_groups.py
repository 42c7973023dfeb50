"""A stored run's updates as the run recorded them, and a rollout's place in one word.

Each update stores what it trained (:class:`~tether.records.UpdateRecord`, written once
by the run that decided it): every group it decided on, kept with the advantages it
trained or dropped and why, its credit settings and the policy version it produced.
:func:`rollout_fates` indexes them by rollout for ``tether export`` and the dashboard,
which read them and never recompute them. A store written before tether kept these
records has none: what its updates trained is "not recorded" (no advantage is shown or
exported for it). :func:`place_kind` names a rollout's place in one word, as export and
the dashboard show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.records import GroupFate, Phase, Rollout, UpdateRecord

__all__ = ["Fate", "credit_label", "place_kind", "rollout_fates"]


def place_kind(rollout: Rollout) -> str:
    """``train`` (a sync update), ``eval_sampled``, ``eval_greedy``, ``async`` or ``other``
    (opened through the admin API, or by ``tether serve``), from the stored place."""
    p = rollout.place
    if p is None:
        return "other"
    if p.phase is Phase.EVAL:
        return "eval_greedy" if p.greedy else "eval_sampled"
    return p.phase.value


@dataclass(frozen=True)
class Fate:
    """What update ``step`` did with a rollout's group: ``fate``, and for a kept group the
    rollout's advantage (a float, or per call seq) and the policy version the update made
    (None: it learned nothing)."""

    step: int
    fate: GroupFate
    advantage: float | dict[int, float] | None
    version: int | None

    @property
    def trained(self) -> bool:
        return self.fate is GroupFate.KEPT and self.version is not None


def rollout_fates(updates: list[UpdateRecord]) -> dict[str, Fate]:
    """Rollout id → its group's fate in ``updates`` (one run's records)."""
    found: dict[str, Fate] = {}
    for u in updates:
        for g in u.groups:
            advs = g.advantages or (None,) * len(g.rollouts)
            for rid, a in zip(g.rollouts, advs, strict=True):
                found[rid] = Fate(u.step, g.fate, a, u.version)
    return found


def credit_label(credit: dict[str, Any] | None) -> str:
    """What an update's advantages are, from its recorded credit settings: the estimator;
    with turn credit one per call; with roles each role's calls against the role's own
    baseline; "not recorded" for a run stored before tether kept update records."""
    if not credit:
        return "not recorded"
    roles = ", per role" if credit.get("role_weights") else ""
    estimator = str(credit.get("advantage", "?"))
    if credit.get("credit") != "turn":
        return estimator + roles
    turn = "turn credit"
    if credit.get("grouping") == "state":
        turn += f" by prompt state, ω {float(credit.get('state_weight', 1.0)):g}"
    return f"{estimator}, per call ({turn}{roles})"
