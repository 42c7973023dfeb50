"""A tiny repository in a temporary directory, and pytest runs over it with a time limit.

The coding agent's tools (``read_file``, ``write_file``, ``run_tests``) are
methods of :class:`Workspace`; the grader uses :func:`run_pytest` on its own
copy. Paths are confined to the workspace: absolute paths, ``..``, backslashes
and symlinks that lead outside are refused. Tests run as a subprocess in their
own process group with a minimal environment (no API keys, HOME in the
workspace, no pytest plugins) and are killed, group and all, at the time limit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

TEST_TIMEOUT_S = 20.0
MAX_FILE_CHARS = 16_000
MAX_OUTPUT_CHARS = 2_000


class PathRefused(ValueError):
    """A tool path that is not a plain relative path inside the workspace."""


def confined(root: Path, path: str) -> Path:
    """``root / path``, refusing anything that could point outside ``root``."""
    if not isinstance(path, str) or not path.strip():
        raise PathRefused("path must be a non-empty string, e.g. 'tests/test_x.py'")
    pure = PurePosixPath(path)
    if pure.is_absolute() or "\\" in path or "\0" in path or ".." in pure.parts:
        raise PathRefused(f"path {path!r} must be relative to the repository, without '..'")
    full = (root / pure).resolve()
    if not full.is_relative_to(root.resolve()):
        raise PathRefused(f"path {path!r} leads outside the repository")
    return full


@dataclass
class TestRun:
    """What one pytest run did. ``total`` counts the test cases pytest reported."""

    __test__ = False  # not a pytest test class

    passed: int
    total: int
    exit_code: int | None  # None: killed at the time limit
    output: str

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


def _env(root: Path) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(HOME=str(root), PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    # Plain pytest: installed plugins (some import heavy packages) would cost seconds per run.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def _passed(junit: Path) -> tuple[int, int]:
    """(passed, total) test cases in a JUnit XML report; (0, 0) when there is none."""
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        return 0, 0
    total = passed = 0
    for case in cases:
        total += 1
        passed += not any(child.tag in ("failure", "error", "skipped") for child in case)
    return passed, total


def run_pytest(root: Path, targets: list[str], timeout_s: float = TEST_TIMEOUT_S) -> TestRun:
    """Run ``python -m pytest TARGETS`` in ``root``; kill the whole group after ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="tether-pytest-") as scratch:
        ini, junit = Path(scratch, "pytest.ini"), Path(scratch, "report.xml")
        ini.write_text("[pytest]\n")  # ignore any pytest config the repository holds
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        cmd += ["-c", str(ini), "--rootdir", str(root), "--junitxml", str(junit), *targets]
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=_env(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            code, output = None, output + f"\n[killed after {timeout_s:g} s]"
        passed, total = _passed(junit) if code is not None else (0, 0)
    return TestRun(passed, total, code, output)


class Workspace:
    """A repository's files written to a fresh temporary directory; remove it with :meth:`close`."""

    def __init__(self, files: dict[str, str], prefix: str = "tether-coding-") -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
        self.original = dict(files)
        for path, text in files.items():
            target = confined(self.root, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def files(self) -> dict[str, str]:
        """Every text file now in the workspace, by relative path."""
        out = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
                try:
                    out[path.relative_to(self.root).as_posix()] = path.read_text()
                except (OSError, UnicodeDecodeError):
                    continue
        return out

    def changed_files(self) -> dict[str, str]:
        """Files that differ from (or were not in) the original repository."""
        return {p: t for p, t in self.files().items() if self.original.get(p) != t}

    # -- the agent's tools: each returns the text the model reads ---------------------

    def read_file(self, path: str) -> str:
        try:
            target = confined(self.root, path)
            text = target.read_text()
        except PathRefused as exc:
            return f"error: {exc}"
        except (OSError, UnicodeDecodeError):
            return f"error: no text file {path!r}; files: {', '.join(self.files())}"
        if len(text) > MAX_FILE_CHARS:
            return text[:MAX_FILE_CHARS] + f"\n[... cut at {MAX_FILE_CHARS} characters]"
        return text

    def write_file(self, path: str, content: str) -> str:
        if not isinstance(content, str):
            return "error: content must be a string"
        if len(content) > MAX_FILE_CHARS:
            return f"error: content is longer than {MAX_FILE_CHARS} characters"
        try:
            target = confined(self.root, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        except PathRefused as exc:
            return f"error: {exc}"
        except OSError as exc:
            return f"error: cannot write {path!r}: {exc.strerror}"
        return f"wrote {len(content)} characters to {path}"

    def run_tests(self, timeout_s: float = TEST_TIMEOUT_S) -> str:
        run = run_pytest(self.root, ["tests"], timeout_s)
        tail = run.output.strip()[-MAX_OUTPUT_CHARS:]
        return f"{run.passed} of {run.total} tests passed\n{tail}"
