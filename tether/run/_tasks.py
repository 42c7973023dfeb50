"""Task sets and the data order (a pure function of the seed and the step)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tether.errors import UserError
from tether.records import Split, Task
from tether.run.config import TasksConfig

__all__ = ["load_tasks", "tasks_for_step"]


def load_tasks(cfg: TasksConfig) -> tuple[list[Task], list[Task]]:
    """(train, val) tasks: the generated calc tasks, or a JSONL file with a ``split`` per line."""
    if cfg.source == "calc":
        from tether.starter.calc import make_tasks

        train = [
            Task(id=t["id"], data=t, split=Split.TRAIN)
            for t in make_tasks(cfg.train_size, "train", cfg.seed)
        ]
        val = [
            Task(id=t["id"], data=t, split=Split.VAL)
            for t in make_tasks(cfg.val_size, "val", cfg.seed)
        ]
        return train, val
    path = Path(cfg.source)
    if not path.is_file():
        raise UserError(f"tasks.source ({cfg.source!r}) must be 'calc' or a JSONL file that exists")
    train, val = [], []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{lineno} is not valid JSON") from None
        split = data.get("split", "train")
        if split not in ("train", "val"):
            raise UserError(f"{path}:{lineno}: split ({split!r}) must be 'train' or 'val'")
        task = Task(id=str(data.get("id", f"{path.stem}-{lineno}")), data=data, split=Split(split))
        (train if split == "train" else val).append(task)
    if not train:
        raise UserError(f'{path} has no train tasks (lines with "split": "train" or no split)')
    return train[: cfg.train_size], val[: cfg.val_size]


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
