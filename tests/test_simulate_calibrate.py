"""`simulate --calibrate`: the model's forward+backward measured once, the median over the
systems' runs, with a warning where their own figures disagree beyond noise; and the
comparison tables cover every system simulated, `local` included."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.engine.records.metrics import CPU_PHASES, TIME_KEYS
from bagpipe_cli.simulate.calibrate import DISAGREEMENT, calibrate, read_measured
from bagpipe_cli.simulate.cpu_time import NOISE

# A stored no-network run (batch 256, one trainer, model dlrm): the template of the runs below.
TEMPLATE = (Path(__file__).parent / "data" / "bench-example" / "runs"
            / "sync-dlrm-no-net-96356813-r1")


def fake_run(folder: Path, system: str, fwd_bwd_ms: float, optimizer_ms: float = 1.0,
             popular: int = 0, cpu: float | None = None, loaded: bool | None = None) -> Path:
    """The template run as `system`'s, its timers set to `fwd_bwd_ms` of forward+backward
    (a third forward) and `optimizer_ms` each iteration; `popular` samples computed first;
    with `cpu`, CPU columns of `cpu` times the wall ones (the template, from before them,
    has none); `loaded`: its summary's contention.loaded."""
    shutil.copytree(TEMPLATE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["train"]["system"] = system
    (folder / "config.json").write_text(json.dumps(cfg))
    m = pd.read_csv(folder / "metrics.csv")
    m["forward"], m["backward"] = fwd_bwd_ms / 3e3, 2 * fwd_bwd_ms / 3e3
    m["optimizer"] = optimizer_ms / 1e3
    if popular:
        m["popular_samples"] = popular
    m["time"] = m[list(TIME_KEYS)].sum(axis=1) + 1e-4
    if cpu is not None:
        for k in CPU_PHASES:
            m[f"{k}_cpu"] = cpu * m[k]
        m["worker_cpu"], m["compute_threads"] = 0.0, 1
    m.to_csv(folder / "metrics.csv", index=False)
    if loaded is not None:
        summary = json.loads((folder / "summary.json").read_text())
        summary["contention"] = {"loaded": loaded, "load_per_core": 2.0 if loaded else 0.0,
                                 "run_queue_wait_share": 0.7 if loaded else 0.05}
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def fake_runs(root: Path, runs: dict[str, list[float]], **kw: dict) -> Path:
    for system, figures in runs.items():
        for i, fb in enumerate(figures):
            fake_run(root / f"{system}-r{i}", system, fb, **kw.get(system, {}))
    return root


# Each system's own forward+backward (ms), as a loaded machine measures them: het's is 4x
# local's; hotline (which splits its batches in two passes) keeps its own.
DISAGREEING = {"sync": [3.0, 3.4], "het": [6.0], "local": [1.5], "bagpipe": [2.0],
               "hotline": [9.0]}
SPLIT = {"hotline": {"popular": 100}, "het": {"optimizer_ms": 2.0}}


def test_calibration_measures_forward_backward_once_as_the_median(tmp_path):
    per, src = calibrate(fake_runs(tmp_path, DISAGREEING, **SPLIT))
    # The median over the five one-pass runs (1.5, 2, 3, 3.4, 6), for every one-pass system
    # and for a system without runs ("*"); not each system's own.
    for s in ("sync", "het", "local", "bagpipe", "*"):
        assert per[s].fwd_bwd_ms == pytest.approx(3.0), s
        assert per[s].bwd_ms == pytest.approx(2.0), s  # its measured share, 2/3
    assert per["hotline"].fwd_bwd_ms == pytest.approx(9.0)  # two passes: its own
    assert per["het"].optimizer_ms == pytest.approx(2.0)  # a system's own phase stays its own
    assert per["sync"].optimizer_ms == pytest.approx(1.0)
    fb = src["fwd_bwd"]
    assert fb["ms"] == pytest.approx(3.0) and sorted(fb["systems"]) == ["bagpipe", "het", "local", "sync"]
    assert fb["measured_ms"] == pytest.approx({"sync": 3.2, "het": 6.0, "local": 1.5, "bagpipe": 2.0,
                                               "hotline": 9.0})
    assert fb["own"] == {"hotline": "computes a batch in two passes"}
    assert fb["spread"] == pytest.approx(4.0) and 4.0 > DISAGREEMENT
    [warning] = src["warnings"]
    for needle in ("disagree", "het 6.00 ms", "local 1.50 ms", "sync 3.20 ms", "4.00x", "loaded machine",
                   "idle", "--threads 1", "the median, 3.00 ms"):
        assert needle in warning, (needle, warning)
    assert "hotline" not in warning and "\n" not in warning


def test_agreeing_systems_give_no_warning(tmp_path):
    per, src = calibrate(fake_runs(tmp_path, {"sync": [2.0, 2.1], "bagpipe": [2.2], "local": [1.9]}))
    assert src["warnings"] == [] and src["fwd_bwd"]["spread"] < DISAGREEMENT
    assert {s: c.fwd_bwd_ms for s, c in per.items()} == pytest.approx(
        {"sync": 2.05, "bagpipe": 2.05, "local": 2.05, "*": 2.05})


def test_simulate_uses_the_one_figure_warns_and_compares_every_system(tiny_dataset, tmp_path):
    runs = fake_runs(tmp_path / "runs", DISAGREEING, **SPLIT)
    out = tmp_path / "sim"
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--calibrate", str(runs),
                                 "--batch-size", "256", "--iterations", "8", "--warmup", "1",
                                 "--lookahead", "8", "--net-gbps", "1", "--sweep-trainers", "1",
                                 "--sweep-gbps", "1", "--systems", "sync,bagpipe,het,hotline,local",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("Warning:")]
    assert len(warnings) == 1 and "het 6.00 ms" in warnings[0] and "--threads 1" in warnings[0]
    assert "Warning" not in r.stdout
    js = json.loads((out / "simulate.json").read_text())
    used = {s: c["fwd_bwd_ms"] for s, c in js["compute"].items()}
    assert used == pytest.approx({"sync": 3.0, "bagpipe": 3.0, "het": 3.0, "local": 3.0, "hotline": 9.0})
    src = js["compute_source"]
    assert src["fwd_bwd"]["ms_used"] == pytest.approx(3.0) and src["fwd_bwd"]["measured_ms"]["het"] == 6.0
    assert src["warnings"] == [w.removeprefix("Warning: ") for w in warnings]
    # the runs (from before the CPU columns) gave wall time; the load simulate ran under
    assert src["compute_clock"] == {"cpu": 0, "wall": 6} and len(src["runs_load"]) == 6
    assert {"cores", "load_per_core", "loadavg", "loaded"} <= set(js["load"])
    assert "forward+backward measured once: 3.00 ms" in r.stdout
    # bagpipe's table has a row for every other system simulated, the bound local included
    for s in ("sync", "het", "hotline", "local"):
        assert re.search(rf"^│ {s} +│ +[\d.]+x │$", r.stdout, re.M), (s, r.stdout)
    pred = pd.read_csv(out / "predictions.csv").set_index("system")
    best = pred["mean_ms"].idxmin()
    assert re.search(rf"^fastest: {best}, [\d.]+x over \w+ \(the best other\)", r.stdout, re.M), r.stdout


def test_a_comparison_without_its_reference_shows_a_dash(tiny_dataset):
    """No sync: 'vs sync' is '-' and the fastest line names no speed-up over it; without
    bagpipe there is no bagpipe table, but the fastest line still compares them."""
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "1", "--batch-size",
                                 "256", "--iterations", "6", "--warmup", "1", "--net-gbps", "1",
                                 "--systems", "lru,local", "--sweep-trainers", "1", "--sweep-gbps", "1"])
    assert r.exit_code == 0, r.output
    assert re.search(r"│ local .* │ +- │ ", r.stdout) and "speed-up of bagpipe" not in r.stdout
    assert re.search(r"^fastest: local, [\d.]+x over lru \(the best other\)$", r.stdout, re.M), r.stdout


def test_calibration_takes_cpu_time_where_a_run_has_it(tmp_path):
    """A run measured on a loaded machine: its wall compute 3x its CPU compute. The model
    takes the CPU figure, says so, records the runs' loads, and one warning names the run;
    an older run without CPU columns gives its wall time."""
    loaded = read_measured(fake_run(tmp_path / "busy" / "sync-r0", "sync", 6.0, 1.5,
                                    cpu=1 / 3, loaded=True))
    assert loaded.compute_clock == "cpu"
    assert loaded.compute.fwd_bwd_ms == pytest.approx(2.0)
    assert loaded.compute.optimizer_ms == pytest.approx(0.5)
    assert loaded.compute_wall_ms == pytest.approx(7.5) and loaded.compute_cpu_ms == pytest.approx(2.5)
    old = read_measured(fake_run(tmp_path / "old" / "sync-r0", "sync", 6.0, 1.5))
    assert old.compute_clock == "wall" and old.compute.fwd_bwd_ms == pytest.approx(6.0)
    assert old.compute_cpu_ms is None and old.load is None

    per, src = calibrate(tmp_path / "busy")
    assert per["sync"].fwd_bwd_ms == pytest.approx(2.0)  # not the wall 6.0
    assert src["compute_clock"] == {"cpu": 1, "wall": 0} and src["loaded_runs"] == 1
    [run] = src["runs_load"]
    assert run["loaded"] is True and run["compute_clock"] == "cpu"
    [warning] = src["warnings"]
    assert f"{loaded.run_id} (wall 7.50 ms, CPU 2.50 ms)" in warning and f"{NOISE:.0%}" in warning
    assert "\n" not in warning


def test_agreeing_wall_and_cpu_time_give_no_warning(tmp_path):
    fake_run(tmp_path / "sync-r0", "sync", 2.0, cpu=1 / (1 + NOISE / 2), loaded=False)
    per, src = calibrate(tmp_path)
    assert src["warnings"] == [] and src["loaded_runs"] == 0
    assert per["sync"].fwd_bwd_ms == pytest.approx(2.0 / (1 + NOISE / 2))
