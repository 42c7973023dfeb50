"""Loud agent failures: a collection whose rollouts mostly fail is said on one line.

A run whose agent cannot start (a missing ``node_modules``, an import error,
a wrong path) must not train quietly on reward 0. After each collection (a
training step's rollouts, or an eval's) :func:`check_collection`:

- raises :class:`AgentsFailing` when this is the run's first collection and
  every rollout failed: nothing was learned or measured, and the same fault
  would repeat for every step;
- otherwise logs one WARNING line when at least :data:`FAIL_SHARE` of the
  rollouts failed, or when they generated 0 completion tokens in all.

A grader that raises is said apart, with its exception and where in the
grader it was raised: :class:`GraderFailing` when it raised on every rollout of
a collection (any collection: nothing can be learned or measured), else one
WARNING line with the count.

"Failed" means not usable: the attempt did not succeed (agent exit code,
exception, timeout) or left no usable reward. A rollout that ran and earned
reward 0 did not fail. Each line names the counts and the first failure's
error with the last lines of its output tail (``tether rollouts show ID``
prints the whole tail).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tether.run._collect import RolloutOutcome
from tether.trainer.errors import AgentsFailing, GraderFailing

__all__ = ["FAIL_SHARE", "check_collection", "failure_line"]

log = logging.getLogger(__name__)

#: The share of failed rollouts in one collection from which a warning is logged.
FAIL_SHARE = 0.5
_TAIL_LINES = 5
_TAIL_CHARS = 400


def _short_tail(text: str) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()][-_TAIL_LINES:]
    joined = " | ".join(kept)
    return joined if len(joined) <= _TAIL_CHARS else "..." + joined[-_TAIL_CHARS:]


def failure_line(outcome: RolloutOutcome) -> str:
    """``<error>: <last lines of the output tail> (rollout ID)`` on one line."""
    reason = outcome.error or f"ended {outcome.status.value}"
    tail = _short_tail(outcome.output_tail)
    return f"{reason}{': ' + tail if tail else ''} (rollout {outcome.rollout_id})"


def check_collection(outcomes: Sequence[RolloutOutcome], what: str, *, first: bool) -> None:
    """Warn (or, for the run's ``first`` collection, raise) when ``outcomes`` mostly failed.

    ``what`` names the collection in the message: "the first step", "step 3",
    "the step-0 eval".
    """
    n = len(outcomes)
    if n == 0:
        return
    if _grader_raised(outcomes, what):
        return
    failed = [o for o in outcomes if not o.usable]
    if first and len(failed) == n:
        raise AgentsFailing(
            f"all {n} rollouts of {what} failed; first failure: {failure_line(failed[0])}"
        )
    if len(failed) >= FAIL_SHARE * n:
        log.warning(
            "%s: %d of %d rollouts failed; first failure: %s",
            what,
            len(failed),
            n,
            failure_line(failed[0]),
        )
    elif sum(len(c.completion_ids) for o in outcomes for c in o.calls) == 0:
        log.warning(
            "%s: the %d rollouts generated 0 completion tokens in all (does the agent call "
            "the model at OPENAI_BASE_URL?)",
            what,
            n,
        )


def _grader_raised(outcomes: Sequence[RolloutOutcome], what: str) -> bool:
    """Raise when the grader raised on every rollout; warn (and return True) when it
    raised on some and they are all the failures there were."""
    raised = [o for o in outcomes if o.grader_error]
    if not raised:
        return False
    first = raised[0]
    look = f"tether rollouts show {first.rollout_id}"
    judge = (first.error or "").startswith("the judge")  # a group grader's failed verdict
    if len(raised) == len(outcomes):
        line = first.error if judge else f"the grader raised {first.grader_error}"
        fix = (
            "check the judge (" + look + " has its prompt and answer)"
            if judge
            else (f"fix the grader ({look} has the traceback)")
        )
        raise GraderFailing(f"{line} on every rollout of {what}; {fix}")
    log.warning(
        "%s: the %s on %d of %d rollouts (unusable, not reward 0): %s (%s)",
        what,
        "judge failed" if judge else "grader raised",
        len(raised),
        len(outcomes),
        first.grader_error,
        look,
    )
    return len(raised) == sum(1 for o in outcomes if not o.usable)
