"""``tether export`` and ``tether report``: a run's store as rows, samples or an HTML page.

RUN resolves as for ``tether rollouts list`` (``_stores.py``): a run name
under ``runs/``, a run folder, or ``--store FILE``. Files go to the run
folder unless ``--out`` says where.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tether.cli._stores import store_path
from tether.errors import UserError
from tether.store import Store

__all__ = ["run_export", "run_report"]


def _open(run: str, store: Path | None) -> tuple[Path, Store]:
    path = store_path(store, run)
    return path, Store(path)


def run_export(
    run: str,
    store: Path | None,
    fmt: str,
    out: Path | None,
    *,
    samples: bool,
    step: int | None,
    run_id: str | None,
    console: Console,
) -> Path:
    """Rollout attempts (or, with ``samples``, one update's training samples) to a file."""
    from tether.tracking import (
        EXPORT_FORMATS,
        export_attempts,
        step_samples,
        training_sample_rows,
        write_rows,
    )

    if fmt not in EXPORT_FORMATS:
        raise UserError(f"--format {fmt!r} is not known: use --format jsonl or --format parquet")
    if step is not None and not samples:
        raise UserError("--step picks the update of --samples: add --samples, or drop --step")
    path, db = _open(run, store)
    with db:
        if samples:
            found = step_samples(db, step, run_id)
            dest = out or path.parent / "export" / f"samples-step{found.step}.{fmt}"
            n = write_rows(training_sample_rows(found), dest, fmt, samples=True)
            note = "" if found.updated else " (this step made no update: no group had variance)"
            console.print(
                f"wrote {n} training samples of step {found.step} ({found.run_id}) to {dest}{note}",
                highlight=False,
            )
        else:
            if run_id is not None and run_id not in {r.id for r in db.list_runs()}:
                raise UserError(f"no run record {run_id!r} in {path}: leave out --run-id")
            dest = out or path.parent / "export" / f"rollouts.{fmt}"
            n = write_rows(export_attempts(db, run_id), dest, fmt)
            console.print(f"wrote {n} rollout attempts to {dest}", highlight=False)
    return dest


def run_report(run: str, store: Path | None, out: Path | None, console: Console) -> Path:
    """The run's self-contained HTML report (curves and held-out table)."""
    from tether.tracking import write_report

    path, db = _open(run, store)
    with db:
        dest = write_report(db, out or path.parent / "report.html", path.parent.name)
    console.print(f"report: {dest}", highlight=False)
    return dest
