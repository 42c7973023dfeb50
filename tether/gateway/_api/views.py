"""JSON views of stored records for the admin routes and the CLI."""

from __future__ import annotations

from typing import Any

from tether.records import Call, Rollout

__all__ = ["call_view", "rollout_view"]


def rollout_view(r: Rollout) -> dict[str, Any]:
    return {
        "id": r.id,
        "run_id": r.run_id,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "status": r.status.value,
        "attempt": r.attempt,
        "reward": r.reward,
        "reward_source": r.reward_source.value if r.reward_source else None,
        "usable": r.usable,
        "final_answer": r.final_answer,
        "error": r.error,
        "task": r.task,
        "created_at": r.created_at,
        "finished_at": r.finished_at,
    }


def call_view(c: Call) -> dict[str, Any]:
    return {
        "seq": c.seq,
        "attempt": c.attempt,
        "status": c.status.value,
        "policy_version": c.policy_version,
        "finish_reason": c.finish_reason,
        "temperature": c.temperature,
        "latency_s": c.latency_s,
        "prompt_ids": c.prompt_ids,
        "completion_ids": c.completion_ids,
        "logprobs": c.logprobs,
        "request": c.request,
        "response": c.response,
        "error": c.error,
    }
