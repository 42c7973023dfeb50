"""What the gateway benchmarks send and get back: one calc-agent chat call, and percentiles.

Shared by gateway_overhead.py and gateway_load.py (run as scripts, so this
folder is on ``sys.path``).
"""

from __future__ import annotations

SYSTEM = (
    "You are a careful calculator agent. Use the calculator tool for every computation "
    "and answer with the final number only."
)
# Callers vary {n}, so no two prompts are the same.
USER = "Ana buys {n} pencils at 17 cents each and pays with 5 dollars. How much change, in cents?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression; returns the number.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
# The null engine's completion: one tool call.
ANSWER = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "500-17*25"}}\n</tool_call>'
)
KEY_ENV = "TETHER_BENCH_ADMIN_KEY"


def pct(sorted_s: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted seconds, in ms."""
    return 1e3 * sorted_s[min(len(sorted_s) - 1, max(0, round(q / 100 * len(sorted_s)) - 1))]
