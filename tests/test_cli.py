import subprocess
import sys

import pytest
from click.testing import CliRunner

from bagpipe_cli import __version__
from bagpipe_cli.cli import cli


def test_version():
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_has_help_with_example(name):
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output or "example" in r.output


def test_unknown_command_is_usage_error():
    r = CliRunner().invoke(cli, ["frobnicate"])
    assert r.exit_code == 2


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "synth" in r.stdout


def test_train_options_are_the_config_fields():
    """`bagpipe train`'s options, defaults, help and choices come from TrainConfig."""
    from dataclasses import fields

    import click

    from bagpipe_cli.engine import TrainConfig
    from bagpipe_cli.engine.config import field_option
    from bagpipe_cli.engine.registry import ALL_SYSTEMS
    from bagpipe_cli.models import MODELS

    params = {p.name: p for p in cli.commands["train"].params}
    for f in fields(TrainConfig):
        if not f.metadata["cli"]:
            continue
        p = params[f.name]
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        assert p.opts == [field_option(f)] and p.default == default, f.name
        assert p.help == f.metadata["help"]
    assert params["timeout_s"].opts == ["--timeout"]
    assert isinstance(params["model"].type, click.Choice)
    assert set(params["model"].type.choices) == set(MODELS)
    assert set(params["optimizer"].type.choices) == {"sgd", "adagrad"}
    assert tuple(params["system"].type.choices) == ALL_SYSTEMS
