"""Every option error is one line, click's own usage errors too, with exit 2."""

from __future__ import annotations

import re

import pytest
from helpers import bagpipe, run_cli


@pytest.mark.parametrize("args, says", [
    (["train", "{data}", "--bottom-mlp", "a,b"], "Invalid value for '--bottom-mlp'"),
    (["profile", "{data}", "--lookahead", "1.5"], "Invalid value for --lookahead"),
    (["simulate", "{data}", "--validate", "{data}"], "--validate takes every setting"),
    (["train", "{data}", "--no-such-option"], "No such option '--no-such-option'"),
    (["train"], "Missing argument 'DATA'"),
    (["no-such-command"], "No such command 'no-such-command'"),
    (["train", "{data}", "--seed", "-1", "--out", "{tmp}/o"], "--seed -1: a seed is 0 to"),
    (["synth", "--out", "{tmp}/s", "--seed", "-1"], "--seed"),
    # a drop target that skips every sample of a share would train nothing (and say loss 0)
    (["train", "{data}", "--system", "slipstream", "--drop-target", "1", "--out", "{tmp}/o"],
     "--drop-target 1 skips all 1024 samples of a trainer's share: nothing would train; use at "
     "most 0.999"),
    (["train", "{data}", "--system", "slipstream", "--drop-target", "0.99", "--batch-size", "50",
      "--trainers", "2", "--out", "{tmp}/o"], "skips all 25 samples"),
])
def test_an_option_error_is_one_line(tiny_dataset, tmp_path, args, says):
    r = run_cli(*(a.format(data=tiny_dataset, tmp=tmp_path) for a in args))
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_a_usage_error_names_the_commands_help(tiny_dataset):
    r = run_cli("train", str(tiny_dataset), "--batch-size", "x")
    assert re.search(r"\(see '\S+ train --help'\)$", r.stderr.strip()), r.stderr


def test_the_process_prints_one_line_too(tiny_dataset):
    r = bagpipe("profile", str(tiny_dataset), "--lookahead", "1.5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_help_still_exits_0_and_bagpipe_alone_shows_it():
    assert run_cli("train", "--help").returncode == 0
    r = run_cli()
    assert "Commands:" in r.stdout and "Error" not in r.stderr
