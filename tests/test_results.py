"""The results store (`bagpipe_cli.results`): one owner of run and bench folders.

Every reader checks what it reads, one unreadable run inside a folder is skipped with its
reason (and the CLI warns about it) while a run given directly must be readable, and the
environment is written once per run.
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.engine.records.metrics import COLUMN_NAMES
from bagpipe_cli.errors import DataError
from bagpipe_cli.results import (
    find_runs,
    load_runs,
    open_bench,
    open_run,
    read_runs,
    read_summary,
    write_run,
)
from bagpipe_cli.simulate.calibrate import calibrate

EXAMPLE = Path(__file__).resolve().parent / "data" / "bench-example"
RUN = "sync-dlrm-slow-4f76c80b-r2"  # a run of the example bench, damaged below


def _edit_json(path: Path, **changes) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    for k, v in changes.items():
        if v is None:
            obj.pop(k)
    path.write_text(json.dumps(obj))


def _drop_column(path: Path, column: str) -> None:
    pd.read_csv(path).drop(columns=column).to_csv(path, index=False)


def _cut(path: Path, lines: int) -> None:
    """The file without its last `lines` lines (a write cut short at a line's end)."""
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-lines]))


DAMAGE = {  # how a run is damaged -> (the file named, a phrase of the reason)
    "config_bad_json": (lambda r: (r / "config.json").write_text('{"schema_version": 1,'),
                        "config.json", "not valid JSON"),
    "summary_schema_2": (lambda r: _edit_json(r / "summary.json", schema_version=2),
                         "summary.json", "schema_version 2 is not supported"),
    "config_no_schema": (lambda r: _edit_json(r / "config.json", schema_version=None),
                         "config.json", "no schema_version"),
    "metrics_fewer_rows": (lambda r: _cut(r / "metrics.csv", 3),
                           "metrics.csv", "7 rows, but summary.json counts 10 iterations"),
    "metrics_cut_mid_row": (lambda r: (r / "metrics.csv").write_text(
        (r / "metrics.csv").read_text()[:-20]), "metrics.csv", "ends in the middle of a row"),
    "metrics_no_column": (lambda r: _drop_column(r / "metrics.csv", "forward"),
                          "metrics.csv", "lacks the columns forward"),
    "metrics_empty": (lambda r: (r / "metrics.csv").write_text(""),
                      "metrics.csv", "not a readable CSV table"),
    "metrics_text": (lambda r: (r / "metrics.csv").write_text(
        (r / "metrics.csv").read_text().replace("\n1,", "\nx,", 1)), "metrics.csv",
        "iteration hold values that are not numbers"),
    "metrics_gone": (lambda r: (r / "metrics.csv").unlink(), "metrics.csv", "cannot read"),
}


@pytest.fixture
def damaged_bench(tmp_path):
    def make(kind: str) -> tuple[Path, Path]:
        bench = tmp_path / "bench"
        shutil.copytree(EXAMPLE, bench, ignore=shutil.ignore_patterns("profiles"))
        DAMAGE[kind][0](bench / "runs" / RUN)
        return bench, bench / "runs" / RUN
    return make


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_one_damaged_run_is_skipped_with_its_reason(damaged_bench, kind):
    bench, run = damaged_bench(kind)
    _, file, phrase = DAMAGE[kind]
    res = load_runs(bench)
    assert len(res.runs) == 15 and str(run) not in set(res.runs["run_path"])
    assert res.metrics["run_path"].nunique() == 15
    assert [s.path for s in res.skipped] == [run]
    assert res.skipped[0].reason.startswith(f"{file}: ") and phrase in res.skipped[0].reason
    # The same run given directly is an error that names the file.
    with pytest.raises(DataError, match=phrase) as e:
        load_runs(run)
    assert str(e.value).startswith(f"{run / file}: ") and "\n" not in str(e.value)


def test_nothing_readable_left_is_an_error(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench, ignore=shutil.ignore_patterns("profiles"))
    for run in (bench / "runs").iterdir():
        _cut(run / "metrics.csv", 1)
    with pytest.raises(DataError, match=r"no readable runs under .*: 16 skipped, the first .*"
                                        r"metrics.csv: 9 rows"):
        load_runs(bench)


def test_report_warns_once_per_damaged_run_and_reports_the_rest(damaged_bench, tmp_path):
    bench, run = damaged_bench("metrics_fewer_rows")
    r = CliRunner().invoke(cli, ["report", str(bench), "--format", "md"])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [f"Warning: skipped {run}: metrics.csv: 7 rows, but "
                                     "summary.json counts 10 iterations; the file is truncated "
                                     "or damaged, rerun the run"]
    meta = json.loads((bench / "report" / "report.json").read_text())
    assert meta["runs"] == 15 and [s["path"] for s in meta["skipped"]] == [str(run)]
    assert RUN not in (bench / "report" / "runs.csv").read_text()
    assert "## Skipped runs" in (bench / "report" / "report.md").read_text()


def test_report_of_a_truncated_run_alone_is_refused(damaged_bench, tmp_path):
    _, run = damaged_bench("metrics_fewer_rows")
    out = tmp_path / "rep"
    r = CliRunner().invoke(cli, ["report", str(run), "--out", str(out)])
    assert r.exit_code == 2
    assert r.output.strip() == (f"Error: {run}/metrics.csv: 7 rows, but summary.json counts 10 "
                                "iterations; the file is truncated or damaged, rerun the run")
    assert not out.exists()


def test_calibration_skips_a_damaged_run(damaged_bench):
    bench, run = damaged_bench("summary_schema_2")
    per, source = calibrate(bench)
    assert "sync" in per
    assert [s["path"] for s in source["skipped"]] == [str(run)]


def test_a_damaged_index_is_not_read_past(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench, ignore=shutil.ignore_patterns("profiles"))
    _edit_json(bench / "index.json", schema_version=2)
    with pytest.raises(DataError, match=r"index.json: schema_version 2 is not supported"):
        find_runs(bench)


def test_bench_folder_files_read_back():
    b = open_bench(EXAMPLE)
    assert b.bench["kind"] == "bagpipe-bench" and "torch" in b.environment
    assert b.index["completed"] == len(b.table) == 16
    assert list(b.table["path"]) == [r["path"] for r in b.index["runs"]]


def _tiny_run(iterations: int = 4) -> tuple[dict, pd.DataFrame, dict]:
    metrics = pd.DataFrame({c: [float(i) for i in range(iterations)] for c in COLUMN_NAMES})
    summary = {"system": "sync", "iterations": iterations}
    return {"train": {"system": "sync", "warmup": 1}}, metrics, summary


def test_environment_is_written_once_per_run(tmp_path):
    config, metrics, summary = _tiny_run()
    write_run(tmp_path / "run", config, metrics, summary, bench={"name": "b", "run_id": "x"})
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["schema_version"] == 1 and "torch" in stored["environment"]
    assert stored["bench"] == {"name": "b", "run_id": "x"}
    assert "environment" not in json.loads((tmp_path / "run" / "summary.json").read_text())
    run = open_run(tmp_path / "run")
    assert run.environment == stored["environment"] and len(run.metrics) == 4
    row = load_runs(tmp_path / "run").runs.iloc[0]
    assert row["env_torch"] == stored["environment"]["torch"] and row["run_id"] == "x"


def test_older_runs_with_the_environment_twice_still_read(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE / "runs" / RUN, run)
    summary = json.loads((run / "summary.json").read_text())
    assert "environment" in summary  # written before it was kept in config.json alone
    assert load_runs(run).runs["env_torch"][0] == summary["environment"]["torch"]
    _edit_json(run / "config.json", environment=None)  # older still: only in summary.json
    assert open_run(run).environment == summary["environment"]


def test_a_run_named_directly_is_strict_even_next_to_a_folder(damaged_bench):
    bench, run = damaged_bench("metrics_gone")
    with pytest.raises(DataError, match="metrics.csv: cannot read"):
        read_runs([bench, run])


def test_validate_warns_about_a_damaged_run(tmp_path, tiny_dataset):
    from bagpipe_cli.engine import TrainConfig, train

    res = train(TrainConfig(data=str(tiny_dataset), system="sync", batch_size=512, iterations=4,
                            warmup=1, eval_rows=1000))
    for name in ("a", "b"):
        write_run(tmp_path / "runs" / name, res.config, res.metrics, res.summary)
    _cut(tmp_path / "runs" / "b" / "metrics.csv", 1)
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(tmp_path / "runs")])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[-1] == (f"Warning: skipped {tmp_path / 'runs' / 'b'}: metrics.csv: "
                                         "3 rows, but summary.json counts 4 iterations; the file "
                                         "is truncated or damaged, rerun the run")
    assert "(1 runs;" in r.stdout


def test_a_summary_of_the_previous_version_names_rank_0_as_today(tmp_path):
    """Before rank 0 had one name, summary.json called it the oracle: such a run still
    loads, its figures under today's names (`roles.planner`, `planner_ms_per_batch`)."""
    (tmp_path / "summary.json").write_text(json.dumps({
        "schema_version": 1, "system": "bagpipe", "oracle_ms_per_batch": 1.5, "iterations": 4,
        "roles": {"oracle": {"busy_s": 0.2, "traffic": {"sent_per_iteration": {"plan": 9.0}}},
                  "trainer0": {"busy_s": 1.0}}}))
    s = read_summary(tmp_path)
    assert s["planner_ms_per_batch"] == 1.5 and "oracle_ms_per_batch" not in s
    assert set(s["roles"]) == {"planner", "trainer0"}
    assert s["roles"]["planner"]["traffic"]["sent_per_iteration"]["plan"] == 9.0
