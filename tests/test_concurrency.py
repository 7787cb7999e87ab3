"""One writer per output path, across processes: two commands started together on one path
(at random offsets) leave exactly one winner; the other exits 2 with one line naming the path
and, while the winner runs, the process that holds it (its claim: bagpipe_cli/files/claims.py). A
checkpoint folder belongs to one run lineage; nothing bagpipe did not make is ever removed;
outputs follow the umask; the outputs of one command never collide."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.files.claims import HEADER, MARK, claim_file, mark_text

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
HANG_S = 240  # a hang guard, not a speed limit (the machine's 2 cores are shared)
SMALL = ["--batch-size", "256", "--iterations", "3", "--eval-rows", "1000", "--lookahead", "2"]
EXAMPLE_BENCH = Path(__file__).parent / "data" / "bench-example"
EXAMPLE_RUN = EXAMPLE_BENCH / "runs" / "bagpipe-dlrm-L4-no-net-f9cf982d-r1"


def invoke(args: list) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


def refused(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    for n in needles:
        assert n in line, (n, line)
    return line


@pytest.fixture
def held(tmp_path):
    """held(path) -> the claim on `path` held as a running bagpipe would (pid 4242), released
    at the test's end."""
    fds = []

    def hold(path: Path) -> Path:
        f = claim_file(path)
        f.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{HEADER}\npid 4242\ncommand bagpipe other --out {path}\n".encode())
        fds.append((fd, f))
        return f

    yield hold
    for fd, f in fds:
        f.unlink(missing_ok=True)
        os.close(fd)


def snapshot(p: Path) -> dict[str, bytes]:
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


# --------------------------------------------------------------------------- two writers


def _bench_file(tmp_path: Path, data: Path) -> Path:
    f = tmp_path / "b.yaml"
    f.write_text(f"name: b\ndatasets: [{{name: tiny, path: {data}}}]\nmodels: [dlrm]\n"
                 "systems: [sync]\nrepeat: 1\nbase: {batch_size: 256, iterations: 3, warmup: 0, "
                 "eval_rows: 1000}\nprofile: false\n")
    return f


def _csv(tmp_path: Path) -> Path:
    f = tmp_path / "clicks.csv"
    f.write_text("y,a\n" + "".join(f"{i % 2},u{i % 7}\n" for i in range(300)))
    return f


# command -> (the output under test, writer i's command line), from (tmp_path, dataset)
WRITERS = {
    "train --out": lambda t, d: ("x", lambda i: ["train", d, *SMALL, "--out", t / "x"]),
    "train --save-model": lambda t, d: ("m.pt", lambda i: [
        "train", d, *SMALL, "--out", t / f"run{i}", "--save-model", t / "m.pt"]),
    "profile": lambda t, d: ("x", lambda i: ["profile", d, "--batch-size", "256", "--out", t / "x"]),
    "simulate": lambda t, d: ("x", lambda i: ["simulate", d, "--compute-ms", "5", "--batch-size",
                                              "256", "--iterations", "20", "--systems",
                                              "sync,bagpipe", "--out", t / "x"]),
    "preprocess": lambda t, d: ("x", lambda i: ["preprocess", "csv", _csv(t), "--label", "y",
                                                "--categorical", "a", "--out", t / "x"]),
    "synth": lambda t, d: ("x", lambda i: ["synth", "--preset", "tiny", "--rows", "2000",
                                           "--out", t / "x"]),
    "report": lambda t, d: ("x", lambda i: ["report", EXAMPLE_RUN, "--format", "md",
                                            "--out", t / "x"]),
    "bench": lambda t, d: ("x", lambda i: ["bench", _bench_file(t, d), "--out", t / "x"]),
}


def _race(argv, offset: float, cwd: Path) -> list[tuple[int, int, str]]:
    """Start writer 0, then writer 1 `offset` seconds later: [(pid, exit code, stderr)]."""
    procs = []
    for i in (0, 1):
        if i:
            time.sleep(offset)
        procs.append(subprocess.Popen([sys.executable, "-m", "bagpipe_cli", *map(str, argv(i))],
                                      cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    return [(p.pid, p.wait(timeout=HANG_S), p.stderr.read()) for p in procs]


def assert_one_wins(results: list[tuple[int, int, str]], path: Path, why: str) -> None:
    """Exactly one exit 0; the other exit 2, one line naming the path: the claim's holder
    (the winner, pid and command) while it ran, or the finished output it does not replace."""
    codes = sorted(code for _, code, _ in results)
    assert codes == [0, 2], (why, [(c, e[-1500:]) for _, c, e in results])
    (wpid, _, _), (_, _, lost) = sorted(results, key=lambda r: r[1])
    line = one_line(lost)
    assert str(path) in line, (why, line)
    if "being written by another bagpipe process" in line:
        assert f"(pid {wpid}: bagpipe " in line, (why, line)
    else:  # the winner had ended: its output is there, not replaced without --overwrite
        assert "exists" in line, (why, line)
    assert path.exists(), why
    left = [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
    assert not left, (why, left)  # no claim, no temporary


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("command", list(WRITERS))
def test_two_writers_of_one_path_one_wins_the_other_is_told_who_holds_it(
        command, tiny_dataset, tmp_path):
    name, argv = WRITERS[command](tmp_path, tiny_dataset)
    seed = random.randrange(1 << 30)
    offset = random.Random(seed).uniform(0.0, 0.5)
    results = _race(argv, offset, tmp_path)
    assert_one_wins(results, tmp_path / name, f"{command}, writer 1 {offset:.3f} s later (seed {seed})")


@pytest.mark.slow
@pytest.mark.extended
def test_two_resumes_of_one_checkpoint_folder_do_not_both_run(tiny_dataset, tmp_path):
    ck = tmp_path / "ck"
    r = invoke(["train", tiny_dataset, *SMALL[:2], "--iterations", "4", "--checkpoint-every", "2",
                "--checkpoint-dir", ck, "--out", tmp_path / "a"])
    assert r.exit_code == 0, r.output
    before = snapshot(ck)
    offset = random.uniform(0.0, 0.5)
    results = _race(lambda i: ["train", tiny_dataset, *SMALL[:2], "--iterations", "12",
                               "--checkpoint-every", "2", "--checkpoint-dir", ck, "--resume", ck,
                               "--out", tmp_path / f"b{i}"], offset, tmp_path)
    codes = sorted(code for _, code, _ in results)
    assert codes == [0, 2], [(c, e[-1500:]) for _, c, e in results]
    (wpid, _, _), (_, _, lost) = sorted(results, key=lambda r: r[1])
    line = one_line(lost)
    assert str(ck) in line and ("being written" in line or "exists" in line), line
    if "being written" in line:
        assert f"pid {wpid}" in line
    s = json.loads(next(p for p in (tmp_path / "b0", tmp_path / "b1") if p.exists())
                   .joinpath("summary.json").read_text())
    assert Path(s["last_checkpoint"]).is_dir()  # what it names is there
    assert set(before) != set(snapshot(ck))  # the winner went on writing the lineage's folder


# --------------------------------------------------------------------------- held claims


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_claimed_output_is_refused_naming_its_holder_with_or_without_overwrite(
        tmp_path, held, overwrite):
    out = tmp_path / "x"
    out.mkdir()
    (out / "meta.json").write_text("{}")  # a dataset, replaceable with --overwrite when unclaimed
    held(out)
    r = invoke(["synth", "--preset", "tiny", "--rows", "2000", "--out", out]
               + ["--overwrite"] * overwrite)
    refused(r, f"--out {out} is being written by another bagpipe process",
            "(pid 4242: bagpipe other --out")
    assert os.listdir(out) == ["meta.json"]


def test_an_output_inside_a_claimed_one_and_a_report_of_a_bench_being_written_are_refused(
        tmp_path, held):
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE_BENCH, bench)
    held(bench)  # as `bagpipe bench --out bench` holds it while it runs
    before = snapshot(bench)
    refused(invoke(["report", bench, "--format", "md"]), str(bench), "pid 4242")
    other = tmp_path / "other"
    shutil.copytree(EXAMPLE_BENCH, other)
    refused(invoke(["report", other, "--format", "md", "--out", bench / "r"]),
            f"lies inside {bench}, which is being written", "pid 4242")
    refused(invoke(["report", bench, "--format", "md", "--out", tmp_path / "r"]),
            f"RESULTS {bench} is being written", "pid 4242")
    assert snapshot(bench) == before and not (tmp_path / "r").exists()


def test_a_resume_of_a_checkpoint_folder_a_live_run_writes_is_refused(tiny_dataset, tmp_path, held):
    ck = tmp_path / "ck"
    r = invoke(["train", tiny_dataset, *SMALL[:2], "--iterations", "4", "--checkpoint-every", "2",
                "--checkpoint-dir", ck, "--out", tmp_path / "a"])
    assert r.exit_code == 0, r.output
    before = snapshot(ck)
    held(ck)
    refused(invoke(["train", tiny_dataset, *SMALL, "--resume", ck, "--checkpoint-every", "2",
                    "--checkpoint-dir", ck, "--out", tmp_path / "b"]), f"--checkpoint-dir {ck}",
            "pid 4242")
    refused(invoke(["train", tiny_dataset, *SMALL, "--resume", ck, "--out", tmp_path / "c"]),
            f"--resume {ck} is being written", "pid 4242")
    assert snapshot(ck) == before


# --------------------------------------------------------------------------- checkpoint lineage


def test_a_fresh_run_refuses_another_runs_checkpoint_folder(tiny_dataset, tmp_path):
    ck = tmp_path / "ck"
    args = ["train", tiny_dataset, *SMALL[:2], "--iterations", "6", "--checkpoint-every", "2",
            "--checkpoint-dir", ck]
    r = invoke([*args, "--out", tmp_path / "a"])
    assert r.exit_code == 0, r.output
    before = snapshot(ck)
    for extra in ([], ["--checkpoint-keep", "1"], ["--overwrite"]):
        r = invoke([*args, "--out", tmp_path / "b", *extra])
        refused(r, f"--checkpoint-dir {ck} holds the checkpoints of another run",
                f"--resume {ck}")
        assert snapshot(ck) == before and not (tmp_path / "b").exists()
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["last_checkpoint"] == str(ck / "ckpt-00000004") and Path(s["last_checkpoint"]).is_dir()


def test_a_resumed_run_goes_on_in_its_lineages_folder_only(tiny_dataset, tmp_path):
    a, b = tmp_path / "cka", tmp_path / "ckb"
    for ck in (a, b):
        r = invoke(["train", tiny_dataset, *SMALL[:2], "--iterations", "4", "--checkpoint-every",
                    "2", "--checkpoint-dir", ck, "--out", tmp_path / f"run-{ck.name}"])
        assert r.exit_code == 0, r.output
    args = ["train", tiny_dataset, *SMALL[:2], "--iterations", "8", "--checkpoint-every", "2",
            "--resume", a]
    refused(invoke([*args, "--checkpoint-dir", b, "--out", tmp_path / "x"]),
            f"--checkpoint-dir {b} holds the checkpoints of another run")
    r = invoke([*args, "--checkpoint-dir", a, "--out", tmp_path / "y"])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "y" / "summary.json").read_text())
    assert s["last_checkpoint"] == str(a / "ckpt-00000006") and Path(s["last_checkpoint"]).is_dir()
    lineages = {json.loads((p / "state.json").read_text())["lineage"] for p in a.glob("ckpt-*")}
    assert len(lineages) == 1 and None not in lineages


def test_a_bench_never_writes_checkpoints_into_a_dataset(tiny_dataset, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds)
    before = snapshot(ds)
    for where in (ds, tmp_path / "other-ds"):
        if where != ds:
            shutil.copytree(tiny_dataset, where)
        f = tmp_path / "b.yaml"
        f.write_text(f"name: b\ndatasets: [{{name: tiny, path: {ds}}}]\nmodels: [dlrm]\n"
                     "systems: [sync]\nrepeat: 1\nbase: {batch_size: 256, iterations: 4, "
                     f"warmup: 0, eval_rows: 1000, checkpoint_every: 2, checkpoint_dir: {where}}}\n"
                     "profile: false\n")
        refused(invoke(["bench", f, "--out", tmp_path / "bench"]), f"checkpoint_dir {where}")
        assert not (tmp_path / "bench").exists()
    assert snapshot(ds) == before and not list(ds.glob("ckpt-*"))


# --------------------------------------------------------------------------- nothing of the user's


def test_a_users_files_named_like_temporaries_survive_and_a_killed_runs_are_removed(
        tiny_dataset, tmp_path):
    run = tmp_path / "run1"
    mine = [tmp_path / ".run1.tmp-mydata", tmp_path / ".run1.old-notes", tmp_path / ".run1.probe-x"]
    for p in mine[::2]:
        p.mkdir()
        (p / "data.csv").write_text("mine\n")
    mine[1].write_text("my notes\n")
    old = time.time() - 3600
    for p in mine:
        os.utime(p, (old, old))
    # A run killed outright left its temporary, listed in its claim with the token of the
    # mark bagpipe wrote in it (no process holds it).
    left = tmp_path / ".run1.tmp-0123abcd"
    (left / "x").mkdir(parents=True)
    (left / "x" / "metrics.csv").write_text("half")
    token = "0123456789abcdef"
    (left / MARK).write_text(mark_text(left.name, token))
    claim_file(run).write_text(f"{HEADER}\npid 999999\ncommand bagpipe train\n"
                               f"temporary {left.name} {token}\n")
    r = invoke(["train", tiny_dataset, *SMALL, "--out", run])
    assert r.exit_code == 0, r.output
    assert f"Warning: removed {left}" in r.stderr and not left.exists()
    for p in mine:
        assert p.exists() and p.name not in r.stderr, p
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run1", *(p.name for p in mine)])


# --------------------------------------------------------------------------- one command's outputs


def _no_training(monkeypatch):
    import bagpipe_cli.engine as engine

    def refuse(*a, **k):
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(engine, "run", refuse)


def test_save_model_and_trace_never_collide_nor_lie_inside_the_run(tiny_dataset, tmp_path, monkeypatch):
    _no_training(monkeypatch)
    run = tmp_path / "run"
    for model, trace, words in [
            (tmp_path / "same.bin", tmp_path / "same.bin", "are one path"),
            (run / "m.pt", tmp_path / "t.json", f"--save-model {run / 'm.pt'} lies inside --out {run}"),
            (tmp_path / "m.pt", run / "t.json", f"--trace {run / 't.json'} lies inside --out {run}")]:
        r = invoke(["train", tiny_dataset, *SMALL, "--out", run, "--save-model", model,
                    "--trace", trace])
        refused(r, words)
        assert not run.exists() and not model.exists() and not trace.exists()


def test_an_overwritten_model_is_kept_until_the_run_folder_is_written(tiny_dataset, tmp_path,
                                                                      monkeypatch):
    import bagpipe_cli.results as results

    model = tmp_path / "old.pt"
    model.write_bytes(b"the earlier model")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "x"))

    monkeypatch.setattr(results, "write_run", full)
    r = invoke(["train", tiny_dataset, *SMALL, "--out", tmp_path / "run", "--save-model", model,
                "--overwrite"])
    refused(r, "No space left on device")
    assert model.read_bytes() == b"the earlier model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pt"]


def test_an_output_that_appears_meanwhile_is_not_replaced(tmp_path):
    from bagpipe_cli.files.atomic import atomic_file
    from bagpipe_cli.files.claims import claim
    from bagpipe_cli.files.temporaries import rename_noreplace

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("new")
    b.write_text("theirs")
    with pytest.raises(FileExistsError):
        rename_noreplace(a, b)
    assert a.read_text() == "new" and b.read_text() == "theirs"
    c = claim(tmp_path / "f", "--save-model", overwrite=False)  # as a command without --overwrite
    try:
        with pytest.raises(Exception, match="appeared while this run wrote it"):
            with atomic_file(tmp_path / "f") as f:
                (tmp_path / "f").write_text("another program's")
                f.write("mine")
    finally:
        c.release()
    assert (tmp_path / "f").read_text() == "another program's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "f"]


# --------------------------------------------------------------------------- modes


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, mask):
    previous = os.umask(mask)
    try:
        out = tmp_path / "d"
        assert invoke(["synth", "--preset", "tiny", "--rows", "2000", "--out", out]).exit_code == 0
        f = tmp_path / "f.json"
        f.write_text("{}")
        f.chmod(0o644)
        from bagpipe_cli.files.atomic import write_json
        from bagpipe_cli.files.claims import claim

        c = claim(f, "--out", overwrite=True)  # (what --overwrite allows)
        try:
            write_json(f, {"a": 1})
        finally:
            c.release()
    finally:
        os.umask(previous)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o666 & ~mask}
    assert f.stat().st_mode & 0o777 == 0o666 & ~mask


# --------------------------------------------------------------------------- a launcher's folder


def test_a_killed_launchers_rank_folder_is_removed_by_the_next(tmp_path):
    from bagpipe_cli.launch.processes import rank_folder, remove_dead_rank_folders

    code = ("import sys, time; from bagpipe_cli.launch.processes import rank_folder\n"
            "with rank_folder(sys.argv[1]) as f:\n    print(f, flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                         text=True, env=ENV)
    try:
        dead = Path(p.stdout.readline().strip())
        assert dead.is_dir()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    (tmp_path / "bagpipe-ranks-mine").mkdir()  # not marked: never removed
    with rank_folder(tmp_path) as live:
        assert not dead.exists()  # the next launcher removed it
        assert remove_dead_rank_folders(tmp_path) == [] and live.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bagpipe-ranks-mine"]
