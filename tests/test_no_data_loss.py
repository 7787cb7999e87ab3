"""No input is ever destroyed: an --out (or --save-model, --checkpoint-dir) that is, holds or
lies inside one of a command's inputs is refused before any work, with or without
--overwrite, with one `Error:` line naming the option and both paths, and the input is left
byte for byte as it was; so is the working directory, and a path where nothing can be
written is named as the user gave it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli

SMALL = ["--batch-size", "256", "--iterations", "3", "--eval-rows", "1000", "--lookahead", "2"]
EXAMPLE_BENCH = Path(__file__).parent / "data" / "bench-example"


def invoke(args: list[str]):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_error(r, *needles: str, code: int = 2) -> str:
    assert r.exit_code == code, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert ".tmp-" not in lines[0]
    return lines[0]


def snapshot(p: Path) -> dict[str, bytes]:
    if p.is_file():
        return {p.name: p.read_bytes()}
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


@pytest.fixture(scope="module")
def world(tiny_dataset, tmp_path_factory) -> Path:
    """A folder of inputs: a dataset, a CSV, a run, checkpoints, a bench file and folder."""
    w = tmp_path_factory.mktemp("world")
    shutil.copytree(tiny_dataset, w / "ds")
    (w / "indir").mkdir()
    (w / "indir" / "clicks.csv").write_text("y,a\n" + "".join(f"{i % 2},u{i % 7}\n" for i in range(300)))
    r = invoke(["train", w / "ds", *SMALL, "--out", w / "run", "--checkpoint-every", "1",
                "--checkpoint-dir", w / "ck"])
    assert r.exit_code == 0, r.output
    (w / "cfg").mkdir()
    (w / "cfg" / "b.yaml").write_text(
        f"name: b\ndatasets: [{{name: tiny, path: {w / 'ds'}}}]\nmodels: [dlrm]\nsystems: [sync]\n"
        "repeat: 1\nbase: {batch_size: 256, iterations: 3, warmup: 0, eval_rows: 1000}\n"
        "profile: false\n")
    shutil.copytree(EXAMPLE_BENCH, w / "bench")
    return w


CSV = ["--label", "y", "--categorical", "a"]
COMPUTE = ["--compute-ms", "5", "--batch-size", "256"]

# (case, the command line with W for the world folder, the input it must not touch, the
# option named in the error); every case runs without and with --overwrite.
CASES = [
    ("preprocess: --out is the CSV", ["preprocess", "csv", "W/indir/clicks.csv", *CSV, "--out", "W/indir/clicks.csv"], "indir", "--out"),
    ("preprocess: --out holds the CSV", ["preprocess", "csv", "W/indir/clicks.csv", *CSV, "--out", "W/indir"], "indir", "--out"),
    ("preprocess: --out is --vocab-from", ["preprocess", "csv", "W/indir/clicks.csv", *CSV, "--vocab-from", "W/ds", "--out", "W/ds"], "ds", "--out"),
    ("preprocess: --out inside --vocab-from", ["preprocess", "csv", "W/indir/clicks.csv", *CSV, "--vocab-from", "W/ds", "--out", "W/ds/v"], "ds", "--out"),
    ("profile: --out is DATA", ["profile", "W/ds", "--out", "W/ds"], "ds", "--out"),
    ("profile: --out inside DATA", ["profile", "W/ds", "--out", "W/ds/p"], "ds", "--out"),
    ("profile: --out holds DATA", ["profile", "W/ds", "--out", "W"], "ds", "--out"),
    ("train: --out is DATA", ["train", "W/ds", *SMALL, "--out", "W/ds"], "ds", "--out"),
    ("train: --out inside DATA", ["train", "W/ds", *SMALL, "--out", "W/ds/r"], "ds", "--out"),
    ("train: --out holds DATA", ["train", "W/ds", *SMALL, "--out", "W"], "ds", "--out"),
    ("train: --out is --resume", ["train", "W/ds", *SMALL, "--resume", "W/ck", "--out", "W/ck"], "ck", "--out"),
    ("train: --out inside --checkpoint-dir", ["train", "W/ds", *SMALL, "--checkpoint-every", "1", "--checkpoint-dir", "W/ck", "--out", "W/ck/r"], "ck", "--out"),
    ("train: --save-model over a dataset file", ["train", "W/ds", *SMALL, "--out", "W/r2", "--save-model", "W/ds/cat_000.npy"], "ds", "--save-model"),
    ("train: --save-model inside the checkpoints", ["train", "W/ds", *SMALL, "--resume", "W/ck", "--out", "W/r2", "--save-model", "W/ck/m.pt"], "ck", "--save-model"),
    ("bench: --out holds CONFIG", ["bench", "W/cfg/b.yaml", "--out", "W/cfg"], "cfg", "--out"),
    ("bench: --out is a dataset", ["bench", "W/cfg/b.yaml", "--out", "W/ds"], "ds", "--out"),
    ("bench: --out inside a dataset", ["bench", "W/cfg/b.yaml", "--out", "W/ds/b"], "ds", "--out"),
    ("report: --out is RESULTS", ["report", "W/bench", "--out", "W/bench"], "bench", "--out"),
    ("report: --out holds RESULTS", ["report", "W/bench", "--out", "W"], "bench", "--out"),
    ("report: --out holds runs inside RESULTS", ["report", "W/bench", "--out", "W/bench/runs"], "bench", "--out"),
    ("simulate: --out is SOURCE", ["simulate", "W/ds", *COMPUTE, "--out", "W/ds"], "ds", "--out"),
    ("simulate: --out inside SOURCE", ["simulate", "W/ds", *COMPUTE, "--out", "W/ds/s"], "ds", "--out"),
    ("simulate: --out is --calibrate", ["simulate", "W/ds", "--batch-size", "256", "--calibrate", "W/run", "--out", "W/run"], "run", "--out"),
    ("simulate: --out is --validate", ["simulate", "--validate", "W/run", "--out", "W/run"], "run", "--out"),
    ("simulate: --out inside --validate", ["simulate", "--validate", "W/bench", "--out", "W/bench/runs"], "bench", "--out"),
]


# bench has no --overwrite: it only adds runs to its folder.
RUNS = [(*c, o) for c in CASES for o in (False, True) if not (o and c[1][0] == "bench")]


@pytest.mark.parametrize("case, args, keep, option, overwrite", RUNS,
                         ids=[c[0] + " --overwrite" * c[4] for c in RUNS])
def test_an_output_over_an_input_is_refused(world, case, args, keep, option, overwrite):
    args = [a.replace("W", str(world), 1) if a.startswith("W") else a for a in args]
    before = snapshot(world / keep)
    r = invoke(args + ["--overwrite"] * overwrite)
    line = one_error(r, option)
    given = args[args.index(option) + 1]
    assert given in line and str(world / keep) in line  # both paths, as the user gave them
    assert snapshot(world / keep) == before


def test_a_report_inside_its_bench_folder_is_fine(world, tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(world / "bench", bench)
    r = invoke(["report", bench, "--out", bench / "report", "--format", "md"])
    assert r.exit_code == 0, r.output
    r = invoke(["report", bench, "--format", "md"])  # the default: <RESULTS>/report, kept ...
    assert r.exit_code == 2 and "pass --overwrite" in r.output
    r = invoke(["report", bench, "--format", "md", "--overwrite"])  # ... or replaced
    assert r.exit_code == 0, r.output


def test_an_output_through_a_symlink_to_an_input_is_refused(world, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(world / "ds")
    before = snapshot(world / "ds")
    one_error(invoke(["profile", world / "ds", "--out", link, "--overwrite"]), str(link))
    one_error(invoke(["profile", world / "ds", "--out", world / "ds" / ".." / "ds", "--overwrite"]))
    assert snapshot(world / "ds") == before


COMMANDS_WITH_OUT = {
    "synth": ["synth", "--preset", "tiny", "--rows", "2000"],
    "preprocess": ["preprocess", "csv", "W/indir/clicks.csv", *CSV],
    "profile": ["profile", "W/ds"],
    "train": ["train", "W/ds", *SMALL],
    "simulate": ["simulate", "W/ds", *COMPUTE],
    "report": ["report", "W/bench"],
}


@pytest.mark.parametrize("out", [".", ".."])
@pytest.mark.parametrize("command", list(COMMANDS_WITH_OUT))
def test_the_working_directory_is_never_an_output(world, tmp_path, monkeypatch, command, out):
    here = tmp_path / "a" / "here"
    here.mkdir(parents=True)
    (here / "keep.txt").write_text("mine")
    monkeypatch.chdir(here)
    args = [a.replace("W", str(world), 1) if a.startswith("W") else a for a in COMMANDS_WITH_OUT[command]]
    r = invoke([*args, "--out", out, "--overwrite"])
    one_error(r, "--out")
    assert "Device or resource busy" not in r.output
    assert sorted(os.listdir(tmp_path / "a")) == ["here"] and os.listdir(here) == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_output_where_nothing_can_be_written_names_the_users_path(world):
    one_error(invoke(["synth", "--preset", "tiny", "--rows", "2000", "--out", "/proc/bagpipe-out",
                      "--overwrite"]), "--out /proc/bagpipe-out")
    one_error(invoke(["profile", world / "ds", "--out", "/proc/bagpipe-out/x"]), "/proc/bagpipe-out/x")


# --------------------------------------------------------------------------- --save-model


def _no_training(monkeypatch):
    import bagpipe_cli.engine as engine

    def refuse(*a, **k):
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(engine, "run", refuse)


@pytest.mark.parametrize("how", ["a directory", "under a file", "unwritable", "the dataset"])
def test_a_bad_save_model_path_is_refused_before_training(world, tmp_path, monkeypatch, how):
    _no_training(monkeypatch)
    (tmp_path / "a-file").write_text("x")
    path = {"a directory": tmp_path, "under a file": tmp_path / "a-file" / "m.pt",
            "unwritable": Path("/proc/bagpipe-model.pt"), "the dataset": world / "ds"}[how]
    r = invoke(["train", world / "ds", *SMALL, "--out", tmp_path / "run", "--save-model", path])
    one_error(r, f"--save-model {path}")
    assert not (tmp_path / "run").exists()


def test_a_bad_checkpoint_dir_is_refused_before_training(world, tmp_path, monkeypatch):
    _no_training(monkeypatch)
    (tmp_path / "a-file").write_text("x")
    for ck in (tmp_path / "a-file", tmp_path / "a-file" / "ck", Path("/proc/bagpipe-ck")):
        r = invoke(["train", world / "ds", *SMALL, "--out", tmp_path / "run",
                    "--checkpoint-every", "1", "--checkpoint-dir", ck])
        one_error(r, f"--checkpoint-dir {ck}")


def test_a_failed_model_write_is_an_error_naming_the_users_path(world, tmp_path, monkeypatch):
    import errno

    import torch

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    model = tmp_path / "m.pt"
    r = invoke(["train", world / "ds", *SMALL, "--out", tmp_path / "run", "--save-model", model])
    line = one_error(r, str(model), "No space left on device (the disk is full)", code=2)
    assert line.startswith(f"Error: --save-model {model}")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert not (tmp_path / "run").exists()  # the run folder, written last, is not either
