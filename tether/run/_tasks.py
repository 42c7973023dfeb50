"""Task sets and the data order (a pure function of the seed and the step).

A JSONL file's tasks are split by their ``split`` field. When no line has one, a
seeded share (``tasks.holdout``, 10%) is held out as val, as
``train_test_split(test_size=0.1, seed=...)`` would, and :attr:`TaskSet.note`
says so on one line. What the agent receives of a task is its row without the
row's ``grader`` object and without ``tasks.private_fields`` (the calc tasks keep
their answer in ``grader``); :func:`exposed_fields` names the fields that look like
an answer and still reach the agent, for the run's one warning.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tether.errors import UserError
from tether.records import Split, Task
from tether.run.config import TasksConfig

__all__ = ["TaskSet", "exposed_fields", "load_task_set", "load_tasks", "tasks_for_step"]

#: Field names that usually hold what the grader compares against.
_ANSWER_LIKE = re.compile(r"answer|solution|expected|target|label|gold|reference", re.I)


@dataclass(frozen=True)
class TaskSet:
    train: list[Task]
    val: list[Task]
    note: str | None = None  # one line about how the split was made, when tether made it


def load_tasks(cfg: TasksConfig) -> tuple[list[Task], list[Task]]:
    """(train, val) tasks of :func:`load_task_set`."""
    tasks = load_task_set(cfg)
    return tasks.train, tasks.val


def load_task_set(cfg: TasksConfig) -> TaskSet:
    """The generated calc tasks, or a JSONL file's, split by their ``split`` field or held out."""
    private = tuple(cfg.private_fields)
    if cfg.source == "calc":
        from tether.starter.calc import make_tasks

        train, val = (  # each row's answer is in its "grader" object
            [
                Task(t["id"], t, split, private=private)
                for t in make_tasks(size, split.value, cfg.seed)
            ]
            for size, split in ((cfg.train_size, Split.TRAIN), (cfg.val_size, Split.VAL))
        )
        return TaskSet(train, val)
    path = Path(cfg.source)
    if not path.is_file():
        raise UserError(f"tasks.source ({cfg.source!r}) must be 'calc' or a JSONL file that exists")
    rows = _read_rows(path)
    if not any("split" in data for _, data in rows):
        return _held_out(path, rows, cfg)
    train, val = [], []
    for lineno, data in rows:
        split = data.get("split", "train")
        if split not in ("train", "val"):
            raise UserError(f"{path}:{lineno}: split ({split!r}) must be 'train' or 'val'")
        task = Task(_task_id(path, lineno, data), data, Split(split), private=private)
        (train if split == "train" else val).append(task)
    if not train:
        raise UserError(f'{path} has no train tasks (lines with "split": "train" or no split)')
    return TaskSet(train[: cfg.train_size], val[: cfg.val_size])


def _read_rows(path: Path) -> list[tuple[int, dict]]:
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{lineno} is not valid JSON") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}:{lineno} must be a JSON object (one task per line)")
        rows.append((lineno, data))
    if not rows:
        raise UserError(f"{path} has no tasks (one JSON object per line)")
    return rows


def _task_id(path: Path, lineno: int, data: dict) -> str:
    return str(data.get("id", f"{path.stem}-{lineno}"))


def _held_out(path: Path, rows: list[tuple[int, dict]], cfg: TasksConfig) -> TaskSet:
    """No line has a split: hold out ``cfg.holdout`` of the tasks as val (seeded)."""
    n = len(rows)
    k = min(max(round(n * cfg.holdout), 1), n - 1) if cfg.holdout and n >= 2 else 0
    k = min(k, cfg.val_size)
    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    held = set(order[:k])
    private = tuple(cfg.private_fields)
    train, val = [], []
    for i, (lineno, data) in enumerate(rows):
        split = Split.VAL if i in held else Split.TRAIN
        task = Task(_task_id(path, lineno, data), data, split, private=private)
        (val if i in held else train).append(task)
    note = (
        f"{path.name}: no split field: holding out {cfg.holdout:.0%} = {k} of {n} tasks as val "
        f"(seed {cfg.seed}; tasks.holdout)"
        if k
        else f"{path.name}: no split field and too few tasks to hold any out: no val tasks"
    )
    return TaskSet(train[: cfg.train_size], val, note)


def exposed_fields(tasks: list[Task]) -> list[str]:
    """The fields that look like an answer (``answer``, ``solution``, ``expected``,
    ``target``, ``label``, ...) and that the agent receives, over all ``tasks``."""
    seen: set[str] = set()
    for t in tasks:
        seen.update(k for k in t.for_agent if _ANSWER_LIKE.search(k))
    return sorted(seen)


def tasks_for_step(train: list[Task], step: int, batch_groups: int, seed: int) -> list[Task]:
    """The tasks of update ``step`` (from 1, the run's numbering): epochs of seeded
    permutations, sliced in order; update 1 takes the first ``batch_groups``.

    A pure function of (seed, step), so a resumed run sees exactly the data
    order of an uninterrupted one.
    """
    if step < 1:
        raise ValueError(f"step ({step}) must be >= 1: updates are numbered from 1")
    out: list[Task] = []
    pos = (step - 1) * batch_groups
    while len(out) < batch_groups:
        epoch, offset = divmod(pos, len(train))
        order = list(range(len(train)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        take = min(batch_groups - len(out), len(train) - offset)
        out.extend(train[i] for i in order[offset : offset + take])
        pos += take
    return out
