"""A rollout's place (phase, step, group, index) is stored, never parsed back from its ids
(STYLE.md rule 13): no code in ``tether/`` reads a group or rollout id apart. The store's
migration 10 is the one exception: it filled the place columns of old stores from the ids
the loop minted then. The gateway's ``derived_seed`` names a rollout by its id without the
run's prefix to seed its sampling (a name, not a place; reruns must draw the same)."""

from __future__ import annotations

import re
from pathlib import Path

TETHER = Path(__file__).resolve().parents[1] / "tether"

#: what the old parsers looked like: a substring test on an id, slicing or matching a group
#: or rollout id, the regexes that read tags (``s3-g1``, ``eval0-s``) back
OLD_PATTERNS = {
    "an id tested for '-eval'": re.compile(r"""["']-eval"""),
    "a substring test on an id": re.compile(r"""["'][^"']*["']\s+(?:not\s+)?in\s+[\w.]*\.id\b"""),
    "a group or rollout id taken apart": re.compile(
        r"(?:group_id|rollout_id|\bgid|\brid|\br\.id|\brollout\.id)\s*(?:\[[^\]]*:|\.(?:startswith|endswith|split"
        r"|rsplit|removeprefix|removesuffix|partition|rpartition)\()"
    ),
    "a tag regex": re.compile(
        r"""-g\\d|-g\(\?P|eval\(\?P|eval\\d|[(|]eval\)|s\(\\d|s\(\?P<step>"""
    ),
    "the old tag parsers": re.compile(r"\b_TAG\b|\b_INDEX\b|\b_GROUP\s*=\s*re\.compile"),
}
#: (file, the line's text): the places allowed to read an id
ALLOWED = {
    ("store/_migrations.py", None),  # migrations 7 and 10: old stores, once
    (
        "gateway/_core/rollouts.py",
        'name = rollout_id.removeprefix(f"{run_id}-") if run_id else rollout_id',
    ),
}


def _found() -> list[str]:
    hits = []
    for path in sorted(TETHER.rglob("*.py")):
        rel = path.relative_to(TETHER).as_posix()
        if (rel, None) in ALLOWED:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for what, pattern in OLD_PATTERNS.items():
                if pattern.search(line) and (rel, line.strip()) not in ALLOWED:
                    hits.append(f"tether/{rel}:{n}: {what}: {line.strip()}")
    return hits


def test_no_code_reads_a_rollouts_place_from_its_ids() -> None:
    assert _found() == []


def test_the_patterns_catch_the_parsers_they_replace() -> None:
    """Each old parser, as it was written, is caught (the check can fail)."""
    old = [
        'train = [r for r in done if "-eval" not in r.id]',
        'tail = group_id.removeprefix(f"{run_id}-") if run_id else group_id',
        "m = _TAG.fullmatch(gid[len(prefix) :]) if prefix and gid.startswith(prefix) else None",
        "found = _INDEX.search(rollout.id)",
        '_GROUP = re.compile(r"-(s|eval)(\\d+)(?:-(s|g))?-g\\d+$")',
        'index = int(found.group(1)) if found and rollout.id.startswith(gid + "-") else None',
    ]
    for line in old:
        assert any(p.search(line) for p in OLD_PATTERNS.values()), line
