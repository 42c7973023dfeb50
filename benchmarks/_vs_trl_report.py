"""``vs_trl.py``'s summary: the model's weights hash and the markdown table over seeds."""

from __future__ import annotations

import hashlib
from pathlib import Path


def content_hash(folder: str) -> str:
    """sha256 of the folder's weights (its ``*.safetensors`` files, in name order): the
    starter's ``weights_sha256`` and the hash ``tether demo`` prints, for one file."""
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0


def table(rows: dict[str, list[dict]], steps: int) -> list[str]:
    """The markdown table: per trainer, mean ± sd over seeds."""
    out = [
        "| trainer | seeds | optimizer steps (of "
        f"{steps}) | steps with signal | reward, step 1 | reward, all steps | s/step "
        "| s/step from step 2 | greedy after | sampled after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for which, runs in rows.items():
        cells = [which, str(len(runs))]
        for key in ("optimizer_steps", "signal_steps"):
            m, sd = mean_sd([float(r[key]) for r in runs])
            cells.append(f"{m:.1f} ± {sd:.1f}")
        for part in (slice(0, 1), slice(None)):  # step 1: same weights, same tasks on both sides
            m, sd = mean_sd([sum(r["rewards"][part]) / len(r["rewards"][part]) for r in runs])
            cells.append(f"{m:.2f} ± {sd:.2f}")
        for skip in (0, 1):
            m, sd = mean_sd([sum(r["times"][skip:]) / len(r["times"][skip:]) for r in runs])
            cells.append(f"{m:.2f} ± {sd:.2f}")
        for key in ("greedy", "sampled"):
            m, sd = mean_sd([100 * r[key] for r in runs])
            cells.append(f"{m:.0f}% ± {sd:.0f}")
        out.append("| " + " | ".join(cells) + " |")
    return out
