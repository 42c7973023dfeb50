"""Write the calc task data as JSON lines: ``train.jsonl`` and ``val.jsonl``.

    python examples/calc/tasks.py --out data/calc --train 2000 --val 200

Each line is one task, ``{"id", "question", "grader": {"answer": N}}``: the
``grader`` object goes to the grader only, never to the agent. The splits never
share a question (the split is fixed by a hash of the question text).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tether.starter.calc import make_tasks


def write_tasks(out: Path, n_train: int, n_val: int, seed: int = 0) -> dict[str, Path]:
    """Write both splits under ``out``; return the file of each split."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.jsonl"
        with path.open("w") as handle:
            for task in make_tasks(n, split, seed=seed):
                handle.write(json.dumps(task) + "\n")
        files[split] = path
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/calc"))
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for split, path in write_tasks(args.out, args.train, args.val, args.seed).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
