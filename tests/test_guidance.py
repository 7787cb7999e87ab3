"""Small-data guidance (bagpipe_cli/guidance.py): when every table fits a trainer many times
over, `profile`, `bench` and `report` say that `local` is the answer; not for big tables."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli import guidance
from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig
from bagpipe_cli.engine import memory as mem
from bagpipe_cli.engine.config import EMB_OPTIMIZERS
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.report import ReportConfig, build_report

EXAMPLE = Path(__file__).resolve().parent / "data" / "bench-example"
GIB = 2**30
MOVIELENS = [944, 1683, 2, 21, 818, 42]  # MovieLens-100k's tables: 3,510 rows


def test_tiny_tables_fit_many_times_over_and_local_is_the_answer():
    fit = guidance.table_fit(MOVIELENS, 64, "adagrad", memory=16 * GIB, dataset="ml-100k")
    assert fit.rows == 3510 and fit.tables == 6 and fit.state_dim == 1
    assert fit.table_bytes == 4 * 3510 * 65
    assert fit.fits_many and fit.times == pytest.approx(16 * GIB / (4 * 3510 * 65))
    text = fit.sentence()
    assert text.startswith("Dataset `ml-100k`: all 6 tables (3,510 rows of 64 floats, 891.2 KiB "
                           "with their optimizer state) fit in a trainer's memory (16.0 GiB, "
                           "recorded by the runs) ~19,000 times over: `local` (every table "
                           "resident on the trainer) is the answer for this data")
    assert "a cache (Bagpipe or a baseline) only adds work here" in text


def test_big_tables_get_no_sentence():
    criteo = [10**7] * 26  # 260M rows of 64 floats: ~67 GB
    fit = guidance.table_fit(criteo, 64, "sgd", memory=128 * GIB)
    assert not fit.fits_many and fit.sentence() is None


def test_the_threshold_is_a_tenth_of_the_memory():
    fit = guidance.table_fit([1000], 16, "sgd", memory=4 * 1000 * 16 * guidance.FITS_TIMES)
    assert fit.fits_many and fit.sentence().startswith("The one table (1,000 rows")
    fit = guidance.table_fit([1000], 16, "sgd", memory=4 * 1000 * 16 * guidance.FITS_TIMES - 1)
    assert not fit.fits_many


def test_the_bytes_are_the_memory_estimates_tables():
    """The tables' bytes are engine/memory.py's `tables` part, row state included."""
    shape = mem.RunShape(cardinalities=tuple(MOVIELENS), dense=4, row_dim=65, state_dim=1,
                         eval_rows=100, dense_params=1000, kept_per_sample=10)
    cfg = TrainConfig(data="unused", optimizer="adagrad", emb_dim=64)
    (proc,) = mem.estimate_run(cfg, spec("sync"), shape).ranks
    assert proc.held["tables"] == guidance.table_bytes(3510, 65, 1)
    from bagpipe_cli.engine.trainer.optim import RowOptimizer

    for name in EMB_OPTIMIZERS:
        assert guidance.ROW_STATE_FLOATS[name] == RowOptimizer(name).state_dim


def test_stored_runs_use_the_memory_they_recorded(tmp_path):
    """The example's tables (10,080 rows of 16 floats) fit this machine many times over; where
    the runs recorded a trainer's memory too small for ten copies, nothing is said."""
    rep = build_report(ReportConfig(results=(EXAMPLE,), out=tmp_path / "r", formats=("md",)))
    (line,) = rep.verdict.guidance
    assert line.startswith("Dataset `tiny`: all 8 tables (10,080 rows of 16 floats")
    assert "this machine's" in line and line in (rep.out / "report.md").read_text()
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench)
    for run in (bench / "runs").iterdir():
        s = json.loads((run / "summary.json").read_text())
        s["memory"] = {"estimate_bytes": 10**8, "peak_bytes": 10**8, "machine_bytes": 4 * 10**6}
        (run / "summary.json").write_text(json.dumps(s))
    rep = build_report(ReportConfig(results=(bench,), out=tmp_path / "r2", formats=("md",)))
    assert rep.verdict.guidance == []
    (fit,) = guidance.runs_fit(rep.runs)
    assert fit.memory_source == guidance.RECORDED and fit.memory_bytes == 4 * 10**6


def test_profile_prints_the_sentence(tiny_dataset, tmp_path):
    r = CliRunner().invoke(cli, ["profile", str(tiny_dataset), "--policies", "none",
                                 "--batch-size", "1024", "--lookahead", "2", "--dim", "8",
                                 "--optimizer", "adagrad", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert "all 8 tables (10,080 rows of 8 floats, 354.4 KiB with their optimizer state)" in r.stdout
    assert "`local` (every table resident on the trainer) is the answer" in r.stdout
