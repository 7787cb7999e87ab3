"""One config per command, in sections: `train` and `simulate` generate their options from
their config dataclasses, group their help by section, share the fields that mean the same,
and a cluster file loads into the same config."""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, fields

import pandas as pd
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.engine.config import SECTIONS, TrainConfig, field_option
from bagpipe_cli.simulate.cluster import SimulateConfig

# Fields of `bagpipe simulate` that mean what `bagpipe train`'s do.
SHARED = ("data", "batch_size", "iterations", "warmup", "eval_rows", "lookahead", "round",
          "cache_rows", "staleness", "hot_sample", "emb_dim", "bottom_mlp", "top_mlp", "optimizer",
          "model", "trainers", "servers", "net_gbps", "net_latency_us")
HAND_WRITTEN = {"simulate": {"source", "cluster_file", "validate_paths", "out", "overwrite"},
                "train": {"data", "out", "overwrite", "save_model"}}
HEADINGS = [s.capitalize() + ":" for s in SECTIONS]


def _help(command: str) -> list[str]:
    r = CliRunner().invoke(cli, [command, "--help"])
    assert r.exit_code == 0, r.output
    return r.output.splitlines()


def _sections_of_help(lines: list[str]) -> dict[str, str]:
    """option -> the heading it is listed under."""
    where, heading = {}, None
    for line in lines:
        if line and not line.startswith(" "):
            heading = line
        elif line.startswith("  --") or line.startswith("  -h"):
            where[line.split()[0].rstrip(",")] = heading
    return where


@pytest.mark.parametrize("cls", [TrainConfig, SimulateConfig])
def test_every_field_is_in_a_known_section(cls):
    for f in fields(cls):
        assert f.metadata["section"] in SECTIONS, f.name


@pytest.mark.parametrize("command, cls", [("train", TrainConfig), ("simulate", SimulateConfig)])
def test_help_lists_the_options_under_their_sections_in_order(command, cls):
    lines = _help(command)
    headings = [line for line in lines if line in HEADINGS]
    assert headings == sorted(headings, key=HEADINGS.index)  # the sections' order
    assert "Options:" not in lines  # no flat list any more
    where = _sections_of_help(lines)
    for f in fields(cls):
        if f.metadata["cli"]:
            assert where[field_option(f)] == f.metadata["section"].capitalize() + ":", f.name
    assert where["--out"] == where["--overwrite"] == "Output:"
    assert where["-h"] == "Other options:"  # -h, --help


def test_train_help_sections_and_example():
    lines = _help("train")
    assert [line for line in lines if line in HEADINGS] == HEADINGS  # train has every section
    where = _sections_of_help(lines)
    assert where["--batch-size"] == "Data:" and where["--lookahead"] == "System:"
    assert where["--net-gbps"] == "Cluster and network:" and where["--procs"] == "Runtime:"
    assert where["--resume"] == "Checkpoints:" and where["--save-model"] == "Output:"
    assert any("Example: bagpipe train" in line for line in lines)


def test_other_commands_keep_one_options_list():
    assert "Options:" in _help("bench") and "Options:" in _help("profile")


def test_simulate_options_are_the_config_fields():
    params = {p.name: p for p in cli.commands["simulate"].params}
    generated = {f.name for f in fields(SimulateConfig) if f.metadata["cli"]}
    assert set(params) - generated == HAND_WRITTEN["simulate"]
    for name in generated:
        f = next(f for f in fields(SimulateConfig) if f.name == name)
        assert params[name].opts == [field_option(f)] and params[name].help == f.metadata["help"]
    assert params["calibrate"].multiple  # --calibrate A --calibrate B


def test_train_options_are_the_config_fields_and_nothing_else():
    params = {p.name for p in cli.commands["train"].params}
    generated = {f.name for f in fields(TrainConfig) if f.metadata["cli"]}
    assert params - generated == HAND_WRITTEN["train"]


@pytest.mark.parametrize("name", SHARED)
def test_shared_fields_are_trains(name):
    """One default, help, option, choices, checks and section, declared in TrainConfig."""
    train = next(f for f in fields(TrainConfig) if f.name == name)
    sim = next(f for f in fields(SimulateConfig) if f.name == name)
    assert sim.default == train.default and sim.default_factory is train.default_factory is MISSING
    assert dict(sim.metadata) == dict(train.metadata)
    assert typing.get_type_hints(SimulateConfig)[name] == typing.get_type_hints(TrainConfig)[name]
    if train.metadata["cli"]:
        t = next(p for p in cli.commands["train"].params if p.name == name)
        s = next(p for p in cli.commands["simulate"].params if p.name == name)
        assert (s.opts, s.default, s.help, str(s.type)) == (t.opts, t.default, t.help, str(t.type))


def test_simulate_defaults_are_trains():
    c = SimulateConfig(data="x", compute_ms=1.0)
    t = TrainConfig(data="x")
    assert (c.batch_size, c.lookahead, c.optimizer, c.iterations, c.warmup) == (1024, 16, "sgd", 100, 5)
    assert all(getattr(c, n) == getattr(t, n) for n in SHARED)


# --------------------------------------------------------------------- the command, end to end

FAST = ["--compute-ms", "2", "--sweep-trainers", "1", "--sweep-gbps", "1", "--iterations", "20",
        "--warmup", "2"]


def _simulate(args, tmp_path, name="sim"):
    out = tmp_path / name
    r = CliRunner().invoke(cli, ["simulate", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "simulate.json").read_text())["config"], pd.read_csv(out / "predictions.csv")


def test_simulate_with_no_settings_simulates_a_default_train_run(tiny_dataset, tmp_path):
    cfg, _ = _simulate([str(tiny_dataset), "--compute-ms", "2", "--systems", "sync"], tmp_path)
    assert (cfg["batch_size"], cfg["lookahead"], cfg["optimizer"]) == (1024, 16, "sgd")
    assert (cfg["iterations"], cfg["warmup"], cfg["eval_rows"]) == (100, 5, None)
    assert cfg["cluster"]["trainers"] == cfg["trainers"] == 1


def test_command_line_overrides_the_cluster_file(tiny_dataset, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"data: {tiny_dataset}\ntrainers: 2\nservers: 2\nbatch_size: 512\n"
                 "systems: [sync, bagpipe]\ndescription: two of each\n")
    cfg, pred = _simulate(["--cluster", str(f), "--trainers", "4", *FAST], tmp_path)
    assert (cfg["trainers"], cfg["servers"], cfg["batch_size"]) == (4, 2, 512)
    assert list(pred["system"]) == ["sync", "bagpipe"]


def test_hot_sample_changes_faes_fetches(tiny_dataset, tmp_path):
    args = [str(tiny_dataset), "--systems", "fae", *FAST, "--cache-rows", "200"]
    _, all_batches = _simulate(args, tmp_path, "all")
    _, first = _simulate([*args, "--hot-sample", "0.05"], tmp_path, "first")
    fetched = all_batches["rows_fetched_per_iter"][0], first["rows_fetched_per_iter"][0]
    assert fetched[0] < fetched[1]  # the hot rows of one batch serve the others worse


def test_eval_rows_are_left_out_of_the_trace(tiny_dataset, tmp_path):
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    held = trace_volumes(TraceConfig(str(tiny_dataset), iterations=2), ["sync"])[1]
    none = trace_volumes(TraceConfig(str(tiny_dataset), iterations=2, eval_rows=0), ["sync"])[1]
    assert held["train_rows"] == 18_000 and none["train_rows"] == 20_000


def _one_line_error(args):
    r = CliRunner().invoke(cli, ["simulate", *args])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), r.output
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--trainers", "0"], "--trainers must be >= 1 (got 0)"),
    (["--batch-size", "1000", "--trainers", "3"], "--batch-size 1000 is not divisible by --trainers 3"),
    (["--hot-sample", "0"], "--hot-sample must be in (0, 1]"),
    (["--warmup", "100"], "--warmup 100 leaves none of the 100 iterations"),
    (["--sweep-trainers", "3"], "--sweep-trainers 3"),
    (["--sweep-gbps", "0"], "--sweep-gbps"),
    (["--trainer-gbps", "-1"], "--trainer-gbps must be > 0"),
    (["--bottom-mlp", "0"], "--bottom-mlp: layer sizes must be positive"),
    (["--systems", "sync,sync"], "--systems lists sync twice"),
    (["--cache-rows", "1", "--systems", "bagpipe"], "below the lookahead's peak"),
])
def test_simulate_refuses_what_it_cannot_model(tiny_dataset, args, needle):
    assert needle in _one_line_error([str(tiny_dataset), "--compute-ms", "1", *args])


def test_validate_takes_no_other_settings(tmp_path):
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(tmp_path), "--trainers", "4"])
    assert r.exit_code == 2 and "--validate takes every setting from the runs" in r.output


@pytest.mark.parametrize("content, needle", [
    (b"trainers: 2\nbandwidth: 10\n", "unknown key 'bandwidth'"),
    (b"trainers: 2\nlookahed: 10\n", "unknown key 'lookahed'; did you mean 'lookahead'?"),
    (b"trainers: two\n", "trainers must be an integer (got 'two')"),
    (b"net_gbps: fast\n", "net_gbps must be a number"),
    (b"bottom_mlp: [512, big]\n", "bottom_mlp must be a list, each item an integer"),
    (b"systems: {sync: 1}\n", "systems must be a list, each item a string"),
    (b"reported: 5.6\n", "reported must be a mapping"),
    (b"synth: {rows: many}\n", "synth: rows must be an integer"),
    (b"synth: {colour: red}\n", "synth: unknown key 'colour'"),
    (b"sweep: {trainers: [1]}\nsweep_trainers: [2]\n", "sweep_trainers is given twice"),
    (b"trainers: 2\n# caf\xe9\n", "not UTF-8 text"),
    (b"\xff\xfe\x00t\x00r", "not UTF-8 text"),
    (b"trainers: 2\nservers: [1, 2\nname: x\n", "line 3: not valid YAML"),
    (b"- a list\n", "expected a mapping of settings"),
])
def test_bad_cluster_files_are_one_line_naming_the_file(tmp_path, content, needle):
    f = tmp_path / "cluster.yaml"
    f.write_bytes(content)
    line = _one_line_error(["--cluster", str(f)])
    assert f"--cluster {f}:" in line and needle in line, line


def test_cluster_file_values_are_checked_as_options_are(tiny_dataset, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"data: {tiny_dataset}\ncompute_ms: 1\ntrainers: 0\n")
    assert "--trainers must be >= 1 (got 0)" in _one_line_error(["--cluster", str(f)])


def test_a_settings_check_comes_before_generating_the_dataset(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"data: {tmp_path / 'gen'}\nsynth: {{preset: tiny, rows: 5000}}\ncompute_ms: 1\n"
                 "lookahead: 0\n")
    assert "--lookahead must be >= 1" in _one_line_error(["--cluster", str(f)])
    assert not (tmp_path / "gen").exists()
