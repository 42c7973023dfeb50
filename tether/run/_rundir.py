"""A run's folder: one training run per ``{dir}/{name}``, and where ``--resume`` continues it.

A run folder holds one training run: its trace store (``traces.sqlite``) and
its ``checkpoints/``. ``tether train`` refuses a new run under a name whose
folder already holds one (:func:`check_new_run`: continue it with
``--resume``, or pick the free name it suggests). Only a checkpoint holds a name
(:func:`holds_run`): a run stopped before its first one has nothing to resume, so
the same command starts it again; records that ``tether eval`` left, or a run that
failed at its first eval, stay in the store and do not count.

Resuming (:func:`resume_point`) continues from the run's newest checkpoint:
its step, its engine policy version and its run id (``state.json``, see
:mod:`tether.trainer.checkpoint`). Each resumed session is a new run record
in the same store, linked to the one it continues by ``extra.resumed_from``
(that record's id) and ``extra.resumed_at`` (the checkpoint's step), so that
rollout ids stay unique when a step the killed session had started is done
again. :func:`past_metrics` follows those links back to the first record and
returns the metrics of every step up to the resume point (the checkpoint's
step: updates 1..N, evals 0..N), each from the session that finished it, so the reward curve and the before/after summary
cover the whole run.

The record itself: the config as it holds it (:func:`record_config`, with those
links) and the status a run ends with (:func:`end_status`).
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.configio import dump
from tether.errors import Interrupted, UserError
from tether.records import RunStatus
from tether.run.config import TrainConfig
from tether.store import NotFound, Store, StoreError
from tether.trainer.checkpoint import checkpoint_state, latest_checkpoint

__all__ = [
    "ResumePoint",
    "check_new_run",
    "free_name",
    "holds_run",
    "past_metrics",
    "resume_point",
    "unreadable_store",
]


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a training run that ``--resume`` can continue: a checkpoint.

    A folder without one (a run interrupted, or failed, before its first checkpoint; an
    eval's records) leaves the name free: training again under it starts the run afresh,
    and the earlier records stay in its store beside the new one. A store this tether
    cannot read (written by another tether version, or damaged; :func:`unreadable_store`)
    also counts as holding a run: the name is refused, not written into. Looking opens the
    store read-only (``peek``: no file is made beside it, nothing migrated).
    """
    if latest_checkpoint(run_dir / "checkpoints") is not None:
        return True
    return unreadable_store(run_dir) is not None


def unreadable_store(run_dir: Path) -> str | None:
    """Why ``run_dir``'s trace store cannot be read (None: it can, or there is none)."""
    db = run_dir / "traces.sqlite"
    if not db.is_file():
        return None
    try:
        Store(db, peek=True).close()
    except StoreError as exc:
        return str(exc)
    return None


def free_name(directory: Path, name: str) -> str:
    """``name-2``, ``name-3``, ... (or the next number after ``name``'s own): the first unused."""
    m = re.fullmatch(r"(.*)-(\d+)", name)
    stem, n = (m.group(1), int(m.group(2)) + 1) if m else (name, 2)
    while holds_run(directory / f"{stem}-{n}"):
        n += 1
    return f"{stem}-{n}"


def check_new_run(directory: Path, name: str) -> None:
    """Refuse a new run whose folder already holds one; the error offers both fixes."""
    run_dir = directory / name
    why = unreadable_store(run_dir)
    if why is not None and latest_checkpoint(run_dir / "checkpoints") is None:
        raise UserError(
            f"run {name!r} in {run_dir} has a trace store this tether cannot read ({why}): "
            f"start a new run with name={free_name(directory, name)}"
        )
    if holds_run(run_dir):
        raise UserError(
            f"run {name!r} already exists in {run_dir}: continue it with --resume, "
            f"or start a new one with name={free_name(directory, name)}"
        )


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: a checkpoint and what its ``state.json`` says."""

    path: Path
    step: int
    policy_version: int | None  # None: a checkpoint from before tether recorded it
    run: str | None  # the run's first record id (checkpoints are pruned per run)
    run_id: str | None  # the record that wrote the checkpoint


def resume_point(directory: Path, name: str, steps: int) -> ResumePoint:
    """The newest checkpoint of run ``name`` to continue ``trainer.steps`` = ``steps`` from.

    One-line :class:`UserError` when there is nothing to resume, or nothing left to do.
    """
    run_dir = directory / name
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        where = (
            f"no checkpoint in {run_dir / 'checkpoints'}"
            if run_dir.is_dir()
            else f"no run folder {run_dir}"
        )
        fix = (
            "drop --resume to start it"
            if not holds_run(run_dir)  # interrupted before its first checkpoint: start again
            else f"drop --resume and start a new run with name={free_name(directory, name)}"
        )
        raise UserError(f"cannot resume run {name!r}: {where}; {fix}")
    state = checkpoint_state(ckpt)
    step = int(state.get("step", int(ckpt.name.removeprefix("step-"))))
    if step >= steps:
        raise UserError(
            f"run {name!r} is finished: its last checkpoint {ckpt} is step {step} of "
            f"trainer.steps={steps}; to train it further raise trainer.steps "
            f"(e.g. trainer.steps={step + steps}) with --resume"
        )
    version = state.get("policy_version")
    return ResumePoint(
        ckpt,
        step,
        None if version is None else int(version),
        state.get("run"),
        state.get("run_id"),
    )


def _chain(store: Store, run_id: str) -> list[tuple[str, int]]:
    """(record id, first step) of each session of the run, oldest first."""
    chain: list[tuple[str, int]] = []
    seen: set[str] = set()
    current: str | None = run_id
    while current and current not in seen:
        seen.add(current)
        try:
            config = store.get_run(current).config
        except NotFound:  # a record that is not there (the store was replaced): stop here
            break
        extra = config.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        chain.append((current, int(extra.get("resumed_at") or 0)))
        current = extra.get("resumed_from")
    return chain[::-1]


def past_metrics(
    store: Store, run_id: str, upto: int
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """(update metrics by step <= ``upto``, eval metrics by step <= ``upto``) of run ``run_id``:
    what the run did up to its checkpoint at step ``upto`` (updates 1..upto, evals 0..upto).

    ``run_id`` is the record that wrote the checkpoint at step ``upto``; the links
    ``resumed_from``/``resumed_at`` lead back to the first one. A step done twice (by a
    session that was killed before its next checkpoint, then by the one that resumed) counts
    as the later session's.
    """
    chain = _chain(store, run_id)
    steps: dict[int, dict[str, float]] = {}
    evals: dict[int, dict[str, float]] = {}
    for i, (rid, start) in enumerate(chain):
        end = chain[i + 1][1] if i + 1 < len(chain) else upto
        mine: dict[int, dict[str, float]] = defaultdict(dict)
        for m in store.metrics(rid):
            mine[m.step][m.name] = m.value
        for step, values in mine.items():
            train = {k: v for k, v in values.items() if not k.startswith("eval/")}
            ev = {k: v for k, v in values.items() if k.startswith("eval/")}
            if train and start < step <= end:
                steps[step] = train
            if ev and start <= step <= end:
                evals[step] = ev
    return dict(sorted(steps.items())), dict(sorted(evals.items()))


def record_config(cfg: TrainConfig, command: str, resume: ResumePoint | None) -> dict[str, Any]:
    """``cfg`` as the run's store record holds it: ``extra`` says an eval's record is not a
    training run, and links a resumed session to the record it continues (see _rundir.py)."""
    record = dump(cfg)
    notes = dict(record.get("extra") or {})
    if command != "train":
        notes["command"] = command
    if resume is not None and resume.run_id is not None:
        notes.update(resumed_from=resume.run_id, resumed_at=resume.step)
    record["extra"] = notes
    return record


def end_status(exc_type: object) -> RunStatus:
    """A run's final status from the exception that ended it (None: it finished)."""
    if exc_type is None:
        return RunStatus.FINISHED
    if isinstance(exc_type, type) and issubclass(
        exc_type, (Interrupted, KeyboardInterrupt, asyncio.CancelledError)
    ):
        return RunStatus.INTERRUPTED  # Ctrl-C or SIGTERM (Interrupts cancels the main task)
    return RunStatus.FAILED
