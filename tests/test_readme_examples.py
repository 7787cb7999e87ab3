"""Every README example runs as written: each `bagpipe` line of the README's ```bash blocks
runs (in process, in a fresh working directory) and exits 0, unless it is listed in SKIPPED
with the reason. A few lines run at a smaller size (SMALLER: the numbers of rows and
iterations only); the README's input files are stood in for by the repository's real samples
(STAND_INS), and the bench folders of `make demo` and successors.yaml by small benches. A README line
that is neither run nor skipped, or a list entry the README no longer has, fails the test."""

from __future__ import annotations

import gzip
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REAL = Path(__file__).resolve().parent / "data" / "real"

SKIPPED = {
    "make demo": "a make target: installs, then benchmarks every system for minutes",
    "make test": "a make target: the whole test suite",
    "source .venv/bin/activate": "puts .venv/bin on the user's shell's PATH (here every command "
                                 "runs in process)",
    "bagpipe preprocess csv clicks.parquet --label clicked --categorical user,item --dense price "
    "--out data/mine": "clicks.parquet is the user's own file (no sample with those columns)",
    "bagpipe train data/demo --system bagpipe --trainers 2 --servers 1 --procs 4 --out "
    "results/dist": "starts 4 rank processes (tests/test_distributed.py runs --procs)",
    "bagpipe train data/demo --system bagpipe --trainers 8 --servers 3 --procs 6 --master "
    "10.0.0.1:29500 --node-rank 0 --out results/dist": "two machines (tests/test_distributed.py "
                                                      "runs the launch with both on loopback)",
    "bagpipe bench --quick": "minutes of runs (make demo runs it; a small bench stands in for "
                             "its folder, results/bench-demo)",
    "bagpipe bench benchmarks/paper.yaml --repeat 3 --out results/paper": "hours of runs",
    "bagpipe bench --resume --out results/paper": "continues results/paper, of the line above",
    "bagpipe bench benchmarks/successors.yaml --out results/successors":
        "42 runs, minutes (a small bench of the same systems stands in for its folder)",
    "bagpipe profile data/mine --batch-size 1024 --out results/mine-profile":
        "the Criteo sample profiled again (tests/test_profile.py profiles it against its definitions)",
    "bagpipe advise data/mine --trainers 16 --net-gbps 25 --out results/mine-advice":
        "a minute of runs and modelling (tests/test_advise.py runs advise, smaller)",
    "bagpipe advise data/mine --trainers 16 --net-gbps 25 --scale 100 --out results/mine-advice-x100":
        "writes the log 100 times larger, then minutes of runs (tests/test_advise.py runs --scale)",
    "bagpipe advise data/demo --trainers 16 --net-gbps 25 --out results/advice":
        "minutes of runs on the demo data (tests/test_advise.py runs advise, smaller)",
    "bagpipe simulate --cluster benchmarks/paper-scenario.yaml --out results/paper-scenario":
        "generates an 8M-row dataset (1.3 GB) and traces 488 batches of 16,384: minutes",
}

# README line -> (what it says, what runs instead): sizes only, so the test stays short.
SMALLER = {
    "bagpipe synth --out data/demo --preset criteo-kaggle --scale 0.01 --rows 500000":
        [("--rows 500000", "--rows 20000")],
    "bagpipe train data/demo --system bagpipe --batch-size 2048 --iterations 200 --lookahead 16 "
    "--optimizer adagrad --lr 0.05 --out results/bagpipe-run": [("--iterations 200", "--iterations 12")],
    "bagpipe train data/demo --system sync --batch-size 2048 --iterations 200 --optimizer adagrad "
    "--lr 0.05 --net-gbps 1 --net-latency-us 50 --out results/sync-run --save-model "
    "results/sync.pt": [("--iterations 200", "--iterations 12")],
    "bagpipe train data/demo --iterations 2000 --checkpoint-every 100 --out results/run1":
        [("--iterations 2000", "--iterations 30"), ("--checkpoint-every 100", "--checkpoint-every 10")],
    "bagpipe train data/demo --iterations 2000 --checkpoint-every 100 --out results/run1 --resume "
    "results/run1.ckpt --overwrite": [("--iterations 2000", "--iterations 30"),
                          ("--checkpoint-every 100", "--checkpoint-every 10")],
    "bagpipe simulate data/demo --trainers 8 --servers 4 --net-gbps 25 --net-latency-us 10 "
    "--compute-ms 5 --batch-size 16384 --lookahead 200 --out results/sim":
        [("--out", "--iterations 8 --warmup 2 --sweep-trainers 8 --sweep-gbps 25 --out")],
}

# The README's input files, stood in for by the real samples in the repository.
STAND_INS = {"train.txt": "criteo_kaggle_train_head1999.tsv",
             "test.txt": "criteo_kaggle_test_head1999.tsv",
             "day_0.gz": "criteo_kaggle_train_head1999.tsv",
             "day_1.gz": "criteo_kaggle_test_head1999.tsv",  # a day's rows, labelled below
             "train.gz": "deepctr_avazu_sample.txt"}


def readme_commands() -> list[str]:
    """The command lines of the README's ```bash blocks (continuations joined, comments cut)."""
    commands, in_bash, line = [], False, ""
    for text in README.read_text().splitlines():
        if text.startswith("```"):
            in_bash = text.strip() == "```bash" if not in_bash else False
            continue
        if not in_bash:
            continue
        line += text.rstrip()
        if line.endswith("\\"):
            line = line[:-1] + " "
            continue
        argv = shlex.split(line, comments=True)
        line = ""
        if argv:
            commands.append(" ".join(argv))
    return commands


def _stand_ins(here: Path) -> None:
    for name, sample in STAND_INS.items():
        data = (REAL / sample).read_bytes()
        if name == "day_1.gz":  # the test file has no label column: give every row one
            data = b"".join(b"0\t" + ln + b"\n" for ln in data.splitlines())
        (here / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)


def _small_bench(here: Path, name: str, systems: str, out: str) -> None:
    """A bench folder a README example makes (`make demo`'s, successors.yaml's), small."""
    (here / f"{name}.yaml").write_text(
        f"name: {name}\ndatasets:\n  - {{name: tiny, path: results/datasets/tiny, "
        f"synth: {{preset: tiny, rows: 8000, seed: 0}}}}\nmodels: [dlrm]\nsystems: [{systems}]\n"
        "repeat: 1\nbase: {batch_size: 256, iterations: 8, warmup: 2, eval_rows: 1000}\n"
        "profile: {policies: [none, bagpipe]}\n")
    r = CliRunner().invoke(cli, ["bench", f"{name}.yaml", "--out", out])
    assert r.exit_code == 0, r.output


def test_the_lists_name_readme_lines():
    commands = readme_commands()
    assert commands, "no ```bash block in the README"
    stale = [c for c in [*SKIPPED, *SMALLER] if c not in commands]
    assert not stale, f"no longer in the README: {stale}"
    for line, subs in SMALLER.items():
        assert all(old in line for old, _ in subs), line


# 21 s: in make test-all (and benchmarks/readme_examples.py runs every line at full size);
# make test, install included, is at its 6-minute budget.
@pytest.mark.extended
def test_every_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _stand_ins(tmp_path)
    _small_bench(tmp_path, "demo", "sync, bagpipe", "results/bench-demo")
    r = CliRunner().invoke(cli, ["report", "results/bench-demo", "--out", "results/bench-demo/report",
                                 "--format", "md"])  # as make demo leaves it: with its report
    assert r.exit_code == 0, r.output
    _small_bench(tmp_path, "successors", "sync, hotline, {name: slipstream, drop_target: 0.2}",
                 "results/successors")
    ran = []
    for line in readme_commands():
        if line in SKIPPED:
            continue
        assert line.startswith("bagpipe "), f"a README line neither run nor skipped: {line}"
        run = line
        for old, new in SMALLER.get(line, []):
            run = run.replace(old, new, 1)
        r = CliRunner().invoke(cli, shlex.split(run)[1:])
        assert r.exit_code == 0, f"{line}\n{r.output}"
        assert not re.search(r"^Error", r.output, re.M), r.output
        ran.append(line)
    assert len(ran) >= 12
