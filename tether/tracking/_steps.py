"""``tether export --samples``: the exact training samples of one update, rebuilt from the store.

Each update stores what it trained (:class:`~tether.records.UpdateRecord`): its kept
groups and each rollout's advantage. :func:`step_samples` turns the stored calls of each
kept rollout's last attempt into samples with the trainer's own ``build_samples`` and
those advantages, the call the training loop makes, and leaves out the frozen roles'
as the loop did. The result is what ``PolicyTrainer.update`` was given (tests check it
against the samples of real runs). Sync and async updates alike; a store written
before tether kept update records has none to rebuild.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tether.errors import UserError
from tether.records import UpdateRecord

__all__ = ["StepSamples", "step_samples", "training_sample_rows"]


@dataclass
class StepSamples:
    run_id: str
    step: int
    update: UpdateRecord
    samples: list[Any]  # tether.trainer.Sample
    rollout_ids: list[str]  # rollout_ids[s.rollout_index] is the sample's rollout

    @property
    def updated(self) -> bool:
        """Whether the loop made an update of these samples (not all groups zero-variance)."""
        return self.update.version is not None


def _find(store: Any, step: int | None, run_id: str | None) -> UpdateRecord:
    """Update ``step``'s record (None: the newest run's last), the newest run's first."""
    runs = store.list_runs()
    if run_id is not None:
        runs = [r for r in runs if r.id == run_id]
        if not runs:
            raise UserError(f"no training run {run_id!r} in this store: leave out --run-id")
    updates = [{u.step: u for u in store.updates(r.id)} for r in reversed(runs)]
    if step is None:
        step = max(next((u for u in updates if u), {}), default=None)
    found = next((u[step] for u in updates if step in u), None)
    if found is not None:
        return found
    steps = {s for u in updates for s in u}
    if not steps:
        raise UserError(
            "this store holds no update record (what an update trained is not recorded in "
            "stores written before tether kept it): export its rollouts without --samples"
        )
    raise UserError(
        f"step {step} is not in this store: pass --step between {min(steps)} and {max(steps)}"
    )


def step_samples(store: Any, step: int | None = None, run_id: str | None = None) -> StepSamples:
    """The samples update ``step`` (from 1, the run's numbering; None = the last one)
    trained on, from its stored record.

    Without ``run_id``, the newest run record in the store that ran that step (a resumed
    run may hold it twice: the later session's is the one that counts).
    One-line :class:`UserError` when the step is not in the store.
    """
    from tether.trainer import build_samples
    from tether.trainer.samples import weigh_roles

    update = _find(store, step, run_id)
    kept = update.kept()
    ids = [rid for g in kept for rid in g.rollouts]
    advantages = [a for g in kept for a in g.advantages or ()]
    calls = []
    for rid in ids:
        r = store.get_rollout(rid)
        calls.append(store.calls(rid, attempt=r.attempt))
    samples, _ = build_samples(calls, advantages) if ids else ([], None)
    samples = weigh_roles(samples, update.credit.get("role_weights") or {})
    return StepSamples(update.run_id, update.step, update, samples, ids)


def training_sample_rows(found: StepSamples) -> Iterator[dict[str, Any]]:
    """One row per sample: ``step``, ``rollout_id``, ``input_ids``, ``loss_mask``,
    ``old_logprobs``, ``advantage``, ``token_advantages`` (turn credit; else None),
    ``temperature``, ``num_calls``."""
    for s in found.samples:
        yield {
            "run_id": found.run_id,
            "step": found.step,
            "rollout_id": found.rollout_ids[s.rollout_index],
            "input_ids": list(s.input_ids),
            "loss_mask": list(s.loss_mask),
            "old_logprobs": [float(x) for x in s.old_logprobs],
            "advantage": float(s.advantage),
            "token_advantages": s.token_advantages,
            "temperature": float(s.temperature),
            "num_calls": s.num_calls,
        }
