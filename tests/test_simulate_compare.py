"""What `bagpipe simulate` shows, as the library returns it: the speed-up table (with the
published figures only beside the systems the publication compared), the fastest system in
words, the reference's wait share, and `--validate`'s labels, table and tallies."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.registry import REFERENCE, SYSTEM_SETTINGS, SYSTEMS
from bagpipe_cli.simulate.compare import embedding_wait_line, fastest_line, ratio, speedup_table
from bagpipe_cli.simulate.inputs import ComputeTimes
from bagpipe_cli.simulate.model import Prediction
from bagpipe_cli.simulate.validate import (
    ValidationRow,
    setting_labels,
    summary_lines,
    unmodelled_note,
    validation_table,
)

OURS = next(n for n, s in SYSTEMS.items() if s.role == "ours")
BOUND = next(n for n, s in SYSTEMS.items() if s.role == "bound")
REPORTED = {"source": "a paper", "speedup_max": 5.6, "embedding_share": "~75%"}


def pred(system: str, mean_ms: float, fetch_ms: float = 0.0, sync_ms: float = 0.0) -> Prediction:
    return Prediction(system, median_ms=mean_ms, mean_ms=mean_ms, compute_ms=1.0,
                      exposed_fetch_ms=fetch_ms, exposed_sync_ms=sync_ms, link_busy=0.0)


def test_ratio_is_a_dash_where_it_is_not_a_number():
    assert ratio(3.0, 2.0) == "1.50x" and ratio(1.0, 0.0) == "-" and ratio(np.nan, 1.0) == "-"


def test_reported_figures_stand_only_beside_the_systems_the_publication_compared():
    """Every other system, ours at half its time: the published figure beside exactly the
    systems whose registry entry is `published`, "-" beside the rest (the bound included)."""
    others = [n for n in SYSTEMS if n != OURS]
    table = speedup_table([pred(OURS, 2.0), *(pred(n, 4.0) for n in others)], REPORTED)
    assert table.columns == ["system", "bagpipe speed-up", "reported"]
    assert "(reported: a paper)" in table.title
    got = {row[0]: row[1:] for row in table.rows}
    assert set(got) == set(others)  # ours is not compared with itself
    for name in others:
        want = "up to 5.6x" if SYSTEMS[name].published else "-"
        assert got[name] == ["2.00x", want], name
    assert got[BOUND][1] == "-" and got[REFERENCE][1] == "up to 5.6x"
    assert sum(SYSTEMS[n].published for n in others) >= 2  # some are, some are not
    assert not all(SYSTEMS[n].published for n in others)


def test_a_system_s_own_published_figure_wins_over_the_maximum_where_it_was_compared():
    compared = next(n for n, s in SYSTEMS.items() if s.published and s.role == "baseline")
    other = next(n for n, s in SYSTEMS.items() if not s.published and s.role == "baseline")
    rep = {**REPORTED, "speedup": {compared: "2.1x", other: "9x"}}
    rows = {r[0]: r for r in speedup_table([pred(OURS, 1.0), pred(compared, 3.0),
                                            pred(other, 0.5)], rep).rows}
    assert rows[compared] == [compared, "3.00x", "2.1x"]
    assert rows[other] == [other, "0.50x", "-"]  # not compared there: its entry is not shown


def test_without_published_figures_or_without_ours():
    table = speedup_table([pred(OURS, 1.0), pred(REFERENCE, 2.0)], None)
    assert table.columns == ["system", "bagpipe speed-up"] and table.rows == [[REFERENCE, "2.00x"]]
    assert "reported" not in table.title
    assert speedup_table([pred(REFERENCE, 2.0), pred(BOUND, 1.0)], REPORTED) is None


def test_fastest_line_names_the_best_the_runner_up_and_the_reference():
    preds = [pred(REFERENCE, 6.0), pred(OURS, 2.0), pred(BOUND, 3.0)]
    assert fastest_line(preds) == (f"fastest: {OURS}, 1.50x over {BOUND} (the best other), "
                                   f"3.00x over {REFERENCE}")
    # the reference as the runner-up is named once; a NaN time is left out; one system: no line
    assert fastest_line([pred(OURS, 2.0), pred(REFERENCE, 3.0), pred(BOUND, np.nan)]) == \
        f"fastest: {OURS}, 1.50x over {REFERENCE} (the best other)"
    assert fastest_line([pred(OURS, 2.0)]) == ""


def test_the_reference_s_wait_share_with_the_published_one():
    preds = [pred(REFERENCE, 8.0, fetch_ms=4.0, sync_ms=2.0), pred(OURS, 2.0)]
    assert embedding_wait_line(preds, REPORTED) == (
        f"{REFERENCE} waits for embedding rows and synchronisation 75% of its iteration "
        "(reported: ~75%)")
    assert embedding_wait_line(preds, None).endswith("75% of its iteration")
    assert embedding_wait_line([pred(OURS, 2.0)], REPORTED) == ""
    assert embedding_wait_line([pred(REFERENCE, 0.0)], REPORTED) == ""


# ------------------------------------------------------------------ simulate --validate

def settings(**kw) -> dict:
    """A run's settings as `MeasuredRun.settings` holds them."""
    return asdict(TrainConfig(data="/data/tiny", **kw))


def reader(setting: str) -> str:
    """A system that reads `setting` at the default cache size."""
    return next(n for n, s in SYSTEMS.items() if setting not in s.ignored_settings(None)
                and not s.external)


def test_two_runs_apart_only_in_their_cache_size_have_different_labels():
    system = reader("cache_rows")
    a, b = setting_labels([settings(system=system, cache_rows=1000),
                           settings(system=system, cache_rows=2000)])
    assert a != b and a.split()[-1] == "R1000" and b.split()[-1] == "R2000"


VALUES = {"lookahead": (8, 16), "round": (2, 4), "cache_rows": (1000, 2000), "staleness": (1, 2),
          "hot_sample": (0.5, 1.0), "snapshot_every": (10, 20), "drop_target": (0.1, 0.2),
          "stale_share": (0.5, 0.7)}


@pytest.mark.parametrize("setting", SYSTEM_SETTINGS)
def test_every_system_setting_read_tells_two_runs_apart(setting):
    system = reader(setting)
    labels = setting_labels([settings(system=system, **{setting: v}) for v in VALUES[setting]])
    assert len(set(labels)) == 2, labels


def test_a_label_shows_what_differs_and_only_what_the_system_reads():
    cached, plain = reader("cache_rows"), REFERENCE
    assert "cache_rows" in SYSTEMS[plain].ignored_settings(None)
    labels = setting_labels([settings(system=cached, cache_rows=1000, emb_dim=8),
                             settings(system=cached, emb_dim=32),
                             settings(system=plain, cache_rows=5, emb_dim=8)])
    # (in the order of `TrainConfig`'s fields)
    assert labels[0].endswith(" R1000 E8") and labels[1].endswith(" R=default E32")
    assert labels[2].endswith(" B1024 E8")  # sync reads no cache size: none in its label
    assert all("N1K1 B1024" in x and "opt=" not in x for x in labels)  # the same everywhere
    # the base every label has: the network, the cluster and the runtime
    net = setting_labels([settings(system=plain, net_gbps=0.5, net_latency_us=20, trainers=2,
                                   servers=3, transport="torch", procs=6)])
    assert net == ["0.5G/20us N2K3 B1024 procs"]
    data = setting_labels([settings(system=plain), {**settings(system=plain), "data": "/d/other"}])
    assert [x.split()[-1] for x in data] == ["data=tiny", "data=other"]


def _row(system: str, predicted: float, measured: float, *, runtime: str = "inproc",
         plan: tuple[float, float | None] = (0.0, None), emulated: bool = False,
         fetch_cpu_from: str = "own prefetch_wait (no network)", loaded: bool | None = False,
         compute: tuple[float, float | None] = (1.0, 1.0)) -> ValidationRow:
    """A validated run made by hand: predicted and measured median ms, rank 0's predicted
    MB and counted bytes per iteration, its recorded load (None: none recorded) and its
    compute's wall and CPU ms (None: no CPU columns)."""
    run = SimpleNamespace(
        run_id=f"{system}-{measured}", system=system, path=Path("runs") / system,
        trace=SimpleNamespace(runtime=runtime), cluster=SimpleNamespace(trainers=1),
        compute=ComputeTimes(fwd_bwd_ms=1.0), measured_median_ms=measured,
        measured_mean_ms=measured, network_emulated=emulated, fetch_cpu_from=fetch_cpu_from,
        counted_plan_bytes=plan[1], counted_server_rows=None, counted_collective=None,
        compute_clock="wall" if compute[1] is None else "cpu", compute_wall_ms=compute[0],
        compute_cpu_ms=compute[1], load=None if loaded is None else {"loaded": loaded})
    p = pred(system, predicted)
    p.planner_mb_per_iter = plan[0]
    return ValidationRow(run, p, setting=f"label of {system}")


def test_validate_table_and_tallies():
    rows = [_row(REFERENCE, 10.0, 10.0),
            _row(REFERENCE, 15.0, 10.0, emulated=True, fetch_cpu_from="none (no no-network twin)"),
            _row(OURS, 11.0, 10.0, runtime="distributed", plan=(1.05, 1e6))]
    table = validation_table(rows)
    assert "(3 runs; within ±20% passes)" in table.title and table.left == ("system", "setting")
    assert table.rows[0] == [REFERENCE, f"label of {REFERENCE}", "1.00", "10.00", "10.00",
                             "+0.0%", "ok", "-", "-", "-"]
    assert table.rows[1][5:7] == ["+50.0%", "OUT"]
    assert table.rows[2][5:] == ["+10.0%", "ok", "+5.0%", "-", "-"]
    lines = summary_lines(rows)
    assert lines[0] == (f"2 of 3 runs within ±20%; by system: {REFERENCE} 1/2, {OURS} 1/1; "
                        "0 of them ran loaded")
    assert lines[1] == "compute from CPU time for 3 run(s), from wall time for 0"
    assert "rank 0's plan bytes: 1 of 1 distributed runs within ±10%" in lines
    assert ("rank 0's plan bytes not checked for 2 run(s): in-process run: its links are "
            "emulated, not counted") in lines
    assert ("the servers' row bytes not checked for 1 run(s): not counted (a result from "
            "before the run counted its traffic)") in lines
    assert "each trainer's collective bytes not checked for 1 run(s): one trainer: no collectives" in lines
    assert lines[-1] == ("note: 1 emulated-network run(s) have no no-network twin; their fetch "
                         "CPU is taken as 0")
    out = _row(OURS, 10.0, 10.0, runtime="distributed", plan=(2.0, 1e6))
    assert validation_table([out]).rows[0][7] == "+100.0% OUT"


def test_validate_counts_loaded_runs_and_names_those_whose_wall_and_cpu_disagree():
    """The tally says how many runs ran loaded (and how many recorded no load), which clock
    their compute came from, and a warning names the runs whose wall compute is more than
    NOISE above their CPU compute."""
    rows = [_row(REFERENCE, 10.0, 10.0, loaded=True, compute=(3.0, 1.5)),
            _row(REFERENCE, 10.0, 10.0, compute=(1.1, 1.0)),
            _row(OURS, 10.0, 10.0, loaded=None, compute=(4.0, None))]
    lines = summary_lines(rows)
    assert lines[0].endswith("; 1 of them ran loaded (1 recorded no load)")
    assert lines[1].startswith("compute from CPU time for 2 run(s), from wall time for 1 (")
    [warning] = [ln for ln in lines if ln.startswith("Warning:")]
    assert f"{REFERENCE}-10.0 (wall 3.00 ms, CPU 1.50 ms)" in warning and "1 run(s)" in warning
    assert "loaded" in warning and "\n" not in warning
    assert f"{REFERENCE}-10.0 (wall 1.10" not in warning  # 10% apart: noise
    d = rows[0].to_dict()
    assert (d["compute_clock"], d["compute_wall_ms"], d["compute_cpu_ms"], d["loaded"]) == (
        "cpu", 3.0, 1.5, True)


def test_the_unmodelled_runs_are_noted():
    unmodelled = next(n for n, s in SYSTEMS.items() if not s.volumes)
    assert unmodelled_note({}) == ""
    note = unmodelled_note({unmodelled: 2})
    assert note.startswith(f"note: left out 2 {unmodelled} run(s): simulate has no model")
    assert f"{OURS}," in note and f"{unmodelled}," not in note


def test_the_prediction_table_names_what_each_mb_column_counts():
    """plan MB (rank 0's plans), server rows MB, collective MB: sync fetching rows reads more
    than its plan's 0.001; a system fetching 0 rows has a footnote on its setup copy."""
    from bagpipe_cli.simulate.compare import prediction_table

    cluster = SimpleNamespace(net_gbps=1.0, trainer_gbps=None, trainers=2, servers=1,
                              net_latency_us=0.0)
    cfg = SimpleNamespace(name="x", cluster=cluster, runtime="distributed", batch_size=64,
                          lookahead=4)
    sync = Prediction(REFERENCE, 2.0, 2.0, 1.0, 0.5, 0.5, 0.1, planner_mb_per_iter=0.001,
                      server_rows_mb_per_iter=1.17, collective_mb_per_iter=0.2)
    local = Prediction(BOUND, 1.5, 1.5, 1.0, 0.0, 0.5, 0.0, server_rows_mb_per_iter=0.4,
                       collective_mb_per_iter=0.9)
    result = SimpleNamespace(config=cfg, trace={"iterations": 10}, predictions=[sync, local],
                             volumes={REFERENCE: {"rows_fetched": 4571.0},
                                      BOUND: {"rows_fetched": 0.0}})
    t = prediction_table(result)
    assert "MB/iter" not in t.columns
    assert {"plan MB", "server rows MB", "collective MB"} <= set(t.columns)
    row = dict(zip(t.columns, t.rows[0], strict=True))
    assert (row["plan MB"], row["server rows MB"], row["collective MB"]) == ("0.001", "1.170", "0.200")
    (note,) = [line for line in t.caption.splitlines() if line.startswith("*")]
    assert note.startswith(f"* {BOUND} fetches 0 rows: its server rows MB are its tables' setup copy")
