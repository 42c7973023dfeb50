"""The import graph of ``tether/`` follows the layering table.

Every module under ``tether/`` is parsed with :mod:`ast` (function-level and
``TYPE_CHECKING`` imports count too) and each ``tether.*`` import is checked against
:data:`KNOWS`, the "knows about" column of the components table in
``docs/layout.md`` and the design notes: arrows point down the table, never up.
A second rule: no package imports another package's ``_private`` module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "tether").rglob("*.py"))

# The components table (docs/layout.md), as data: component -> the components it may import.
# Shared leaves: ``errors`` (the exception root), ``configio`` (config files), ``configdoc``
# (the config reference: ``tether config``, docs/config.md), ``_hf`` (the one
# transformers/peft compatibility module: torch/transformers/peft only), ``_memory``, ``_lazy``
# (lazy package exports), ``_exit`` (leaving a process without the interpreter's teardown),
# ``models`` (finding and loading any model folder or hub id: transformers, errors).
LEAVES = {"errors", "configio", "configdoc", "_hf", "_memory", "_lazy", "_exit", "models"}
KNOWS: dict[str, set[str]] = {
    "": set(),  # tether/__init__.py: __version__, nothing imported
    "records": set(),
    "errors": set(),
    "configio": {"errors"},
    "configdoc": set(),  # and yaml
    "_hf": set(),
    "_memory": set(),
    "_lazy": set(),
    "_exit": set(),
    "models": {"errors", "_lazy"},  # and transformers, huggingface_hub, torch
    "store": {"records", "errors", "_lazy"},
    "engine": {"records", "errors", "_hf", "_lazy", "models"},
    "chat": {"errors", "_lazy"},
    "gateway": {"engine", "chat", "store", "records", "errors", "configio", "_lazy"},
    "runner": {"records", "store", "errors", "configio", "_lazy"},
    # and torch, transformers/peft; _memory: glibc's mmap threshold for the update on CPU
    "trainer": {"records", "errors", "_hf", "_memory", "_lazy"},
    "starter": {"engine", "chat", "errors", "_hf", "_lazy", "models"},  # and transformers
    # reads stores (read-only) and shows samples as the trainer builds them, advantages as
    # tracking credits them (one code path with tether export); FastAPI, Jinja2
    "dashboard": {"records", "store", "trainer", "tracking", "errors", "_lazy"},
    # watching a run: sinks, export, report. It reads the store; the trainer's public
    # sample-building functions rebuild a step's samples (tether export --samples).
    "tracking": {"records", "store", "trainer", "errors", "configio", "_lazy"},
    # orchestration: everything below the CLI
    "run": {"gateway", "engine", "chat", "store", "runner", "trainer", "starter", "records"}
    | {"dashboard", "tracking"}
    | LEAVES,
    # the CLI layer: everything; nothing depends on it
    "cli": {"run", "gateway", "engine", "chat", "store", "runner", "trainer", "starter"}
    | {"records", "cli", "dashboard", "tracking"}
    | LEAVES,
}

# Imports that cross the table on purpose: (importing module, imported component) -> why.
EXCEPTIONS = {
    ("tether.trainer.checkpoint", "store"): (
        "a checkpoint saves the run config with the store's secret-redaction rule"
    ),
}

# The trainer learns only: whatever else changes, these stay out of it (issue 12).
NEVER = {"trainer": {"gateway", "runner", "starter", "run", "tracking", "cli"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def component(module: str) -> str:
    """The component of a ``tether.*`` module; ``""`` for the root package (``tether``,
    whose ``__init__`` holds ``__version__`` and imports nothing: any module may read it)."""
    name = module.split(".")[1] if "." in module else ""
    return "" if name.startswith("__") else name


def tether_imports(path: Path) -> list[str]:
    """Every ``tether.*`` module name an import in ``path`` names (``from x import y``
    yields ``x.y``, so that a private submodule imported by name is seen too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [module] + [f"{module}.{a.name}" for a in node.names]
    return [m for m in found if m == "tether" or m.startswith("tether.")]


def private_of_other_package(importer: str, imported: str) -> bool:
    """``imported`` reaches into a ``_private`` module of a package other than ``importer``'s."""
    parts = imported.split(".")
    for i, part in enumerate(parts[2:], start=2):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            return not (importer == owner or importer.startswith(owner + "."))
    return False


def test_the_table_matches_the_tree() -> None:
    components = {component(module_name(p)) for p in SOURCES}
    assert components == set(KNOWS), "a package was added or removed: update KNOWS"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_follow_the_layering(path: Path) -> None:
    importer = module_name(path)
    mine = component(importer)
    wrong = []
    for imported in tether_imports(path):
        theirs = component(imported)
        if not theirs or theirs == mine or (importer, theirs) in EXCEPTIONS:
            continue
        if theirs not in KNOWS[mine] or theirs in NEVER.get(mine, ()):
            wrong.append(f"{imported} ({mine} must not know {theirs})")
    assert not wrong, f"{importer} imports up or across the table: {wrong}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_private_module_of_another_package(path: Path) -> None:
    importer = module_name(path)
    private = [m for m in tether_imports(path) if private_of_other_package(importer, m)]
    assert not private, f"{importer} imports private modules of other packages: {private}"


def test_the_checks_catch_violations() -> None:
    """The rules themselves: a trainer module importing the gateway or a store private fails."""
    assert component("tether.trainer._update") == "trainer"
    assert "gateway" not in KNOWS["trainer"]
    assert private_of_other_package("tether.trainer._update", "tether.store._codec")
    assert not private_of_other_package("tether.store._runs", "tether.store._codec")
    assert not private_of_other_package("tether.run._loop", "tether._memory")
    assert component("tether.cli._views") == "cli"


# A package's own tests may import its private modules; other tests may not
# (docs/layout.md). A test file belongs to the package its name starts with (test_gateway_api.py:
# gateway, test_cli_runs.py: cli) unless it is listed here.
TEST_OWNERS = {
    "test_constraint": "engine",
    # the fake vLLM / SGLang servers: tether's embedded engine behind the servers' routes
    "fake_backend": "engine",
    "fake_vllm": "engine",
    "fake_sglang": "engine",
    "test_diagnostics": "cli",  # the step line and live table of `tether train`
    "test_export": "cli",  # `tether export` and `tether report`
    "test_interrupt": "cli",
    "test_responses": "gateway",
    "test_async": "run",
    "test_collect_failures": "run",
    "test_failures": "run",
    "test_report_plots": "cli",  # the reward curve of `tether demo` and `tether report`'s charts
    "test_samples": "trainer",  # rollouts → samples, and logits → logprobs (trainer/_forward.py)
    "test_lean_forward": "trainer",  # the chunked LM head and checkpointing (trainer/_forward.py)
}
# Tests that reach into another package's internals, each with why (and what would end it).
TEST_CROSSINGS = {
    ("test_report_plots", "tether.tracking._report"): "the report's chart figure, drawn "
    "without a run (one legend rule for the CLI's curve and the report's charts)",
    ("test_run_config", "tether.cli._serve_run"): "ServeConfig, `tether serve`'s config "
    "file (belongs in a test_cli_* file)",
    ("test_run_folders", "tether.cli._train"): "the demo command's default steps (belongs "
    "in a test_cli_* file)",
    ("test_run_folders", "tether.cli._train_run"): "the demo's run folder (belongs in a "
    "test_cli_* file)",
}


def owner_of(stem: str) -> str:
    if stem in TEST_OWNERS:
        return TEST_OWNERS[stem]
    packages = {p.name for p in (ROOT / "tether").iterdir() if (p / "__init__.py").is_file()}
    name = stem.removeprefix("test_")
    return next((p for p in sorted(packages) if name == p or name.startswith(p + "_")), "")


def imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_tests_import_only_their_own_packages_private_modules() -> None:
    wrong = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        owner = owner_of(path.stem)
        for module in imported_modules(path):
            parts = module.split(".")
            # tether._x (the shared leaves _hf, _memory, ...) has no package: tested directly
            hidden = parts[0] == "tether" and any(p.startswith("_") for p in parts[2:])
            if hidden and parts[1] != owner and (path.stem, module) not in TEST_CROSSINGS:
                wrong.append(f"{path.name}: {module}")
    assert not wrong, f"tests import private modules of another package: {wrong}"


def test_test_owners_name_packages() -> None:
    assert owner_of("test_gateway_api") == "gateway"
    assert owner_of("test_cli") == "cli" and owner_of("test_starter") == "starter"
    assert owner_of("test_runner_ray") == "runner" and owner_of("test_run_config") == "run"
    assert owner_of("test_end_of_turn") == ""


def test_no_function_in_tether_is_80_lines_or_more() -> None:
    """STYLE.md rule 4: functions stay under ~80 lines (a longer one is split, not waived)."""
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines >= 80:
                    long.append(f"{module_name(path)}.{node.name}: {lines} lines")
    assert long == [], long
