"""What one step's batch looked like before the update: the learning diagnostics a
reader of verl or TRL logs expects, computed from the samples and advantages.

The trainer adds its own (``entropy``, ``clip_frac_low``/``clip_frac_high``,
``approx_kl``, ``kl_ref``: see :meth:`tether.trainer.PolicyTrainer.update`);
together they are stored per step and the step line shows the most telling.

:func:`check_collapse` stops a run whose reward stayed at 0 (``run.collapse_patience``):
a collapse when it was above 0 before, else :func:`no_signal_line` (naming
:func:`first_rollout`) says why: not a collapse of a policy that never changed, but a
grader or agent that gives every rollout the same reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tether.records import Phase
from tether.store import Store
from tether.trainer.errors import NoLearningSignal, PolicyCollapsed
from tether.trainer.samples import Sample

__all__ = ["batch_diagnostics", "check_collapse", "first_rollout", "no_signal_line"]


def batch_diagnostics(
    samples: Sequence[Sample], num_rollouts: int, num_groups: int, zero_variance_groups: int
) -> dict[str, float]:
    """Metrics of the batch an update trains on (the groups kept after grading).

    - ``zero_variance_frac``: ``zero_variance_groups / num_groups``, the groups whose
      rollouts all got the same reward: their advantages are 0, they give no gradient.
    - ``adv_mean``/``adv_std``: mean and (population) std of the advantage over the
      completion tokens of every sample, each token weighted once (as verl's
      ``critic/advantages``), so long completions weigh more; zero-variance groups
      count with advantage 0. 0 and 0 when there is no completion token.
    - ``response_len_mean``/``response_len_max``: completion tokens per rollout
      (all its calls together), over the ``num_rollouts`` rollouts; one that made
      no usable call counts 0.

    ``samples`` carry ``rollout_index`` in ``0..num_rollouts-1`` (build_samples').
    """
    per_rollout = [0] * num_rollouts
    tokens, adv_sum, adv_sq = 0, 0.0, 0.0
    for s in samples:
        n = sum(1 for m in s.loss_mask if m)
        per_rollout[s.rollout_index] += n
        tokens += n
        if s.token_advantages is None:  # one advantage for the whole sample
            adv_sum += n * s.advantage
            adv_sq += n * s.advantage * s.advantage
        else:  # per call (trainer.credit: turn)
            adv_sum += sum(s.completion_advantages())
            adv_sq += sum(a * a for a in s.completion_advantages())
    mean = adv_sum / tokens if tokens else 0.0
    var = max(adv_sq / tokens - mean * mean, 0.0) if tokens else 0.0
    return {
        "zero_variance_frac": zero_variance_groups / num_groups if num_groups else 0.0,
        "adv_mean": mean,
        "adv_std": math.sqrt(var),
        "response_len_mean": sum(per_rollout) / num_rollouts if num_rollouts else 0.0,
        "response_len_max": float(max(per_rollout, default=0)),
    }


def no_signal_line(steps: Sequence[dict[str, float]], rollout_id: str | None) -> str:
    """Why the last ``len(steps)`` steps' metrics (each ``reward_mean`` <= 0, none before
    them above 0) taught nothing; ``rollout_id`` is a rollout to look at."""
    k = len(steps)
    means = [m.get("reward_mean", 0.0) for m in steps]
    flat = all(m.get("zero_variance_frac", 0.0) >= 1.0 for m in steps)
    versions = {m.get("policy_version") for m in steps}
    if flat and len(set(means)) == 1:
        what = f"every group's rewards are equal (all {means[0]:g}) for {k} steps"
    elif flat:
        what = f"every group's rewards are equal within the group for {k} steps"
    else:
        what = f"the reward has stayed at or below 0 since the first step ({k} steps)"
    version = next(iter(versions)) if len(versions) == 1 else None
    if flat and version is not None:
        what += f", so no update changed the policy (still v{int(version)})"
    look = (
        f": first rollout {rollout_id} (`tether rollouts show {rollout_id}`)" if rollout_id else ""
    )
    return (
        f"{what}: nothing to learn from — check the grader and the agent{look}; "
        "run.collapse_patience=0 trains on regardless"
    )


def first_rollout(store: Store, run_id: str) -> str | None:
    """The run's first finished rollout that is not an eval's (by its stored phase), to
    look at; an eval's when it has no other; None when none finished."""
    done = store.list_rollouts(run_id=run_id, status="succeeded")
    train = [r for r in done if r.place is None or r.place.phase is not Phase.EVAL]
    return (train or done)[0].id if (train or done) else None


def check_collapse(
    step: int,
    steps: Sequence[dict[str, float]],
    k: int,
    lr: float,
    first: Callable[[], str | None],
) -> None:
    """Stop the run at ``step`` once the last ``k`` of ``steps`` (every update's metrics;
    ``k`` is ``run.collapse_patience``, 0 = never) all had reward <= 0: a collapse
    (:class:`PolicyCollapsed`) when the reward was above 0 before them, else no learning
    signal from the start (:class:`NoLearningSignal`, naming ``first()``'s rollout)."""
    recent = steps[-k:] if k else []
    if not (k and len(recent) == k and all(m["reward_mean"] <= 0 for m in recent)):
        return
    if any(m.get("reward_mean", 0.0) > 0 for m in steps[:-k]):
        raise PolicyCollapsed(
            f"reward has been 0 for {k} updates in a row at step {step}, after steps "
            f"with reward: the policy collapsed; lower trainer.lr (now {lr:g}) or raise "
            "run.collapse_patience"
        )
    raise NoLearningSignal(no_signal_line(recent, first()))
