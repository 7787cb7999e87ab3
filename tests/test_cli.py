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


def _one_line(r, code: int, text: str) -> None:
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {text}"), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("signum, code, text", [(None, 130, "interrupted"),
                                                (15, 143, "terminated by SIGTERM"),
                                                (1, 129, "terminated by SIGHUP")])
def test_an_interrupt_in_a_command_is_one_line_with_the_signals_code(tmp_path, monkeypatch,
                                                                     signum, code, text):
    import bagpipe_cli.data.synth as synth
    from bagpipe_cli.launch.signals import Terminated

    def stop(*a, **k):
        raise KeyboardInterrupt() if signum is None else Terminated(signum)

    monkeypatch.setattr(synth.DatasetWriter, "__init__", stop)
    r = CliRunner().invoke(cli, ["synth", "--preset", "tiny", "--rows", "1000", "--out",
                                 str(tmp_path / "d")])
    _one_line(r, code, f"{text}; no output was written")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_while_a_command_loads_is_one_line(monkeypatch):
    """Ctrl-C while the command's module (and torch) is still being imported."""
    import importlib

    from bagpipe_cli.cli import COMMANDS

    real = importlib.import_module

    def slow_import(name, *a, **k):
        if name == COMMANDS["train"][0].partition(":")[0]:
            raise KeyboardInterrupt()
        return real(name, *a, **k)

    fresh = type(cli)(name="bagpipe", lazy=dict(COMMANDS))
    monkeypatch.setattr(importlib, "import_module", slow_import)
    r = CliRunner().invoke(fresh, ["train", "--help"])
    _one_line(r, 130, "interrupted")
