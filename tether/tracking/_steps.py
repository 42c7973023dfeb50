"""``tether export --samples``: the exact training samples of one update, rebuilt from the store.

A sync update trains on its groups whose rollouts all have a usable reward;
:func:`tether.tracking._groups.step_groups` recomputes their advantages with
the trainer's ``compute_advantages`` and :func:`step_samples` turns the stored
calls of each rollout's last attempt into samples with the trainer's own
``build_samples``, the two calls the training loop makes. The result is what
``PolicyTrainer.update`` was given (tests/test_tracking.py checks it against
the samples of a real run).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tether.errors import UserError
from tether.records import Phase
from tether.tracking._groups import StepGroups, run_credit, step_groups, stored_rewards

__all__ = ["StepSamples", "step_samples", "training_sample_rows"]


@dataclass
class StepSamples:
    run_id: str
    step: int
    groups: StepGroups
    samples: list[Any]  # tether.trainer.Sample
    rollout_ids: list[str]  # rollout_ids[s.rollout_index] is the sample's rollout

    @property
    def updated(self) -> bool:
        """Whether the loop made an update of these samples (not all groups zero-variance)."""
        return bool(self.samples) and self.groups.zero_variance_groups < len(self.groups.kept)


def _is_training(config: dict[str, Any]) -> bool:
    extra = config.get("extra")
    return not (isinstance(extra, dict) and extra.get("command") == "eval")


def _train_steps(store: Any, run_id: str) -> set[int]:
    return {
        p.step
        for r in store.list_rollouts(run_id=run_id)
        if (p := r.place) is not None and p.phase is Phase.TRAIN and p.step is not None
    }


def step_samples(store: Any, step: int | None = None, run_id: str | None = None) -> StepSamples:
    """The samples update ``step`` (from 1, the run's numbering; None = the last one)
    trained on.

    Without ``run_id``, the newest training record in the store that ran that step (a
    resumed run may hold it twice: the later session's is the one that counts).
    One-line :class:`UserError` when the step is not in the store.
    """
    from tether.trainer import build_samples
    from tether.trainer.samples import weigh_roles

    runs = [r for r in store.list_runs() if _is_training(r.config)]
    if run_id is not None:
        runs = [r for r in runs if r.id == run_id]
        if not runs:
            raise UserError(f"no training run {run_id!r} in this store: leave out --run-id")
    steps: set[int] = set()
    chosen = None
    if step is None and runs:  # the newest run's last update
        step = max(_train_steps(store, runs[-1].id), default=-1)
    for run in reversed(runs):
        mine = _train_steps(store, run.id)
        steps |= mine
        if step in mine:
            chosen = run
            break
    if chosen is None:
        steps |= {s for run in runs for s in _train_steps(store, run.id)}
        if not steps:
            raise UserError(
                "this store holds no sync-mode update (async mode does not record which "
                "groups an update trained on): export its rollouts without --samples"
            )
        raise UserError(
            f"step {step} is not in this store: pass --step between {min(steps)} and {max(steps)}"
        )
    assert step is not None
    rollouts = store.list_rollouts(run_id=chosen.id)
    how = run_credit(chosen.config)
    groups = step_groups(rollouts, how, stored_rewards(store))[step]
    flat = [r for g in groups.kept for r in g]
    advantages = [a for row in groups.advantages for a in row]
    calls = [store.calls(r.id, attempt=r.attempt) for r in flat]
    samples, _ = build_samples(calls, advantages) if flat else ([], None)
    samples = weigh_roles(samples, how.role_weights)
    return StepSamples(chosen.id, step, groups, samples, [r.id for r in flat])


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
