"""What ``tether rollouts list|show`` prints (rich tables to stdout)."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether.errors import UserError
from tether.records import RolloutStatus
from tether.store import NotFound

__all__ = ["print_rollout", "print_rollouts"]

out = Console()
#: Lines of an attempt's output tail that ``rollouts show`` prints (the store keeps 4 KiB).
TAIL_LINES = 40


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def print_rollouts(store: Any, *, run: str | None, status: str | None, limit: int) -> None:
    try:
        st = RolloutStatus(status) if status else None
    except ValueError:
        names = ", ".join(s.value for s in RolloutStatus)
        raise UserError(f"unknown status {status!r}: use one of {names}") from None
    total, found = store.latest_rollouts(run_id=run, status=st, limit=limit)
    cols = (
        "id", "run", "run_status", "group", "status", "attempt", "calls", "reward", "answer", "created"
    )  # fmt: skip
    data = []
    run_status = {run.id: run.status.value for run in store.list_runs()}
    for r, n_calls in found:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        data.append(
            (
                r.id,
                r.run_id or "-",
                run_status.get(r.run_id or "", "-"),
                r.group_id or "-",
                r.status.value,
                str(r.attempt),
                str(n_calls),
                reward,
                " ".join((r.final_answer or "").split())[:40],  # one line: TSV stays parseable
                _when(r.created_at),
            )
        )
    more = (
        f"the newest {len(found)} of {total} rollouts; --limit {total} for all"
        if len(found) < total
        else ""
    )
    if not out.is_terminal:  # piped: one tab-separated line per rollout, for grep and cut
        print("\t".join(cols))
        for row in data:
            print("\t".join(row))
        if more:  # on stderr: the rows on stdout stay parseable
            Console(stderr=True).print(more, highlight=False)
        return
    table = Table(title=f"{len(found)} of {total} rollouts" if more else f"{total} rollouts")
    for col in cols:
        table.add_column(col, overflow="fold")
    for row in data:
        table.add_row(*row)
    out.print(table)
    if more:
        out.print(more, highlight=False)


def run_tokenizer(store: Any, rollout_id: str) -> tuple[Any, str]:
    """(the tokenizer of the model the rollout's run served, "") or (None, why not).

    The model is the run record's ``model.path`` (``tether train``) or ``model``
    (``tether serve``); "starter" is the warm starter folder, never built here.
    """
    r = store.get_rollout(rollout_id)
    if r is None or not r.run_id:
        return None, "the rollout belongs to no run, so its model is unknown"
    model = store.get_run(r.run_id).config.get("model")
    if isinstance(model, dict):  # a training run's config
        model = model.get("path")
    if not model:
        return None, f"run {r.run_id}'s config names no model"
    from tether.models import cached_snapshot, load_tokenizer
    from tether.starter import is_starter, starter_path

    if model == "starter":  # as tether.run resolves it, without building it
        folder = starter_path(warm=True)
        if not is_starter(folder):
            return None, (
                f"the starter model is not built on this machine ({folder}): "
                "`python -m tether.starter --warm` builds it"
            )
        local: str | None = str(folder)
    else:  # a folder, or a hub id already in the local cache: never a download
        path = Path(model).expanduser()
        local = str(path) if path.is_dir() else cached_snapshot(model)
    if local is None:
        return None, f"the model {model} of run {r.run_id} is not on this machine"
    try:
        return load_tokenizer(local), ""
    except Exception as e:  # token text is a nicety; ids and logprobs are shown regardless
        return None, f"the tokenizer of {model} did not load ({type(e).__name__}: {e})"


def _stored_task(store: Any, r: Any) -> Any:
    """The rollout's task from its run's task set (the store's ``tasks``), or None."""
    if not (r.task_id and r.run_id):
        return None
    try:
        return store.get_task(r.task_id, run_id=r.run_id)
    except NotFound:  # opened through the admin API: the task is only inline
        return None


def print_rollout(store: Any, rollout_id: str, *, tokens: bool, tokenizer: Any = None) -> None:
    """Print one rollout; with ``tokens``, each completion token's text (decoded with
    ``tokenizer``, else the run's own, see :func:`run_tokenizer`), id and logprob."""
    r = store.get_rollout(rollout_id)
    if r is None:
        raise UserError(
            f"no rollout {rollout_id!r} in this store: `tether rollouts list` shows the ids"
        )
    out.print(
        f"[bold]rollout {r.id}[/]  status {r.status.value}  attempt {r.attempt}  "
        f"reward {r.reward if r.reward is not None else '-'}"
        f"{'  (' + r.reward_source.value + ')' if r.reward_source else ''}"
    )
    task = _stored_task(store, r)
    if task is not None:
        line = f"task {task.id} ({task.split.value}): {json.dumps(task.data)[:300]}"
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    elif r.task:
        out.print(f"task: {json.dumps(r.task)[:300]}")
    if r.final_answer:
        out.print(f"final answer: {r.final_answer!r}")
    if r.error:
        out.print(f"[red]error:[/] {r.error}", highlight=False)
    for a in store.attempts(rollout_id):
        _print_attempt(a)
    calls = store.calls(rollout_id)
    if calls:
        out.print(segments_line(calls), highlight=False, markup=False, soft_wrap=True)
    if tokens and tokenizer is None and any(c.completion_ids for c in calls):
        tokenizer, why = run_tokenizer(store, rollout_id)
        if tokenizer is None:
            out.print(f"token text not shown: {why}", markup=False, highlight=False, soft_wrap=True)
    for c in calls:
        role = f"  role {c.role}" if c.role is not None else ""
        out.rule(
            f"call {c.seq}{role}  policy v{c.policy_version}  {c.status.value}  "
            f"finish={c.finish_reason}  "
            f"T={c.temperature:g}  {c.latency_s * 1000:.1f} ms"
        )
        if c.constraint:  # the tokens were drawn under a grammar; logprobs are unmasked
            out.print(f"constrained: {c.constraint}", markup=False, highlight=False)
        last = (c.request.get("messages") or [{}])[-1]
        out.print(
            f"prompt: {len(c.prompt_ids)} tokens; last message ({last.get('role', '?')}): "
            f"{str(last.get('content'))[:200]!r}"
        )
        msg = c.response or {}
        if msg.get("tool_calls"):
            for tc in msg["tool_calls"]:
                out.print(f"tool call: {tc['function']['name']}({tc['function']['arguments']})")
        elif msg:
            out.print(f"reply: {str(msg.get('content'))[:300]!r}")
        if c.error:
            out.print(f"[red]error:[/] {c.error}")
        if tokens and c.completion_ids:
            table = Table(show_header=True, box=None)
            for col in ("#", "token", "id", "logprob", "prob"):
                table.add_column(col, justify="right")
            for i, (tid, lp) in enumerate(zip(c.completion_ids, c.logprobs, strict=True)):
                text = (
                    repr(tokenizer.decode([tid], skip_special_tokens=False)) if tokenizer else "-"
                )
                table.add_row(str(i), Text(text), str(tid), f"{lp:.4f}", f"{math.exp(lp):.3f}")
            out.print(table)


def segments_line(calls: list[Any]) -> str:
    """How the trainer cuts the calls into samples: ``samples: 1 (calls 0, 1, 2 merged)``, or
    ``samples: 2 (segments: calls 0, 1 | 2, 3; ...)`` where the token prefix broke."""
    from tether.trainer.segments import call_segments  # torch-free

    parts = [", ".join(str(c.seq) for c in seg.calls) for seg in call_segments(calls)]
    failed = sum(1 for c in calls if c.status.value != "ok")
    skipped = f"; {failed} failed call{'s' if failed != 1 else ''} not trained" if failed else ""
    if not parts:
        return f"samples: 0 (no successful call{skipped})"
    if len(parts) == 1:
        how = "merged" if "," in parts[0] else "alone"
        return f"samples: 1 (call{'s' if ',' in parts[0] else ''} {parts[0]} {how}{skipped})"
    return (
        f"samples: {len(parts)} (segments: calls {' | '.join(parts)}; a call whose prompt does "
        f"not extend an earlier call's tokens starts a new one{skipped})"
    )


def _print_attempt(a: Any) -> None:
    """One attempt's end: status, success, exit code, error, then its output tail."""
    parts = [f"attempt {a.attempt}: {a.status.value}"]
    if a.success is not None:
        parts.append("success" if a.success else "not a success")
    if a.exit_code is not None:
        parts.append(f"exit code {a.exit_code}")
    out.print("  ".join(parts), highlight=False, markup=False)
    if a.error:
        out.print(f"  error: {a.error}", highlight=False, markup=False)
    if a.grader_error:  # what the grader raised, with its traceback tail
        judged = bool(a.grade_detail)
        out.print(
            "  judge failed:" if judged else "  grader raised:", highlight=False, markup=False
        )
        for line in a.grader_error.rstrip("\n").splitlines():
            out.print(f"  | {line}", highlight=False, markup=False, soft_wrap=True)
    if a.grade_detail:
        _print_judgement(a.grade_detail)
    lines = a.output_tail.rstrip("\n").splitlines()
    if lines:
        cut = len(lines) > TAIL_LINES
        out.print(
            f"  output{f' (last {TAIL_LINES} lines)' if cut else ''}:",
            highlight=False,
            markup=False,
        )
        for line in lines[-TAIL_LINES:]:
            out.print(f"  | {line}", highlight=False, markup=False, soft_wrap=True)


def _print_judgement(d: dict[str, Any]) -> None:
    """What the judge saw and said for this attempt: model, scores, its answer, its prompt."""
    me = d.get("candidate")
    scores = d.get("scores")
    head = f"  judge {d.get('model', '?')}: candidate {me}"
    if isinstance(scores, dict):
        mine = scores.get(me)
        table = "  ".join(f"{k}={v:g}" for k, v in scores.items())
        head += f", score {mine:g}; the group: {table}"
    _say(head)
    why = (d.get("explanations") or {}).get(me)
    if why:
        _say(f"  judge's explanation: {why}")
    if "raw" in d:
        _say("  judge's answer:")
        for line in str(d["raw"]).splitlines() or [""]:
            _say(f"  | {line}")
    for m in d.get("messages") or []:
        _say(f"  judge's prompt ({m.get('role')}):")
        for line in str(m.get("content")).splitlines():
            _say(f"  | {line}")


def _say(line: str) -> None:
    out.print(line, highlight=False, markup=False, soft_wrap=True)
