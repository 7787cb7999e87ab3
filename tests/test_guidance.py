"""Small-data guidance (bagpipe_cli/report/guidance.py): when every table fits a trainer many times
over, `profile`, `bench` and `report` say that `local` can run (a size names no winner);
nothing for big tables. Beside measurements that disagree (`report.fit`), both are said."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig
from bagpipe_cli.engine import memory as mem
from bagpipe_cli.engine.config import EMB_OPTIMIZERS
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.report import ReportConfig, build_report, guidance

EXAMPLE = Path(__file__).resolve().parent / "data" / "bench-example"
GIB = 2**30
MOVIELENS = [944, 1683, 2, 21, 818, 42]  # MovieLens-100k's tables: 3,510 rows


def test_tiny_tables_fit_many_times_over_and_local_can_run():
    fit = guidance.table_fit(MOVIELENS, 64, "adagrad", memory=16 * GIB, dataset="ml-100k")
    assert fit.rows == 3510 and fit.tables == 6 and fit.state_dim == 1
    assert fit.table_bytes == 4 * 3510 * 65
    assert fit.fits_many and fit.times == pytest.approx(16 * GIB / (4 * 3510 * 65))
    text = fit.sentence()
    assert text.startswith("Dataset `ml-100k`: all 6 tables (3,510 rows of 64 floats, 891.2 KiB "
                           "with their optimizer state) fit in a trainer's memory (16.0 GiB, "
                           "recorded by the runs) ~19,000 times over, so `local` (every table on "
                           "each trainer: no fetches, all row gradients summed among the "
                           "trainers) can run here")
    # a size check names no winner: that is a measurement's or the model's to say
    assert "is the answer" not in text and "only adds work" not in text
    assert "`bagpipe bench`" in text and "`bagpipe simulate`" in text


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
    assert "`local` (every table on each trainer: no fetches" in r.stdout
    assert "is the answer" not in r.stdout


def test_profile_and_train_default_to_one_row_width():
    """`profile`'s --dim and `train`'s --emb-dim default alike (one field, TrainConfig's), so
    "fits N times over" reads the same in both."""
    from bagpipe_cli.cli.profile import profile
    from bagpipe_cli.cli.train import train
    from bagpipe_cli.profile import ProfileConfig

    dim = next(p.default for p in profile.params if p.name == "dim")
    emb = next(p.default for p in train.params if p.name == "emb_dim")
    assert dim == emb == TrainConfig.emb_dim == ProfileConfig(data="x").dim


def _with_local(tmp_path: Path, local_sps: list[float]) -> Path:
    """The example bench with every `lru` run relabelled `local` at `local_sps` samples/s."""
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench)
    lru = sorted(r for r in (bench / "runs").iterdir() if r.name.startswith("lru"))
    for i, run in enumerate(lru):
        for name in ("config.json", "summary.json"):
            d = json.loads((run / name).read_text())
            if name == "config.json":
                d["train"]["system"] = "local"
            else:
                d["system"], d["samples_per_s"] = "local", local_sps[i % len(local_sps)]
            (run / name).write_text(json.dumps(d))
    return bench


def test_a_bench_that_measured_local_slower_never_calls_it_the_answer(tmp_path):
    """Where `local` measured slower than another system outside the noise, the guidance says
    the fit and that measurement in one line, and no line calls `local` the answer."""
    bench = _with_local(tmp_path, [10.0, 11.0])
    rep = build_report(ReportConfig(results=(bench,), out=tmp_path / "r", formats=("md",)))
    (line,) = rep.verdict.guidance
    assert line.startswith("Dataset `tiny`: all 8 tables") and "can run here" in line
    assert "Measured beside it, `local` was not the fastest: in " in line
    assert "outside the noise of the repeats" in line
    assert not [x for x in rep.verdict.lines() if "is the answer" in x]
    assert all("`local` (every table on each trainer) was fastest" not in x
               for x in rep.verdict.lines())
    # local measured fastest: the fit alone (the setting's verdict names the winner)
    fast = _with_local(tmp_path / "fast", [10**7, 1.1 * 10**7])
    rep = build_report(ReportConfig(results=(fast,), out=tmp_path / "r2", formats=("md",)))
    (line,) = rep.verdict.guidance
    assert "Measured beside it" not in line


def test_the_bench_closing_lines_print_no_verdict_from_the_size(tmp_path, capsys):
    """`bench`'s closing verdict (`print_verdict`) gives the guidance as `report` does."""
    from bagpipe_cli.cli.report import print_verdict
    from bagpipe_cli.report.analysis import annotate, summary_table
    from bagpipe_cli.report.verdict import build_verdict
    from bagpipe_cli.results import load_runs

    runs = annotate(load_runs(_with_local(tmp_path, [10.0, 11.0])).runs)
    v = build_verdict(runs, summary_table(runs))
    print_verdict(v)
    text = capsys.readouterr().out
    assert "can run here" in text and "`local` was not the fastest" in text
    assert "is the answer" not in text
