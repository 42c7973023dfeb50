"""Relative paths in a config file are relative to the file's folder.

``tether train path/to/config.yaml`` works from any directory: before the
command-line overrides are applied, :func:`resolve_file_paths` rewrites the
relative paths written in the file into absolute ones, against the folder of
the file. Overrides (``agent.entry=...`` on the command line) are not touched:
the user typed them from the current directory, and that is what they are
relative to. What moves, and how:

=====================  ==========================================================
``agent.entry``        ``path/file.py:function`` → the file's folder
                       (``module:function`` is left alone); relative to
                       ``agent.cwd`` instead when the file sets it
``agent.cwd``          → the file's folder
``agent.command``      each word that names an existing file or folder
                       relative to the file's folder (``agent.py``,
                       ``./run.sh``, ``dist/agent.js``) becomes its absolute
                       path; other words (``python``, ``-u``, ``node``) stay.
                       The agent still starts in the current directory (or
                       ``agent.cwd``); with ``agent.cwd`` set, words are left
                       as written (they are relative to that cwd)
``tasks.source``       a JSONL path → the file's folder (``calc`` stays)
``rollout.grader``     ``path/file.py:function`` → the file's folder
``rollout.judge.``     ``rubric_file`` → the file's folder
``agent.kubernetes.``  ``template`` → the file's folder (tether reads it here)
=====================  ==========================================================

Agents of ``agent.runner: ray`` or ``kubernetes`` run on other machines, so
their ``entry`` and ``command`` are left as written. ``dir`` (where runs go)
and ``model.path`` (a folder or a hub id such as ``Qwen/Qwen2.5-1.5B``) stay
relative to the current directory; :func:`resolve_model_path` turns ``model.path``
into the folder (or hub id) a run loads.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

__all__ = ["resolve_file_paths", "resolve_model_path"]


def _under(folder: Path, path: str) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (folder / p).resolve())


def _spec(folder: Path, spec: Any) -> Any:
    """``path/file.py:fn`` with its path made absolute; ``module:fn`` and non-strings unchanged."""
    if not isinstance(spec, str) or ":" not in spec:
        return spec
    target, _, attr = spec.rpartition(":")
    if not (target.endswith(".py") or "/" in target):
        return spec
    return f"{_under(folder, target)}:{attr}"


def _command(folder: Path, command: Any) -> Any:
    words = shlex.split(command) if isinstance(command, str) else command
    if not isinstance(words, list):
        return command
    out = []
    for w in words:
        plain = isinstance(w, str) and w and not w.startswith("-") and not Path(w).is_absolute()
        if plain and (folder / w).exists():
            w = str((folder / w).resolve())
        out.append(w)
    return out


def resolve_file_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Make the relative paths in a config file's mapping absolute, against ``folder``."""
    folder = folder.resolve()
    agent = data.get("agent")
    if isinstance(agent, dict):
        local = agent.get("runner", "local") == "local"
        if isinstance(agent.get("cwd"), str):
            agent["cwd"] = _under(folder, agent["cwd"])
        base = Path(agent["cwd"]) if isinstance(agent.get("cwd"), str) else folder
        for key in ("entry", "agent"):  # agent.agent: entry's old name (RunnerConfig.renamed)
            if local and key in agent:
                agent[key] = _spec(base, agent[key])
        if local and agent.get("command") and not isinstance(agent.get("cwd"), str):
            agent["command"] = _command(folder, agent["command"])
        k8s = agent.get("kubernetes")
        if isinstance(k8s, dict) and isinstance(k8s.get("template"), str) and k8s["template"]:
            k8s["template"] = _under(folder, k8s["template"])
    tasks = data.get("tasks")
    source = tasks.get("source") if isinstance(tasks, dict) else None
    if isinstance(tasks, dict) and isinstance(source, str) and source not in ("", "calc"):
        tasks["source"] = _under(folder, source)
    rollout = data.get("rollout")
    if isinstance(rollout, dict) and "grader" in rollout:
        rollout["grader"] = _spec(folder, rollout["grader"])
    judge = rollout.get("judge") if isinstance(rollout, dict) else None
    if (
        isinstance(judge, dict)
        and isinstance(judge.get("rubric_file"), str)
        and judge["rubric_file"]
    ):
        judge["rubric_file"] = _under(folder, judge["rubric_file"])
    return data


def resolve_model_path(path: str | Path) -> Path:
    """``model.path`` as a folder: the starter's (built once, cached), or for a local
    checkpoint or run folder the model folder in it (:func:`tether.models.model_folder`);
    a hub id unchanged. ``./runs/x`` that is not there is refused as a path, before
    ``Path`` makes it ``runs/x``, which reads as a hub id."""
    if str(path) == "starter":
        from tether.starter import build_starter

        return Path(build_starter(warm=True))
    from tether.models import model_folder, model_source

    if Path(path).is_dir():
        return model_folder(Path(path))
    model_source(str(path))  # none there: the one-line error, on the path as written
    return Path(path)
