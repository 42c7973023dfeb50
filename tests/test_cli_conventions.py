"""The ``tether`` command follows the usual conventions (issue 34): exit status 1 for a
runtime failure and 2 for a usage or config error, documented in ``--help``; ``-h``
wherever ``--help`` works; fixed choices listed in help; config errors that name the
file and line, all of them at once; ``--version``; no hidden command."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

import tether
from tether.cli import app
from tether.cli._app import exit_status
from tether.configio import load_config
from tether.engine import EngineLost
from tether.errors import TetherError, UserError
from tether.models import ModelNotFound
from tether.run import TrainConfig
from tether.runner import AgentLoadError
from tether.store import StoreError
from tether.trainer.errors import AgentsFailing, NoLearningSignal

runner = CliRunner()


def _commands() -> list[list[str]]:
    """Every command path of the app (groups included), e.g. ["rollouts", "list"]."""
    out: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        out.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


@pytest.mark.parametrize(
    "exc,status",
    [
        (UserError("x"), 2),
        (ModelNotFound("x"), 2),
        (AgentLoadError("x"), 2),
        (AgentsFailing("all rollouts failed"), 1),
        (NoLearningSignal("x"), 1),
        (EngineLost("x"), 1),
        (StoreError("x"), 1),
        (TetherError("x"), 1),
    ],
)
def test_exit_status_is_2_for_what_the_user_gave_and_1_for_a_runtime_failure(
    exc: TetherError, status: int
) -> None:
    assert exit_status(exc) == status


def test_help_documents_the_exit_statuses_and_lists_every_command() -> None:
    done = runner.invoke(app, ["--help"], terminal_width=200)
    assert done.exit_code == 0
    text = " ".join(done.output.split())
    assert "Exit status: 0 done; 1 a runtime failure" in text
    assert "2 a usage or config error" in text and "130 / 143 interrupted" in text
    for name in ("check", "tensorboard", "train", "serve", "rollouts"):
        assert f"\n  {name} " in done.output, done.output


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "tether")
def test_dash_h_is_help_everywhere(path: list[str]) -> None:
    if path == ["tensorboard"]:  # every option of `tether tensorboard` is TensorBoard's
        return
    short = runner.invoke(app, [*path, "-h"], terminal_width=120)
    long = runner.invoke(app, [*path, "--help"], terminal_width=120)
    assert short.exit_code == 0 == long.exit_code, short.output
    assert short.output == long.output and "-h, --help" in short.output


@pytest.mark.parametrize(
    "path,shown",
    [
        (["train"], "--log-level <debug|info|warning|error>"),
        (["serve"], "--tool-parser <hermes|llama3_json|none>"),
        (["export"], "--format <jsonl|parquet>"),
    ],
)
def test_fixed_choices_are_listed_in_help(path: list[str], shown: str) -> None:
    done = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert shown in done.output, done.output


def test_a_value_outside_the_choices_is_a_usage_error() -> None:
    done = runner.invoke(app, ["train", "x.yaml", "--log-level", "loud"])
    assert done.exit_code == 2
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in done.output


def test_version_is_the_packages() -> None:
    done = runner.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output == f"tether {tether.__version__}\n"


def test_config_errors_name_their_line_or_override_all_at_once(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "name: x\n"
        "model:\n"
        "  path: starter\n"
        "  devise: cpu\n"  # line 4
        "trainer:\n"
        "  lr: fast\n"  # line 6
        "  steps: 3\n"
    )
    with pytest.raises(UserError) as e:
        load_config(TrainConfig, config, ["rollout.n=1", "eval.every=2"])
    assert str(e.value).splitlines() == [
        f"config error in {config}:",
        "  line 4: unknown config key 'model.devise' (did you mean 'device'?)",
        "  line 6: trainer.lr must be a number, got 'fast'",
        "  override rollout.n=1: rollout.n (1) must be >= 2: group advantages need 2 "
        "samples or more per task",
    ]


def test_one_config_error_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("name: x\nmodel: Qwen/Qwen2.5-1.5B-Instruct\n")
    with pytest.raises(UserError) as e:
        load_config(TrainConfig, config)
    assert str(e.value) == (
        f"{config}:2: model: expected a mapping with keys path, device, train_dtype, "
        "max_batch_size, rollout_dtype, got 'Qwen/Qwen2.5-1.5B-Instruct'; write "
        "model.path: Qwen/Qwen2.5-1.5B-Instruct"
    )
    config.write_text("name: x\ntrainer:\n  lr: [1e-4\n")
    with pytest.raises(UserError) as e:
        load_config(TrainConfig, config)
    assert str(e.value).startswith(f"{config}:4:1: not valid YAML: expected ',' or ']'")
    assert "<unicode string>" not in str(e.value)


def test_a_section_given_a_scalar_names_its_keys_and_its_shorthand(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("tasks: data.jsonl\nagent: agent.py:main\n")
    with pytest.raises(UserError) as e:
        load_config(TrainConfig, config)
    first, second = str(e.value).splitlines()[1:]
    assert first == (
        "  line 1: tasks: expected a mapping with keys source, train_size, val_size, seed, "
        "holdout, private_fields, got 'data.jsonl'; write tasks.source: data.jsonl"
    )
    assert second.startswith("  line 2: agent: expected a mapping with keys mode, command, ")
    assert second.endswith(", got 'agent.py:main'")  # no shorthand declared: no guess
