"""Server-side HTML: Jinja2 templates with autoescaping on, and the formatting filters.

Everything a store holds (prompts, completions, tool results, configs, errors) is
text to the templates: autoescape turns ``<script>`` into ``&lt;script&gt;``, and
the pages' Content-Security-Policy (``script-src 'self'``) would block an inline
script even if some text got through unescaped.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import jinja2

__all__ = ["head_fields", "render"]

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("tether.dashboard", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + " UTC"


def _pct(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.0%}"


def _num(v: float | dict[int, float] | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):  # per call seq (trainer.credit: turn)
        return " · ".join(f"{k}: {_num(x, digits)}" for k, x in sorted(v.items()))
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _dur(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _as_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


_env.filters.update(when=_when, pct=_pct, num=_num, dur=_dur, as_json=_as_json)


def render(template: str, **context: Any) -> str:
    return _env.get_template(template).render(**context)


def head_fields(run: dict[str, Any]) -> dict[str, str]:
    """The run header's live fields (``data-field`` in ``_runhead.html``) as text."""
    total = f" / {run['total_steps']}" if run.get("total_steps") else ""
    return {
        "steps": f"{run['steps']}{total}",
        "last_at": _when(run["last_at"]),
        "rollouts": f"{run['rollouts']} ({run['calls']} calls)",
        "best": f"sampled {_pct(run['best_sampled'])}, greedy {_pct(run['best_greedy'])}",
    }
