"""Reliability: kill a run (a whole process, a server rank, a trainer rank) and resume it to the
same parameters; every command against bad input gives one error line and keeps earlier outputs."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from helpers import assert_same_parameters, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.records.checkpoint import list_checkpoints

# kills, failed writes and resumes after them: make test-all (README: which tests are which)
pytestmark = pytest.mark.extended

# --------------------------------------------------------------------------- kill and resume

HANG_S = 120  # a hang guard, not a speed limit: each run here takes seconds on an idle machine
DIST = dict(batch_size=256, iterations=30, lookahead=4, optimizer="adagrad", trainers=2, servers=1,
            eval_rows=2000, seed=5, dense_optimizer="adam", dense_lr=0.01)


def _argv(kw: dict) -> list[str]:
    out = []
    for k, v in kw.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def _env(**extra: str) -> dict[str, str]:
    """One thread per process (the test machine's cores are shared; results do not depend on
    it), read when the run starts: the session's fork server (conftest) is in os.environ then."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _train_cmd(data, kw, out, *extra):
    return [sys.executable, "-m", "bagpipe_cli", "train", str(data), *_argv(kw), "--out", str(out),
            "--save-model", f"{out}.pt", *extra]


@pytest.mark.slow
def test_sigkill_of_a_whole_run_then_resume_gives_the_same_parameters(tiny_dataset, tmp_path):
    kw = dict(DIST, system="bagpipe", iterations=150, batch_size=128, trainers=1)
    ck = tmp_path / "ck"
    cmd = _train_cmd(tiny_dataset, kw, tmp_path / "run", "--checkpoint-every", "7",
                     "--checkpoint-dir", str(ck))
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        wait_until(p, lambda: list_checkpoints(ck), "a checkpoint", HANG_S, every=0.02)
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL, f"the run ended ({p.returncode}) before the kill"
    assert not (tmp_path / "run").exists()
    stopped_at = list_checkpoints(ck)[0].name
    r = subprocess.run(cmd + ["--resume", str(ck)], capture_output=True, text=True, timeout=HANG_S, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from" in r.stderr
    ref = train(TrainConfig(data=str(tiny_dataset), **kw))
    assert_same_parameters(f"{tmp_path / 'run'}.pt", ref)
    m = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert m["resumed_from"]["checkpoint"].endswith(stopped_at) and m["iterations"] == 150


@pytest.mark.slow
def test_sigkill_of_a_server_then_a_trainer_rank_then_resume_gives_the_same_parameters(
        tiny_dataset, tmp_path):
    """Real processes on loopback: 0 oracle, 1 server 0, 2..3 trainers 0..1."""
    kw = dict(DIST, system="bagpipe")
    ck = tmp_path / "ck"
    cmd = _train_cmd(tiny_dataset, kw, tmp_path / "run", "--procs", "4", "--timeout", "15",
                     "--checkpoint-every", "6", "--checkpoint-dir", str(ck))
    # A rank kills itself (SIGKILL) a moment after its part of the n-th checkpoint of its run:
    # first the server after iteration 12's, then, in the resumed run, trainer 1 after 18's.
    for rank, n, newest in [(1, 2, "ckpt-00000012"), (3, 1, "ckpt-00000018")]:
        fault = {"BAGPIPE_FAULT": f"rank={rank},after_checkpoints={n},delay_s=0.05"}
        extra = ["--resume", str(ck)] if rank == 3 else []
        r = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=HANG_S,
                           env=_env(**fault))
        assert r.returncode != 0 and f"(rank {rank}) exited with code -9" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        assert list_checkpoints(ck)[0].name == newest
        assert not (tmp_path / "run").exists()
    r = subprocess.run(cmd + ["--resume", str(ck)], capture_output=True, text=True, timeout=HANG_S, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from" in r.stderr and "ckpt-00000018" in r.stderr
    ref = train(TrainConfig(data=str(tiny_dataset), **kw))
    assert_same_parameters(f"{tmp_path / 'run'}.pt", ref)
    assert pd.read_csv(tmp_path / "run" / "metrics.csv")["loss"].tolist() == ref.metrics["loss"].tolist()


# --------------------------------------------------------------------------- bad input sweep

SMALL_TRAIN = ["--batch-size", "256", "--iterations", "3", "--eval-rows", "1000", "--lookahead", "2"]


def _criteo(path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(n):
        ints = [str(int(x)) for x in rng.integers(0, 50, 13)]
        cats = [f"{int(x):08x}" for x in rng.integers(0, 30, 26)]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *ints, *cats]) + "\n")
    path.write_text("".join(lines))
    return path


def _csv(path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    rows = ["y,a,b,x"] + [f"{rng.integers(0, 2)},u{rng.integers(0, 20)},v{rng.integers(0, 5)},{rng.random():.3f}"
                          for _ in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _dataset(tiny, tmp: Path, how: str | None = None) -> Path:
    d = tmp / f"ds-{how}"
    shutil.copytree(tiny, d)
    meta = json.loads((d / "meta.json").read_text())
    if how == "corrupt_meta":
        (d / "meta.json").write_text((d / "meta.json").read_text()[:57])
    elif how == "schema":
        (d / "meta.json").write_text(json.dumps({**meta, "schema_version": 99}))
    elif how == "short_array":
        np.save(d / "labels.npy", np.load(d / "labels.npy")[:-7])
    elif how == "missing_array":
        (d / "dense.npy").unlink()
    return d


def _commands(tiny, tmp: Path) -> dict[str, list[str]]:
    """Every command, with arguments that succeed (DATA stands for a dataset)."""
    return {
        "synth": ["synth", "--preset", "tiny", "--rows", "3000"],
        "preprocess criteo": ["preprocess", "criteo", str(_criteo(tmp / "c.tsv"))],
        "preprocess csv": ["preprocess", "csv", str(_csv(tmp / "c.csv")), "--label", "y",
                           "--categorical", "a,b", "--dense", "x"],
        "profile": ["profile", "DATA", "--batch-size", "256", "--lookahead", "4", "--cache-rows", "2000"],
        "train": ["train", "DATA", *SMALL_TRAIN],
        "simulate": ["simulate", "DATA", "--batch-size", "256", "--compute-ms", "5", "--net-gbps", "10"],
    }


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args)


def _assert_one_error_line(r, code: int | None = None):
    assert r.exit_code != 0, r.output
    if code is not None:
        assert r.exit_code == code, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sweep(tiny_dataset, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    return tiny_dataset, tmp, _commands(tiny_dataset, tmp)


DATA_COMMANDS = ["profile", "train", "simulate"]


@pytest.mark.parametrize("how", ["missing", "corrupt_meta", "schema", "short_array", "missing_array",
                                 "not_a_dataset"])
@pytest.mark.parametrize("command", DATA_COMMANDS)
def test_bad_dataset(sweep, command, how):
    tiny, tmp, cmds = sweep
    if how == "missing":
        data = tmp / "no-such-dataset"
    elif how == "not_a_dataset":
        data = tmp / f"empty-{command}"
        data.mkdir(exist_ok=True)
    else:
        (tmp / f"{command}-{how}").mkdir()
        data = _dataset(tiny, tmp / f"{command}-{how}", how)
    args = [str(data) if a == "DATA" else a for a in cmds[command]]
    r = _invoke([*args, "--out", str(tmp / f"out-{command}-{how}")])
    _assert_one_error_line(r)
    assert data.name in r.output  # the error names the dataset
    assert not (tmp / f"out-{command}-{how}").exists()


@pytest.mark.parametrize("command", ["preprocess criteo", "preprocess csv", "preprocess avazu",
                                     "bench", "report"])
def test_missing_input_file(sweep, command):
    _, tmp, _ = sweep
    extra = ["--label", "y", "--categorical", "a"] if command == "preprocess csv" else []
    r = _invoke([*command.split(), str(tmp / "no-such-input"), *extra, "--out", str(tmp / f"o-{command}")])
    _assert_one_error_line(r)
    assert "no-such-input" in r.output


def test_report_rejects_an_unknown_schema_version(sweep):
    _, tmp, _ = sweep
    src = Path(__file__).parent / "data" / "bench-example"
    runs = tmp / "bench-schema"
    shutil.copytree(src, runs)
    for s in runs.rglob("summary.json"):
        s.write_text(json.dumps({**json.loads(s.read_text()), "schema_version": 99}))
    r = _invoke(["report", str(runs), "--out", str(tmp / "report-schema")])
    _assert_one_error_line(r)


def _rename_fails(exc):
    real = os.rename

    def rename(src, dst, *a, **k):
        if ".tmp-" in str(src):  # only the atomic write's final rename
            raise exc
        return real(src, dst, *a, **k)

    return rename


def _dump_fails(exc):
    def dump(*a, **k):
        raise exc

    return dump


FAULTS = {
    "disk_full": ("json.dump", lambda: _dump_fails(OSError(errno.ENOSPC, "No space left on device"))),
    "ctrl_c": ("json.dump", lambda: _dump_fails(KeyboardInterrupt())),
    "read_only": ("os.rename", lambda: _rename_fails(PermissionError(errno.EACCES, "Permission denied"))),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("command", ["synth", "preprocess criteo", "preprocess csv", "profile",
                                     "train", "simulate"])
def test_a_failed_write_keeps_the_earlier_output(sweep, monkeypatch, command, fault):
    tiny, tmp, cmds = sweep
    out = tmp / f"keep-{command.replace(' ', '-')}-{fault}"
    args = [str(tiny) if a == "DATA" else a for a in cmds[command]] + ["--out", str(out)]
    r = _invoke(args)
    assert r.exit_code == 0, r.output
    before = _snapshot(out)
    target, make = FAULTS[fault]
    module, name = target.split(".")
    monkeypatch.setattr(__import__(module), name, make())
    r = _invoke([*args, "--overwrite"])
    monkeypatch.undo()
    _assert_one_error_line(r, 130 if fault == "ctrl_c" else None)
    if fault == "disk_full":
        assert "No space left on device" in r.output
    assert _snapshot(out) == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories (simulated above)")
def test_a_read_only_output_directory(sweep):
    tiny, tmp, cmds = sweep
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        for command in ["synth", "train"]:
            args = [str(tiny) if a == "DATA" else a for a in cmds[command]]
            r = _invoke([*args, "--out", str(ro / command)])
            _assert_one_error_line(r)
    finally:
        ro.chmod(0o700)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=600), kind=st.sampled_from(["criteo", "csv"]))
def test_fuzz_the_parsers_never_crash(tmp_path_factory, data, kind):
    tmp = tmp_path_factory.mktemp("fuzz")
    src = tmp / ("in.tsv" if kind == "criteo" else "in.csv")
    src.write_bytes(data)
    extra = [] if kind == "criteo" else ["--label", "y", "--categorical", "a"]
    r = _invoke(["preprocess", kind, str(src), *extra, "--out", str(tmp / "out")])
    assert isinstance(r.exception, SystemExit) or r.exception is None, repr(r.exception)
    assert r.exit_code in (0, 1, 2), r.output
    assert "Traceback" not in r.output


def test_a_csv_header_the_csv_module_refuses_is_one_line(tmp_path):
    """Found by the fuzz test: a bare carriage return inside the header line (its NUL byte
    now makes the file binary data, named as such before the header is read)."""
    src = tmp_path / "in.csv"
    for data, expect in ((b"\r\x00", ": not a text file: it looks like binary data"),
                         (b"y,\ra\n0,b\n", ":1: a carriage return (\\r) inside the line"),
                         (b'y,"a\n0,b\n', ":1: the header is not a CSV line")):
        src.write_bytes(data)
        r = _invoke(["preprocess", "csv", str(src), "--label", "y", "--categorical", "a",
                     "--out", str(tmp_path / "out")])
        assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit))
        assert f"{src}{expect}" in r.output.replace("\n", "") and "Traceback" not in r.output
        assert not (tmp_path / "out").exists()
