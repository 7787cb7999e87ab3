"""bagpipe_cli.files.atomic and what rests on it: errors about a write name the user's path, never a
temporary one; text inputs that are not UTF-8 are one line naming the file, byte and line;
results store input paths absolute next to the user's form, so they are found from any
directory (and older results, which stored the user's form only, are still read)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import atomic_dir, atomic_file, path_record, read_text, recorded_path

SMALL = ["--batch-size", "256", "--iterations", "6", "--warmup", "1", "--eval-rows", "1000",
         "--lookahead", "2"]


def test_an_error_inside_an_atomic_dir_names_the_final_path(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError) as e, atomic_dir(out) as tmp:
        (tmp / "a.npy").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "a.npy"))
    assert e.value.filename == str(out / "a.npy")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_error_inside_an_atomic_file_names_the_file(tmp_path):
    path = tmp_path / "m.pt"
    with pytest.raises(OSError) as e, atomic_file(path, "wb"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.filename == str(path) and list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_made_is_named_as_given():
    with pytest.raises(ConfigError, match="--out /proc/bagpipe-x/y: cannot"):
        with atomic_dir(Path("/proc/bagpipe-x/y")):
            pass


@pytest.mark.parametrize("data, where", [(b"a: 1\nb: caf\xe9\n", "byte 0xe9 at line 2, column 7"),
                                         (b"\xff\xfe", "byte 0xff at line 1, column 1")])
def test_read_text_names_the_byte_and_line(tmp_path, data, where):
    f = tmp_path / "x.yaml"
    f.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        read_text(f)
    assert str(e.value) == f"{f}: not UTF-8 text ({where}); save the file as UTF-8"


@pytest.mark.parametrize("name", ["bench.yaml", "bench.toml"])
def test_a_bench_file_that_is_not_utf8_is_one_line(tmp_path, name):
    f = tmp_path / name
    f.write_bytes(b"name: x\n# r\xe9sum\xe9\n")
    r = CliRunner().invoke(cli, ["bench", str(f), "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert r.stderr.strip() == (f"Error: {f}: not UTF-8 text (byte 0xe9 at line 2, column 4); "
                                "save the file as UTF-8")


def test_a_cluster_file_that_is_not_utf8_names_its_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"trainers: 2\nname: caf\xe9\n")
    r = CliRunner().invoke(cli, ["simulate", "--cluster", str(f), "--compute-ms", "5"])
    assert r.exit_code == 2
    assert r.stderr.strip().startswith(f"Error: --cluster {f}: not UTF-8 text (byte 0xe9 at line 2")


def test_recorded_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    rec = path_record("d/../d")
    assert rec == {"path": str(tmp_path / "d"), "given": "d/../d"}
    assert recorded_path(rec) == tmp_path / "d"
    assert recorded_path({"path": "data/demo"}) == Path("data/demo")  # an older result
    assert recorded_path({}, "fallback") == Path("fallback")


def test_a_run_and_a_profile_are_found_from_another_directory(tiny_dataset, tmp_path, monkeypatch):
    """`simulate --validate RUN` and `simulate PROFILE` from anywhere (the dataset was given
    relative to the directory the run was made in)."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    shutil.copytree(tiny_dataset, work / "data" / "tiny")
    monkeypatch.chdir(work)
    r = CliRunner().invoke(cli, ["train", "data/tiny", *SMALL, "--out", "run"])
    assert r.exit_code == 0, r.output
    ds = json.loads((work / "run" / "config.json").read_text())["dataset"]
    assert ds["path"] == str(work / "data" / "tiny") and ds["given"] == "data/tiny"
    r = CliRunner().invoke(cli, ["profile", "data/tiny", "--batch-size", "256", "--lookahead", "2",
                                 "--policies", "none,bagpipe", "--out", "prof"])
    assert r.exit_code == 0, r.output
    prof = json.loads((work / "prof" / "profile.json").read_text())["dataset"]
    assert prof["path"] == str(work / "data" / "tiny") and prof["given"] == "data/tiny"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(work / "run")])
    assert r.exit_code == 0, r.output
    assert "1 runs within" in r.output or "0 of 1 runs within" in r.output
    r = CliRunner().invoke(cli, ["simulate", str(work / "prof"), "--compute-ms", "5",
                                 "--iterations", "6", "--warmup", "1", "--systems", "sync,bagpipe",
                                 "--sweep-trainers", "1", "--sweep-gbps", "10"])
    assert r.exit_code == 0, r.output


def test_an_older_run_with_a_relative_dataset_path_is_still_read(tiny_dataset, tmp_path, monkeypatch):
    from bagpipe_cli.simulate.calibrate import read_measured

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_dataset, tmp_path / "tiny")
    r = CliRunner().invoke(cli, ["train", "tiny", *SMALL, "--out", "run"])
    assert r.exit_code == 0, r.output
    cfg_file = tmp_path / "run" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["dataset"] = {k: v for k, v in cfg["dataset"].items() if k != "given"} | {"path": "tiny"}
    cfg_file.write_text(json.dumps(cfg))
    assert read_measured(tmp_path / "run").trace.data == "tiny"
    assert np.isfinite(read_measured(tmp_path / "run").measured_median_ms)
