"""The calc agent as an in-process callable: ``async def agent(task, client)``.

tether runs it inside its own process with an ``AsyncOpenAI`` client already
pointed at the rollout (base URL and key set); it returns the final answer
text, and the run's grader turns that into the reward. The loop is the same
as ``agent.py`` (at most four model calls, calculator calls run locally); the
code lives in :mod:`tether.starter.calc` because ``tether demo`` uses it, so
this file only names it for configs:

    agent:
      mode: inprocess
      entry: examples/calc/agent_async.py:agent
"""

from __future__ import annotations

from tether.starter.calc import agent

__all__ = ["agent"]
