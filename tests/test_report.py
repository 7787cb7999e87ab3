"""`bagpipe report` and the results loader, on stored example results (tests/data).

tests/data/bench-example is a bench folder made by `bagpipe bench` (tiny synthetic dataset;
sync, bagpipe at L=4 and L=8, lru; with and without an emulated network; 2 repeats; the
profile's PNGs left out). tests/data/bench-example-summary.csv is its golden summary table.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.errors import DataError
from bagpipe_cli.report import ReportConfig, build_report
from bagpipe_cli.report.accuracy import display_accuracy
from bagpipe_cli.report.noise import NOISE_LEGEND
from bagpipe_cli.report.page import display_summary
from bagpipe_cli.results import load_metrics, load_results

DATA = Path(__file__).resolve().parent / "data"
EXAMPLE = DATA / "bench-example"
GOLDEN = DATA / "bench-example-summary.csv"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "report"
    return build_report(ReportConfig(results=(EXAMPLE,), out=out, formats=("png", "svg", "html", "md")))


def test_load_results_one_row_per_run():
    df = load_results(EXAMPLE)
    assert len(df) == 16
    assert df.groupby("system").size().to_dict() == {"bagpipe": 8, "lru": 4, "sync": 4}
    assert sorted(df["repeat"].unique()) == [1, 2]
    assert list(df["repeat"]) == [1] * 8 + [2] * 8  # bench order, repeats interleaved
    # A run folder and a parent folder work as well.
    one = load_results(Path(df["run_path"][0]))
    assert len(one) == 1 and one["run_id"][0] == df["run_id"][0]
    assert len(load_results(DATA)) == 16


def test_summary_table_matches_golden(report):
    golden = pd.read_csv(GOLDEN)
    got = report.summary
    assert list(got.columns) == list(golden.columns)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), golden, check_dtype=False, rtol=1e-9)
    written = pd.read_csv(report.out / "summary.csv")
    pd.testing.assert_frame_equal(written, golden, check_dtype=False, rtol=1e-9)


def test_summary_definitions_from_raw_files():
    """Recompute golden cells from the stored files, by the documented definitions: the
    median iteration is the median over repeats of each run's median (of its measured
    iterations), not the median of the iterations pooled."""
    golden = pd.read_csv(GOLDEN)
    runs = sorted((EXAMPLE / "runs").glob("bagpipe-dlrm-L8-slow-*"))
    assert len(runs) == 2
    times = [pd.read_csv(r / "metrics.csv")["time"].to_numpy()[2:] for r in runs]
    row = golden[(golden["variant"] == "bagpipe L=8") & golden["setting"].str.startswith("net")].iloc[0]
    assert row["iter_ms_median"] == pytest.approx(1e3 * np.median([np.median(t) for t in times]))
    # the mean iteration of the median samples/s: batch / samples/s exactly
    batch = json.loads((runs[0] / "config.json").read_text())["train"]["batch_size"]
    assert row["iter_ms_mean"] == pytest.approx(1e3 * batch / row["samples_per_s_median"])
    assert row["iter_ms_p90"] == pytest.approx(
        1e3 * np.median([np.percentile(t, 90) for t in times]))
    sps = [json.loads((r / "summary.json").read_text())["samples_per_s"] for r in runs]
    sync = [json.loads((r / "summary.json").read_text())["samples_per_s"]
            for r in sorted((EXAMPLE / "runs").glob("sync-dlrm-slow-*"))]
    assert row["speedup"] == pytest.approx(np.median(sps) / np.median(sync))
    # Its range over every pair of repeats (the noise test's).
    assert row["speedup_low"] == pytest.approx(min(sps) / max(sync))
    assert row["speedup_high"] == pytest.approx(max(sps) / min(sync))


def _set_summaries(bench: Path, values: dict[str, list[dict]]) -> None:
    """Overwrite summary.json fields of a copied example bench: `values` maps a run-id
    prefix to one dict of fields per repeat (r1, r2)."""
    for prefix, per_repeat in values.items():
        runs = sorted((bench / "runs").glob(f"{prefix}-*"))
        assert len(runs) == len(per_repeat)
        for run, fields in zip(runs, per_repeat, strict=True):
            s = json.loads((run / "summary.json").read_text())
            s.update(fields)
            (run / "summary.json").write_text(json.dumps(s))


def test_a_ratio_inside_the_repeats_noise_is_marked(tmp_path):
    """Time to target is shown with its range over repeats; a ratio to sync whose range over
    the pairs of repeats holds 1 is marked within the noise, one outside it is not, one from
    a single repeat is marked as having no spread; a legend line says what the marks mean."""
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench)

    def reps(*pairs):  # (time to target or None, samples/s) per repeat
        return [{"evaluations": 1, "target_auc": 0.55, "time_to_target_s": t,
                 "iterations_to_target": None if t is None else 6, "samples_per_s": sps}
                for t, sps in pairs]

    _set_summaries(bench, {
        "sync-dlrm-no-net": reps((2.0, 1000.0), (2.2, 1100.0)),
        "bagpipe-dlrm-L4-no-net": reps((1.0, 2000.0), (1.1, 2100.0)),  # clearly faster
        "bagpipe-dlrm-L8-no-net": reps((1.9, 1050.0), (2.1, 1150.0)),  # inside the noise
        "lru-dlrm-no-net": reps((1.5, 1500.0), (None, 1600.0)),  # one repeat reached
    })
    rep = build_report(ReportConfig(results=(bench,), out=tmp_path / "r", formats=("md",)))
    acc = rep.accuracy[rep.accuracy["setting"] == "no network emulation"].set_index("variant")
    assert acc.loc["bagpipe L=8", "tta_speedup_low"] == pytest.approx(2.0 / 2.1)
    assert acc.loc["bagpipe L=8", "tta_speedup_high"] == pytest.approx(2.2 / 1.9)
    assert acc.loc["bagpipe L=4", "tta_speedup_low"] == pytest.approx(2.0 / 1.1)
    shown = display_accuracy(acc.reset_index()).set_index("system")
    tta = shown["time-to-accuracy speed-up (range)"]
    assert tta["bagpipe L=8"] == "1.05× (0.95–1.16) †"
    assert tta["bagpipe L=4"] == "2.00× (1.82–2.20)"  # outside the noise: no mark
    assert tta["lru"] == "1.40× ‡" and tta["sync"] == "1.00×"
    ttt = shown["time to target (s): median (min–max)"]
    assert ttt["sync"] == "2.10 (2.00–2.20)" and ttt["lru"] == "1.50 (one repeat: no spread)"
    assert shown.loc["lru", "reached"] == "1/2"
    # The throughput speed-up likewise, in both tables.
    thr = shown["throughput speed-up (range)"]
    assert thr["bagpipe L=8"].endswith("†") and "†" not in thr["bagpipe L=4"]
    speed = display_summary(rep.summary)["speed-up vs sync: median (p10–p90)"]
    assert speed[2].endswith("†") and "†" not in speed[1]  # L=8, L=4 without a network
    md = (rep.out / "report.md").read_text()
    assert md.count(f"† {NOISE_LEGEND['†']}.") == 2  # under the summary and the accuracy table
    assert f"‡ {NOISE_LEGEND['‡']}." in md


def test_every_figure_is_written(report):
    names = ["speedup", "time_breakdown", "throughput_vs_lookahead", "loss", "rows_fetched",
             "access_cdf"]
    assert report.figures == names
    for n in names:
        assert (report.out / f"{n}.png").read_bytes()[:8] == PNG
        assert b"<svg" in (report.out / f"{n}.svg").read_bytes()[:500]
    # The example does not vary the cache size: that plot is skipped with a note.
    assert not (report.out / "throughput_vs_cache.png").exists()
    assert any("cache_rows" in n for n in report.notes)


def test_pages(report):
    md = (report.out / "report.md").read_text()
    assert "## Summary" in md and "| net 0.5 Gbit/s, 20 µs | bagpipe L=8 |" in md
    for n in report.figures:
        assert f"({n}.png)" in md
    assert "bitwise identical to sync" in md  # the loss check on the stored curves
    html = (report.out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(report.figures)
    assert "<table>" in html
    meta = json.loads((report.out / "report.json").read_text())
    assert meta["runs"] == 16 and meta["figures"] == report.figures


def test_report_cli_default_out_and_rerun(tmp_path):
    res = tmp_path / "bench"
    shutil.copytree(EXAMPLE, res)
    r = CliRunner().invoke(cli, ["report", str(res), "--format", "png,md"])
    assert r.exit_code == 0, r.output
    assert (res / "report" / "report.md").is_file() and not (res / "report" / "report.html").exists()
    assert "report.md" in r.output
    # An earlier report follows the rule of every output: kept without --overwrite ...
    r = CliRunner().invoke(cli, ["report", str(res), "--format", "html"])
    assert r.exit_code == 2 and "exists and is not empty; pass --overwrite" in r.output
    assert (res / "report" / "report.md").is_file()
    # ... replaced with it, and not read as results.
    r = CliRunner().invoke(cli, ["report", str(res), "--format", "html", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert (res / "report" / "report.html").is_file() and not (res / "report" / "report.md").exists()


def test_unknown_schema_version_is_skipped_in_a_bench_and_rejected_alone(tmp_path):
    res = tmp_path / "bench"
    shutil.copytree(EXAMPLE, res)
    run = sorted((res / "runs").iterdir())[0]
    s = json.loads((run / "summary.json").read_text())
    s["schema_version"] = 2
    (run / "summary.json").write_text(json.dumps(s))
    # Inside a bench folder: the other 15 runs are read, the one is skipped with its reason.
    df = load_results(res)
    assert len(df) == 15 and str(run) not in set(df["run_path"])
    (skipped,) = df.attrs["skipped"]
    assert skipped.path == run and skipped.reason.startswith(
        "summary.json: schema_version 2 is not supported by this bagpipe (expects 1)")
    assert len(load_metrics(res)["run_path"].unique()) == 15
    # Given directly: an error naming the file.
    with pytest.raises(DataError, match="schema_version 2 is not supported by this bagpipe "
                                        r"\(expects 1\)"):
        load_results(run)
    with pytest.raises(DataError, match="schema_version 2"):
        load_metrics(run)
    r = CliRunner().invoke(cli, ["report", str(run)])
    assert r.exit_code == 2 and f"{run}/summary.json: schema_version 2" in r.output
    assert r.output.strip().count("\n") == 0


@pytest.mark.parametrize("key, value, words", [
    ("samples_per_s", "fast", "samples_per_s is 'fast', not a number"),
    ("median_iter_ms", -3.5, "median_iter_ms is -3.5, below zero"),
    ("iterations", True, "iterations is True, not a number"),
    ("time_to_target_s", -0.5, "time_to_target_s is -0.5, below zero"),
])
def test_a_damaged_summary_figure_is_named_and_its_run_skipped(tmp_path, key, value, words):
    res = tmp_path / "bench"
    shutil.copytree(EXAMPLE, res)
    run = sorted((res / "runs").iterdir())[0]
    s = json.loads((run / "summary.json").read_text())
    s[key] = value
    (run / "summary.json").write_text(json.dumps(s))
    loaded = load_results(res)
    (skipped,) = loaded.attrs["skipped"]
    assert skipped.path == run and words in skipped.reason
    r = CliRunner().invoke(cli, ["report", str(run)])  # given itself: one line, exit 2
    assert r.exit_code == 2 and words in r.output and r.output.strip().count("\n") == 0
    r = CliRunner().invoke(cli, ["report", str(res), "--format", "md"])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [f"Warning: skipped {run}: {skipped.reason}"]
    assert "15 runs" in r.stdout


def test_bad_inputs(tmp_path):
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such results folder" in r.output
    r = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no runs" in r.output
    r = CliRunner().invoke(cli, ["report", str(EXAMPLE), "--format", "pdf", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--format 'pdf'" in r.output


def test_report_help_has_example():
    r = CliRunner().invoke(cli, ["report", "--help"])
    assert r.exit_code == 0 and "Example" in r.output


def test_a_thin_held_out_auc_is_noted(tmp_path):
    """A held-out AUC on fewer than 30 samples of a class: a note on the page and in report.json."""
    bench = tmp_path / "bench"
    shutil.copytree(EXAMPLE, bench)
    runs = sorted((bench / "runs").iterdir())
    for i, run in enumerate(runs[:2]):
        s = json.loads((run / "summary.json").read_text())
        s.update(eval_positives=3 + i, eval_negatives=997 - i)
        (run / "summary.json").write_text(json.dumps(s))
    s = json.loads((runs[2] / "summary.json").read_text())
    s.update(eval_positives=30, eval_negatives=970)  # enough of each
    (runs[2] / "summary.json").write_text(json.dumps(s))
    res = build_report(ReportConfig(results=(bench,), out=tmp_path / "r", formats=("md",)))
    notes = [n for n in res.notes if n.startswith("Held-out AUC")]
    assert len(notes) == 1
    assert f"`{runs[0].name}` (3 positive, 997 negative)" in notes[0]
    assert f"`{runs[1].name}` (4 positive, 996 negative)" in notes[0] and runs[2].name not in notes[0]
    assert notes[0] in json.loads((tmp_path / "r" / "report.json").read_text())["notes"]
    assert notes[0] in (tmp_path / "r" / "report.md").read_text()
    # Without the counts (runs written before they were kept) nothing is said.
    assert not [n for n in build_report(ReportConfig(results=(EXAMPLE,), out=tmp_path / "r2",
                                                     formats=("md",))).notes
                if n.startswith("Held-out AUC")]


def test_the_lookahead_plot_labels_every_measured_value():
    from bagpipe_cli.report.plots import plot_sweep

    runs = pd.DataFrame({"setting": ["s"] * 4, "system": ["bagpipe"] * 4,
                         "lookahead": [3, 3, 7, 7], "samples_per_s": [10.0, 11.0, 12.0, 13.0]})
    fig = plot_sweep(runs, "lookahead", runs.iloc[0:0], "sub")
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels() if t.get_text()}
    assert list(ax.get_xticks()) == [3, 7] and labels == {"3", "7"}


def test_bench_closing_table_and_report_show_the_same_medians(report):
    """One definition (results.config_figures): for the same runs, `bench`'s closing table
    (from its index rows) and the report's summary and breakdown give the same median
    samples/s and median iteration; the closing table prints the mean iteration those
    samples/s make, so its two columns rank alike (the verdict's one statistic)."""
    from bagpipe_cli.cli.bench import _summary_table, closing_rows

    index = pd.DataFrame(json.loads((EXAMPLE / "index.json").read_text())["runs"])
    # a bench of today records each run's mean iteration in its index (the example predates it)
    runs = report.runs.set_index("run_id")
    index["mean_iter_ms"] = [1e3 * runs.at[r, "batch_size"] / runs.at[r, "samples_per_s"]
                             for r in index["run_id"]]
    bench = closing_rows(index)
    assert len(bench) == len(report.summary) == 8
    for b, s, bd in zip(bench, report.summary.itertuples(), report.breakdown.itertuples(),
                        strict=True):
        assert b["system"] == s.system
        assert b["iter_ms_median"] == s.iter_ms_median == bd.median_iter_ms
        assert b["samples_per_s_median"] == s.samples_per_s_median
        assert b["iter_ms_mean"] == pytest.approx(s.iter_ms_mean)
    table = _summary_table(index, "example", EXAMPLE)
    assert table.columns[4].header == "mean ms" and "ranked by one statistic" in table.caption
    printed = list(table.columns[4].cells)
    assert printed == [f"{x:.1f}" for x in report.summary["iter_ms_mean"]]
    # one rank: the higher samples/s, the lower mean ms, in every pair of configurations
    sps = [float(c.replace(",", "")) for c in table.columns[3].cells]
    ms = [float(c) for c in printed]
    assert sorted(range(8), key=lambda i: -sps[i]) == sorted(range(8), key=lambda i: ms[i])
    # The example's pooled iterations give another median: the one the report used to show.
    pooled = load_metrics(EXAMPLE)
    sync = pooled[(pooled["system"] == "sync") & pooled["measured"]
                  & pooled["run_id"].str.contains("no-net")]
    assert abs(1e3 * sync["time"].median() - bench[0]["iter_ms_median"]) > 1.0
