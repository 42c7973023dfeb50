"""``tether check``: what a training run would do, and every problem that can be found
before a model loads. ``tether train`` runs the same checks first.

Each check uses the run's own loader: the agent is imported as the runner imports it
(``tether.runner.load_callable``, or the in-process runner itself), the grader by
``tether.run``'s ``load_grader``, the tasks by ``load_task_set``, the model folder by
``resolve_model_path``, the run folder by ``check_new_run``. No model is loaded: the
tokenizer renders one task as a user message through the chat template, as the
gateway renders prompts. A check that fails adds one line to :attr:`Report.problems`
and the others still run.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tether.errors import UserError
from tether.run import TrainConfig

__all__ = ["Report", "check_run", "problems_error"]

T = TypeVar("T")


@dataclass
class Report:
    """What the run would do (a line each) and what stops it (a line each)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def attempt(self, check: Callable[[], T]) -> T | None:
        """``check()``, or None with its error as a problem line."""
        try:
            return check()
        except UserError as exc:
            self.problems.append(str(exc))
        except Exception as exc:  # an agent or grader module that raises on import
            self.problems.append(f"{type(exc).__name__}: {exc}")
        return None


def problems_error(problems: list[str]) -> UserError:
    """One problem as its own line; several under a heading, one line each."""
    if len(problems) == 1:
        return UserError(problems[0])
    rows = "\n".join(f"  {p}" for p in problems)
    return UserError(f"{len(problems)} problems found before loading the model:\n{rows}")


def check_run(cfg: TrainConfig) -> Report:
    """Every check of ``cfg`` (a config that loaded), in the order the run needs them."""
    report = Report()
    if not cfg.resume:
        from tether.run import check_new_run

        report.attempt(lambda: check_new_run(Path(cfg.dir), cfg.name))
    report.attempt(lambda: _agent(cfg, report))
    report.attempt(lambda: _grader(cfg, report))
    tasks = report.attempt(lambda: _tasks(cfg, report))
    tokenizer = report.attempt(lambda: _model(cfg, report))
    if tokenizer is not None and tasks:
        report.attempt(lambda: _prompt(tokenizer, tasks[0], report))
    _plan(cfg, report)
    return report


def _agent(cfg: TrainConfig, report: Report) -> None:
    a = cfg.agent
    if a.runner != "local":
        report.lines.append(f"agent: {a.mode} on {a.runner} (imported there, not checked here)")
        return
    if a.mode == "process":
        _command(a.command or [], a.cwd)
        report.lines.append(f"agent: a process per rollout: {shlex.join(a.command or [])}")
        return
    if a.mode == "inprocess":
        from tether.runner import make_runner

        make_runner(a)  # imports the agent and checks it is an async def
    else:
        _import_pool_agent(str(a.entry), a.cwd)
    report.lines.append(f"agent: {a.entry} ({a.mode}, {a.concurrency} at a time), imported")


def _import_pool_agent(spec: str, cwd: str | None) -> None:
    """Import the agent as a pool worker does (``sys.argv`` its file or module), leaving
    this process's ``sys.path`` and ``sys.argv`` as they were."""
    from tether.runner import AgentLoadError, load_callable

    path, argv = list(sys.path), sys.argv
    sys.argv = [spec.partition(":")[0]]
    try:
        load_callable(spec, cwd)
    except (Exception, SystemExit) as exc:  # an agent that parses its argv at import
        message = f"cannot import agent ({spec!r}): {type(exc).__name__}: {exc}"
        raise AgentLoadError(message) from None
    finally:
        sys.path[:], sys.argv = path, argv


def _command(command: list[str], cwd: str | None) -> None:
    """The program of ``agent.command`` is on PATH, and each ``.py`` word names a file."""
    if command and shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise UserError(f"agent.command: {command[0]!r} is not a program on PATH or a file")
    base = Path(cwd) if cwd else Path.cwd()
    for word in command[1:]:
        if word.endswith(".py") and not (base / word).is_file():
            raise UserError(
                f"agent.command names {word}, which does not exist in {base}: fix the path "
                "(in a config file, relative to its folder)"
            )


def _grader(cfg: TrainConfig, report: Report) -> None:
    spec = cfg.rollout.grader
    if spec == "judge":
        j = cfg.rollout.judge
        report.lines.append(f"grader: judge {j.model} at {j.base_url} (not contacted here)")
        return
    if not spec:
        report.lines.append("grader: none (the agent reports its own reward)")
        return
    from tether.run import load_grader

    file = spec.partition(":")[0]
    if file.endswith(".py") and not Path(file).is_file():
        raise UserError(
            f"rollout.grader names {file}, which does not exist: fix the path (in a config "
            "file, relative to its folder)"
        )
    load_grader(spec)
    report.lines.append(f"grader: {spec}, imported")


def _tasks(cfg: TrainConfig, report: Report) -> list[Any]:
    from tether.run import load_task_set

    tasks = load_task_set(cfg.tasks)
    source = "calc (generated)" if cfg.tasks.source == "calc" else cfg.tasks.source
    report.lines.append(f"tasks: {source}: {len(tasks.train)} train, {len(tasks.val)} val")
    if tasks.note:
        report.lines.append(f"  {tasks.note}")
    return tasks.train + tasks.val


def _model(cfg: TrainConfig, report: Report) -> Any:
    """The tokenizer of ``model.path`` (None: the starter is not built yet)."""
    m = cfg.model
    if m.path == "starter":
        from tether.starter import is_starter, starter_path

        path = starter_path(warm=True)
        if not is_starter(path):
            report.lines.append(f"model: starter, not built yet (tether train builds it in {path})")
            return None
    else:
        from tether.run import resolve_model_path

        path = resolve_model_path(m.path)
    from tether.models import load_tokenizer

    where = "" if str(path) == m.path else f" ({path})"
    report.lines.append(f"model: {m.path}{where} on {m.device}, trained in {m.train_dtype}")
    return load_tokenizer(path)


def _prompt(tokenizer: Any, task: Any, report: Report) -> None:
    from tether.chat import render_prompt

    text = json.dumps(task.for_agent)
    ids = render_prompt(tokenizer, [{"role": "user", "content": text}])
    report.lines.append(
        f"prompt: task {task.id} as a user message is {len(ids)} tokens through the chat template"
    )


def _plan(cfg: TrainConfig, report: Report) -> None:
    e, r, t, c = cfg.engine, cfg.rollout, cfg.trainer, cfg.checkpoint
    engine = "embedded (transformers)" if not e.remote else f"{e.kind} at {', '.join(e.urls)}"
    run_dir = Path(cfg.dir) / cfg.name
    every = f"every {c.every} updates and at the end" if c.every else "at the end"
    report.lines += [
        f"engine: {engine}",
        f"updates: {t.steps} ({cfg.run.mode}), {t.advantage}; {r.batch_groups} groups x {r.n} "
        f"rollouts = {r.batch_groups * r.n} rollouts per update",
        f"store: {run_dir / 'traces.sqlite'}",
        f"checkpoints: {run_dir / 'checkpoints'} ({every}, keep {c.keep})",
    ]
