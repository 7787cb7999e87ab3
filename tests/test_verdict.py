"""The report's verdict in words (report/verdict.py), on run folders made from one stored run
of tests/data/bench-example with the systems and figures each test needs: the fastest
system against the best other and sync, the noise, `local`, approximate systems, time to
target, and the flags (runs under load, compute times far apart; old runs that recorded no
contention)."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.report import ReportConfig, build_report
from bagpipe_cli.report.analysis import annotate, summary_table
from bagpipe_cli.report.verdict import COMPUTE_SPREAD, build_verdict
from bagpipe_cli.results import load_runs

EXAMPLE = Path(__file__).resolve().parent / "data" / "bench-example"
TEMPLATE = EXAMPLE / "runs" / "sync-dlrm-no-net-96356813-r1"


def make_runs(root: Path, runs: dict[str, list[dict]], train: dict[str, dict] | None = None) -> Path:
    """A results folder with, per system, one run per dict of summary.json fields (a repeat
    each); `train` adds config settings per system. Every run is TEMPLATE's but for those."""
    for system, repeats in runs.items():
        for r, fields in enumerate(repeats, 1):
            folder = root / "runs" / f"{system}-r{r}"
            shutil.copytree(TEMPLATE, folder)
            cfg = json.loads((folder / "config.json").read_text())
            cfg["train"].update(system=system, **(train or {}).get(system, {}))
            cfg["bench"].update(run_id=folder.name, repeat=r)
            (folder / "config.json").write_text(json.dumps(cfg))
            s = json.loads((folder / "summary.json").read_text())
            s.update(system=system, median_time_ms={**s["median_time_ms"], "forward": 5.0,
                                                    "backward": 10.0})
            s.update(fields)
            (folder / "summary.json").write_text(json.dumps(s))
    return root


def sps(*values: float) -> list[dict]:
    return [{"samples_per_s": v} for v in values]


def verdict_of(root: Path):
    runs = annotate(load_runs(root).runs)
    return build_verdict(runs, summary_table(runs))


def test_the_fastest_system_leads_not_bagpipe(tmp_path):
    """fae beats bagpipe: the words name fae first, with its margin over the best other system
    (bagpipe) and over sync, each outside the noise; Bagpipe's own figure is a later line."""
    root = make_runs(tmp_path, {"sync": sps(1000, 1100), "bagpipe": sps(2000, 2100),
                                "fae": sps(2800, 2900)})
    v = verdict_of(root)
    (s,) = v.settings
    assert s.fastest.variant == "fae"
    assert s.fastest.over_other.over == "bagpipe"
    assert s.fastest.over_other.ratio == pytest.approx(2850 / 2050)
    assert s.fastest.over_other.noise == "outside"
    assert s.fastest.over_sync.ratio == pytest.approx(2850 / 1050)
    (text,) = s.sentences
    assert text.startswith("all runs: `fae` was fastest, 2,850 samples/s (median of 2 repeats; "
                           "samples/s: each run's batch / its mean iteration)")
    assert "1.39× the throughput of the best other system, `bagpipe` (outside the noise" in text
    assert "2.71× the throughput of `sync` (outside the noise" in text
    lines = v.lines()
    assert lines.index(text) < lines.index(v.bagpipe)
    assert v.bagpipe.startswith("Bagpipe's largest speed-up over sync: 1.95×")
    # On the page the words come first: before the summary table and every figure.
    rep = build_report(ReportConfig(results=(root,), out=tmp_path / "r", formats=("md", "html")))
    md = (rep.out / "report.md").read_text()
    assert md.index("`fae` was fastest") < md.index("## Summary") < md.index("![")
    assert "Largest Bagpipe speed-up" not in md
    html = (rep.out / "report.html").read_text()
    assert html.index("<code>fae</code> was fastest") < html.index("<h2>Summary</h2>")
    saved = json.loads((rep.out / "report.json").read_text())["verdict"]
    assert saved["settings"][0]["fastest"]["variant"] == "fae"


def test_overlapping_repeats_are_within_the_noise(tmp_path):
    root = make_runs(tmp_path, {"sync": sps(1000, 1100), "bagpipe": sps(1900, 2400),
                                "fae": sps(2000, 2600)})
    (s,) = verdict_of(root).settings
    assert s.fastest.variant == "fae" and s.fastest.over_other.noise == "within"
    # the headline names both, in words, without a multiplier
    head = s.sentences[0]
    assert head.startswith("all runs: `fae` and `bagpipe` are within the noise of each other "
                           "(2,300 and 2,150 samples/s")
    assert "so the repeats do not show which is faster" in head
    assert "was fastest" not in head
    assert head.index("within the noise of each other") < head.index("×")
    assert s.fastest.over_sync.noise == "outside"
    assert "`fae`: 2.19× the throughput of `sync` (outside the noise" in head


def test_a_best_speedup_within_the_noise_has_no_headline_multiplier(tmp_path):
    root = make_runs(tmp_path, {"sync": sps(1000, 1300), "bagpipe": sps(1100, 1200)})
    v = verdict_of(root)
    assert v.bagpipe.startswith("Bagpipe against sync, at its best (`bagpipe`, all runs): "
                                "`bagpipe` and `sync` are within the noise of each other")
    assert "×" not in v.bagpipe
    assert "×" not in v.settings[0].sentences[0]


def test_one_repeat_leaves_the_noise_unknown(tmp_path):
    root = make_runs(tmp_path, {"sync": sps(1000), "fae": sps(3000)})
    (s,) = verdict_of(root).settings
    assert s.fastest.over_other.noise == "unknown"
    assert "(from one repeat: the noise is unknown)" in s.sentences[0]
    assert "median of 1 repeat;" in s.sentences[0]


def test_local_is_in_the_verdict_and_every_table(tmp_path):
    """On a small log every table fits on the trainer: local wins, and the words say so."""
    root = make_runs(tmp_path, {"sync": sps(1000, 1100), "bagpipe": sps(2000, 2200),
                                "local": sps(3800, 4000)})
    rep = build_report(ReportConfig(results=(root,), out=tmp_path / "r", formats=("md",)))
    (s,) = rep.verdict.settings
    assert s.fastest.variant == "local" and s.fastest.over_other.over == "bagpipe"
    assert "`local` (every table on each trainer) was fastest" in s.sentences[0]
    assert "local" in set(rep.summary["variant"]) and "local" in set(rep.breakdown["variant"])
    r = CliRunner().invoke(cli, ["report", str(root), "--out", str(tmp_path / "r2"),
                                 "--format", "md"])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert out.index("`local` (every table on each trainer) was fastest") < out.index("median over repeats")


def test_an_approximate_system_is_labelled_and_time_to_target_named(tmp_path):
    def reps(*pairs):
        return [{"samples_per_s": v, "evaluations": 2, "target_auc": 0.6, "time_to_target_s": t,
                 "iterations_to_target": None if t is None else 6} for v, t in pairs]

    root = make_runs(tmp_path, {"sync": reps((1000, 4.0), (1100, 4.2)),
                                "bagpipe": reps((2000, 2.0), (2100, 2.1)),
                                "het": reps((3000, None), (3100, None))},
                     train={"het": {"staleness": 4}})
    (s,) = verdict_of(root).settings
    assert s.fastest.variant == "het"
    assert s.fastest.fidelity == "approximate"
    assert "(approximate: it trains other parameters than sync" in s.sentences[0]
    assert s.to_target.variant == "bagpipe"
    assert s.to_target.over_sync.ratio == pytest.approx(4.1 / 2.05)
    assert s.sentences[1].startswith("all runs: fastest to the target AUC 0.6: `bagpipe`, 2.05 s "
                                     "(median of the 2 of 2 repeats that reached it): 2.00× "
                                     "sooner than the best other system, `sync` (outside")
    assert s.sentences[1].endswith("; not reached by `het`.")
    # An approximate runner-up is labelled too.
    root = make_runs(tmp_path / "b", {"sync": sps(1000, 1100), "bagpipe": sps(4000, 4100),
                                      "het": sps(3000, 3100)}, train={"het": {"staleness": 4}})
    (s,) = verdict_of(root).settings
    assert "the best other system, `het` (approximate) (outside" in s.sentences[0]


def test_a_run_under_load_is_flagged_before_the_verdict(tmp_path):
    loaded = {"cores": 2, "loadavg": [3.9, 4.2], "load_per_core": 1.9,
              "run_queue_wait_share": 0.41, "loaded": True,
              "note": "1.9 other runnable threads per core at the start"}
    idle = {**loaded, "load_per_core": 0.0, "run_queue_wait_share": 0.01, "loaded": False,
            "note": None}
    root = make_runs(tmp_path, {"sync": [{"samples_per_s": 1000, "contention": idle}] * 2,
                                "bagpipe": [{"samples_per_s": 50, "contention": loaded},
                                            {"samples_per_s": 60, "contention": idle}]})
    v = verdict_of(root)
    (flag,) = v.flags
    assert flag.kind == "loaded" and flag.runs == ("bagpipe-r1",)
    assert ("1 of 4 runs ran under load (`bagpipe-r1`): up to 1.9 other runnable processes per "
            "core at the start, and their threads waited for a CPU up to 41% of the time they "
            "could run.") in flag.text
    assert "rerun on an idle machine, or compare --threads 1" in flag.text
    rep = build_report(ReportConfig(results=(root,), out=tmp_path / "r", formats=("md",)))
    md = (rep.out / "report.md").read_text()
    assert md.index("Warning: all runs: 1 of 4 runs ran under load") < md.index("was fastest")
    # Runs already at --threads 1 are never told to compare --threads 1.
    one = make_runs(tmp_path / "one", {"sync": [{"samples_per_s": 1000, "contention": idle}] * 2,
                                       "bagpipe": [{"samples_per_s": 50, "contention": loaded}] * 2},
                    train={"sync": {"threads": 1}, "bagpipe": {"threads": 1}})
    (flag,) = verdict_of(one).flags
    assert "--threads 1" not in flag.text and "bagpipe advise DATA --trainers N" in flag.text


def test_compute_times_far_apart_are_flagged(tmp_path):
    """bagpipe computes the same model 2x slower than sync: flagged with both times and the fix;
    hotline's split batches compute differently by design and are left out."""
    def reps(fwd, bwd, n=2, **extra):
        return [{"samples_per_s": 1000.0 + i, "median_time_ms": {"forward": fwd, "backward": bwd},
                 **extra} for i in range(n)]

    root = make_runs(tmp_path, {"sync": reps(5.0, 10.0), "bagpipe": reps(10.0, 20.0),
                                "lru": reps(6.0, 11.0),
                                "hotline": reps(30.0, 40.0, popular_share=0.4)})
    v = verdict_of(root)
    (flag,) = v.flags
    assert flag.kind == "compute" and flag.runs == ("bagpipe",)
    assert "compute times 2.0× apart" in flag.text
    assert "`sync` 15.0, `bagpipe` 30.0, `lru` 17.0" in flag.text and "hotline" not in flag.text
    assert f"more than {COMPUTE_SPREAD:g}× slower than `sync`" in flag.text
    assert "not trustworthy" in flag.text and "--threads 1" in flag.text
    # The same runs at --threads 1: that remedy was followed; the next one is the model.
    one = make_runs(tmp_path / "one", {"sync": reps(5.0, 10.0), "bagpipe": reps(10.0, 20.0)},
                    train={"sync": {"threads": 1}, "bagpipe": {"threads": 1}})
    (flag,) = verdict_of(one).flags
    assert "--threads 1" not in flag.text
    assert "`bagpipe advise DATA --trainers N --net-gbps G`" in flag.text
    # Within the spread: nothing to say.
    calm = make_runs(tmp_path / "calm", {"sync": reps(5.0, 10.0), "bagpipe": reps(7.0, 14.0)})
    assert verdict_of(calm).flags == []


def test_old_runs_without_contention_do_not_crash(tmp_path):
    """The example bench predates `contention`: unknown, never loaded; a damaged value is
    unknown too."""
    runs = annotate(load_runs(EXAMPLE).runs)
    assert runs["contention_loaded"].isna().all()
    v = build_verdict(runs, summary_table(runs))
    assert not [f for f in v.flags if f.kind == "loaded"]
    assert len(v.settings) == 2
    root = make_runs(tmp_path, {"sync": [{"samples_per_s": 10.0, "contention": "busy"},
                                         {"samples_per_s": 11.0,
                                          "contention": {"loaded": "yes", "loadavg": "x"}}]})
    assert not verdict_of(root).flags


def test_bench_prints_the_flags_after_its_closing_table(tmp_path, capsys):
    """`bench`'s closing output judges its runs as `report` does: the flag, then the words."""
    from bagpipe_cli.cli.bench import _verdict

    loaded = {"cores": 2, "loadavg": [4.0, 4.0], "load_per_core": 2.0,
              "run_queue_wait_share": None, "loaded": True, "note": None}
    root = make_runs(tmp_path, {"sync": sps(1000, 1100),
                                "bagpipe": [{"samples_per_s": 50, "contention": loaded}] * 2})
    _verdict(root)
    out = capsys.readouterr().out
    assert out.index("warning: all runs: 2 of 4 runs ran under load (`bagpipe-r1`, `bagpipe-r2`): "
                     "up to 2.0 other runnable processes per core at the start. Their times") \
        < out.index("`sync` was fastest")


def test_a_loaded_run_s_own_note_never_repeats_the_remedy_it_followed():
    """launch/contention.py's note, as `train` prints it: at one torch thread, the next step."""
    from bagpipe_cli.launch.contention import describe

    c = {"cores": 2, "processes": 1, "load_per_core": 2.0, "run_queue_wait_share": 0.5,
         "steal_share": None}
    assert "compare --threads 1" in describe(c)["note"]
    note = describe(c, threads=1)["note"]
    assert "--threads 1" not in note and "`bagpipe advise DATA --trainers N --net-gbps G`" in note
