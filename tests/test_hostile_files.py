"""What others leave where bagpipe writes (issue 52): a claim file anyone can write, a folder
or a link where a claim belongs, an --out too deep to make, a bench another process is still
writing, a Ctrl-C while a job's ranks import torch. Nothing of the user's is ever removed,
and each ends in one line that says what is in the way and what to do.

A temporary is removed only when a killed run's claim lists it AND it holds the mark bagpipe
wrote in it with the token the claim lists (bagpipe_cli/files/temporaries.py, bagpipe_cli/files/claims.py)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_concurrency import WRITERS  # (tests/ is on the path, as pytest imports tests)

from bagpipe_cli.cli import cli
from bagpipe_cli.files.atomic import atomic_file, stale_temporaries
from bagpipe_cli.files.claims import HEADER, MARK, claim_file, mark_text
from bagpipe_cli.files.temporaries import UNMARKED

HERE = Path(__file__).parent
EXAMPLE_BENCH = HERE / "data" / "bench-example"
HANG_S = 120  # a hang guard, not a speed limit
TOKEN = "0123456789abcdef"


def invoke(args: list) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_error(r, code: int = 2) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code and len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def _users_folder(where: Path) -> dict[str, bytes]:
    where.mkdir()
    (where / "data.csv").write_text("mine\n")
    (where / "notes").mkdir()
    (where / "notes" / "n.txt").write_text("keep\n")
    return _snapshot(where)


def _snapshot(p: Path) -> dict[str, bytes]:
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


def _hostile_claim(out: Path, *lines: str) -> None:
    """A claim file beside `out` as a killed bagpipe would have left it (a valid header, a
    pid that runs no more), listing `lines`."""
    claim_file(out).write_text(f"{HEADER}\npid 999999\ncommand bagpipe train\n"
                               + "".join(f"{ln}\n" for ln in lines))


# --------------------------------------------------------------------------- a claim's word


# The six commands of issue 52, each writing `--out tmp_path/x`: test_concurrency.py's writers.
COMMANDS = ("synth", "preprocess", "train --out", "bench", "report", "simulate")


@pytest.mark.parametrize("command", [c if c == "synth" else pytest.param(c, marks=pytest.mark.extended)
                                     for c in COMMANDS])
def test_a_claim_listing_a_users_folder_never_removes_it(command, tiny_dataset, tmp_path):
    out = tmp_path / "x"
    mine = tmp_path / ".x.tmp-mine"
    before = _users_folder(mine)
    _hostile_claim(out, f"temporary {mine.name}")
    r = invoke(WRITERS[command](tmp_path, tiny_dataset)[1](0))
    assert r.exit_code == 0, r.output
    assert mine.is_dir() and _snapshot(mine) == before
    warned = [ln for ln in r.stderr.splitlines() if str(mine) in ln]
    assert len(warned) == 1 and warned[0].startswith(f"Warning: {mine} was left alone"), r.stderr
    assert "lacks the mark bagpipe puts in its own" in warned[0]
    assert not claim_file(out).exists()  # (the new claim no longer lists it)


def test_only_a_listed_temporary_holding_bagpipes_mark_with_the_listed_token_is_removed(tmp_path):
    out = tmp_path / "out"
    forged = {name: tmp_path / f".out.tmp-{name}" for name in
              ("untokened", "nomark", "othertoken", "linkedmark", "renamed")}
    for p in forged.values():
        _users_folder(p)
    (forged["othertoken"] / MARK).write_text(mark_text(forged["othertoken"].name, "f" * 16))
    (tmp_path / "elsewhere").write_text(mark_text(forged["linkedmark"].name, TOKEN))
    (forged["linkedmark"] / MARK).symlink_to(tmp_path / "elsewhere")
    (forged["renamed"] / MARK).write_text(mark_text(".out.tmp-original", TOKEN))
    a_file = tmp_path / ".out.tmp-file"
    a_file.write_text("mine")
    a_link = tmp_path / ".out.tmp-link"
    a_link.symlink_to(forged["nomark"])
    made = tmp_path / ".out.tmp-0a1b2c3d"  # as bagpipe made it
    (made / "x").mkdir(parents=True)
    (made / MARK).write_text(mark_text(made.name, TOKEN))
    _hostile_claim(out, f"temporary {forged['untokened'].name}",
                   *[f"temporary {p.name} {TOKEN}" for p in (*list(forged.values())[1:], a_file,
                                                             a_link, made)])
    found = {t.path.name: t for t in stale_temporaries(out)}
    assert found[made.name].removed and not made.exists()
    for p in (*forged.values(), a_file, a_link):
        assert not found[p.name].removed and found[p.name].why == UNMARKED, p
        assert os.path.lexists(p)
    assert a_file.read_text() == "mine" and all((p / "data.csv").is_file() for p in forged.values())


KILLED_WRITE = """
import os, sys
from pathlib import Path
from bagpipe_cli.files.atomic import atomic_file
with atomic_file(Path(sys.argv[1])) as f:
    f.write("half")
    f.flush()
    os._exit(9)  # killed midway: nothing cleans up
"""


def test_a_killed_file_writes_temporary_carries_the_mark_and_is_removed_after(tmp_path):
    out = tmp_path / "f.json"
    subprocess.run([sys.executable, "-c", KILLED_WRITE, str(out)], check=False, timeout=HANG_S)
    left = list(tmp_path.glob(".f.json.tmp-*"))
    assert len(left) == 1 and (left[0] / MARK).is_file() and (left[0] / "x").read_text() == "half"
    found = stale_temporaries(out)  # (as a command writing the path looks first)
    assert [(t.path, t.removed) for t in found] == [(left[0], True)]
    with atomic_file(out) as f:
        f.write("whole")
    assert out.read_text() == "whole" and not list(tmp_path.glob(".f.json.*"))


# --------------------------------------------------------------------------- what is in the way


@pytest.mark.parametrize("what", ["folder", "link"])
def test_a_folder_or_a_link_where_the_claim_belongs_is_named(tmp_path, what):
    out = tmp_path / "x"
    c = claim_file(out)
    if what == "folder":
        c.mkdir()
        (c / "mine.txt").write_text("mine")
    else:
        c.symlink_to(tmp_path / "target")
    line = one_error(invoke(["synth", "--preset", "tiny", "--rows", "2000", "--out", out]))
    said = "a folder" if what == "folder" else f"a symbolic link (to {tmp_path / 'target'})"
    assert line.startswith(f"Error: --out {out}: {c} is {said}, not bagpipe's claim"), line
    assert "move or rename it" in line and "Is a directory" not in line
    assert os.path.lexists(c) and not out.exists()


def test_an_out_too_deep_to_make_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    deep = "/".join(["a"] * 1000)
    line = one_error(invoke(["synth", "--preset", "tiny", "--rows", "2000", "--out", deep]))
    assert line.startswith("Error: --out a/a/") and "999 folders would have to be made" in line
    assert "mkdir -p" in line and not (tmp_path / "a").exists()


def test_a_report_of_a_bench_being_written_names_its_writer(tmp_path):
    """A bench that has just started (its folder not made yet), then one with finished runs
    and a report from before: the report names the bench's process, not "no runs" nor the
    earlier report."""
    bench = tmp_path / "bench"
    fd = os.open(claim_file(bench), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{HEADER}\npid 4242\ncommand bagpipe bench b.yaml --out {bench}\n".encode())
        line = one_error(invoke(["report", bench, "--format", "md"]))
        assert line == (f"Error: RESULTS {bench} is being written by another bagpipe process "
                        f"(pid 4242: bagpipe bench b.yaml --out {bench}); wait for it to end, then "
                        "report it (it has finished no run yet)"), line
        shutil.copytree(EXAMPLE_BENCH, bench)
        (bench / "report").mkdir(exist_ok=True)
        (bench / "report" / "report.md").write_text("earlier")
        line = one_error(invoke(["report", bench, "--format", "md"]))
        assert "(pid 4242: bagpipe bench b.yaml" in line and "wait for it to end" in line
        assert f"it has finished are in {bench / 'runs'}" in line, line
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- Ctrl-C


def _children(pid: int) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _a_rank_loads_torch(pid: int) -> bool:
    for c in _children(pid):
        try:
            if "libtorch" in Path(f"/proc/{c}/maps").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
@pytest.mark.extended
def test_ctrl_c_while_the_ranks_import_torch_is_the_launchers_one_line(tiny_dataset, tmp_path):
    """A terminal's Ctrl-C is a SIGINT to the job's whole process group: the ranks (plain
    processes here, not forked from a server) and the launcher. The ranks' copy is sent
    first, while one is still importing torch (whatever the machine's speed), the launcher's
    a moment later: one line, the launcher's, and 130; no rank's traceback."""
    env = {k: v for k, v in os.environ.items() if k != "BAGPIPE_FORKSERVER"}
    p = subprocess.Popen(
        [sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset), "--procs", "3",
         "--system", "sync", "--batch-size", "256", "--iterations", "100000",
         "--out", str(tmp_path / "run")],
        cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, process_group=0,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + HANG_S
        while not _a_rank_loads_torch(p.pid):
            assert p.poll() is None and time.monotonic() < deadline, "no rank started"
            time.sleep(0.005)
        for rank in _children(p.pid):
            os.kill(rank, signal.SIGINT)
        time.sleep(2)  # a rank that took it has printed its traceback by now
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=HANG_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("Error: interrupted"), err[-3000:]
    assert not (tmp_path / "run").exists() and not _children(p.pid)
