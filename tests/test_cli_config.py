"""``tether config``: the effective config as commented YAML that loads back, and
docs/config.md generated from the same dataclasses (kept in sync here)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tether.cli._config import config_markdown
from tether.cli._serve_run import ServeConfig
from tether.configdoc import entries, field_help, to_yaml
from tether.configio import build, load_config
from tether.run import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calc/config.yaml"


def _tether(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_docs_config_md_is_generated_from_the_dataclasses() -> None:
    doc = ROOT / "docs" / "config.md"
    assert doc.read_text() == config_markdown(), (
        "docs/config.md is out of date: regenerate it with "
        "`tether config --markdown > docs/config.md`"
    )


def test_every_field_has_help() -> None:
    for cls in (TrainConfig, ServeConfig):
        missing = [e.key for e in entries(cls(), cls()) if not e.help]
        assert not missing, f"{cls.__name__}: fields without a #: comment: {missing}"


@dataclass
class _Inner:
    #: Inner help,
    #: on two lines.
    x: int = 1
    # a plain comment is not help
    y: str = "a"


@dataclass
class _Outer:
    #: The section.
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    #: A secret.
    key: str | None = dataclasses.field(default=None, repr=False)
    #: Off by default.
    opt: _Inner | None = None


def test_help_is_the_comment_above_and_the_yaml_loads_back() -> None:
    assert field_help(_Inner) == {"x": "Inner help, on two lines.", "y": ""}
    cfg = _Outer(inner=_Inner(x=5), key="s3cret")
    text = to_yaml(entries(cfg, _Outer()))
    assert "  # Inner help, on two lines.\n  x: 5  # default: 1\n" in text
    assert "s3cret" not in text and "key: '***'  # default: null" in text
    assert "opt: null" in text and "\n  # x: 1\n" in text  # an unset section's fields: commented
    back = yaml.safe_load(text)
    assert back == {"inner": {"x": 5, "y": "a"}, "key": "***", "opt": None}


def test_tether_config_shows_the_effective_values_and_loads_back(tmp_path: Path) -> None:
    r = _tether("config", str(CONFIG), "trainer.lr=3e-5", "gateway.admin_key=k" * 3)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"# tether train's config: the defaults + {CONFIG} + 2 override(s)")
    assert "  lr: 3.0e-05  # default: 0.0002\n" in out
    assert "gateway.admin_key=k" not in out and "admin_key: '***'" in out
    assert "  # AdamW learning rate.\n" in out
    saved = tmp_path / "effective.yaml"
    saved.write_text(out.replace("'***'", "null"))
    expected = load_config(TrainConfig, CONFIG, ["trainer.lr=3e-5"])
    assert dataclasses.asdict(build(TrainConfig, yaml.safe_load(saved.read_text()))) == (
        dataclasses.asdict(expected)
    )
    serve = _tether("config", "--serve", "model=some/model")
    assert serve.returncode == 0 and "model: some/model  # default: null" in serve.stdout
    bad = _tether("config", "trainer.lr=-1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "lr" in bad.stderr
    helped = _tether("--help")
    assert helped.returncode == 0 and "config " in helped.stdout
