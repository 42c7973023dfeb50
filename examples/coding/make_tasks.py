"""Write the coding tasks (``tasks.jsonl``) from the buggy repositories under ``repos/``.

    python examples/coding/make_tasks.py     # rewrites examples/coding/tasks.jsonl

Each repository ``repos/NAME/`` holds the code, its visible tests
(``tests/``), an ``ISSUE.md`` (the bug report the agent is given), the hidden
tests the grader runs (``hidden/``) and a reference fix (``solution/``, used
only by tether's own tests). A task carries the visible files only::

    {"id", "split", "repo", "instruction", "files": {"roman.py": "...", "tests/test_roman.py": "..."}}

so the agent needs nothing but its task; the grader reads ``hidden/`` itself.
Repositories in ``VAL_REPOS`` are the val split. A test checks that the
committed ``tasks.jsonl`` is what this script writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOS = HERE / "repos"
VAL_REPOS = ("bsearch", "slugify")
PRIVATE = ("hidden", "solution", "ISSUE.md")


def visible_files(repo: Path) -> dict[str, str]:
    """The files the agent sees: everything but the hidden tests, the fix and the issue."""
    out = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if path.is_file() and rel.parts[0] not in PRIVATE and "__pycache__" not in rel.parts:
            out[rel.as_posix()] = path.read_text()
    return out


def make_tasks(repos: Path = REPOS) -> list[dict[str, Any]]:
    """One task per repository, train first then val, in name order."""
    names = sorted(p.name for p in repos.iterdir() if (p / "ISSUE.md").is_file())
    tasks = []
    for split in ("train", "val"):
        for name in names:
            if (name in VAL_REPOS) != (split == "val"):
                continue
            repo = repos / name
            tasks.append(
                {
                    "id": f"coding-{name}",
                    "split": split,
                    "repo": name,
                    "instruction": (repo / "ISSUE.md").read_text().strip(),
                    "files": visible_files(repo),
                }
            )
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tasks.jsonl")
    args = parser.parse_args()
    tasks = make_tasks()
    args.out.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    print(f"{len(tasks)} tasks -> {args.out}")


if __name__ == "__main__":
    main()
